"""A miles/slime rollout function's side: publish each finished prompt group to rollout-stream in one call.

    .venv/bin/python examples/miles_publish.py --topic rollouts --groups 8 --bootstrap-servers localhost:9092

In a miles rollout function, replace the hand-off to the trainer with `publish_groups(producer, groups)`:
each group is the list of miles `Sample`s of one prompt (any object with miles' attribute names, or
`Sample.to_dict()` dicts). `RolloutProducer.send_many` converts them (`codec.Sample.from_miles`), numbers
the siblings of each rollout (samples sharing a `rollout_id`) and keys the group so it lands in one
partition. The stage then refuses rollouts whose siblings disagree on their reward and normalizes the rest.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from rollout_stream import RolloutProducer


class Status(Enum):  # miles.utils.types.Sample.Status
    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"


@dataclass
class MilesLikeSample:
    """The fields of miles' `Sample` a trainer uses (a real miles Sample works the same way)."""

    group_index: int
    index: int
    rollout_id: int
    tokens: list[int]
    response_length: int
    reward: float
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    status: Status = Status.COMPLETED
    weight_versions: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)


def synthetic_group(group_index: int, rollouts: int, rng: random.Random, *, weight_version: int = 0,
                    first_index: int = 0, max_siblings: int = 2) -> list[MilesLikeSample]:
    """One prompt's rollouts as a miles rollout function returns them; an agentic rollout may leave 1–2
    samples (siblings, up to `max_siblings`), which share the rollout's reward."""
    out = []
    index = first_index
    for r in range(rollouts):
        reward = float(rng.random() < 0.5)
        for _ in range(rng.randint(1, max_siblings)):
            n = rng.randint(2, 6)
            prompt = [rng.randrange(100) for _ in range(rng.randint(3, 8))]
            out.append(MilesLikeSample(
                group_index=group_index, index=index, rollout_id=group_index * 1000 + r,
                tokens=prompt + [rng.randrange(100) for _ in range(n)], response_length=n, reward=reward,
                loss_mask=[1] * n, rollout_log_probs=[-rng.random() for _ in range(n)],
                status=Status.TRUNCATED if rng.random() < 0.1 else Status.COMPLETED,
                weight_versions=[str(weight_version)]))
            index += 1
    return out


def publish_groups(producer: RolloutProducer, groups: Iterable[Sequence[Any]]) -> int:
    """Publish finished prompt groups; returns the number of samples sent."""
    sent = 0
    for group in groups:
        sent += len(producer.send_many(group))
    producer.flush()
    return sent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers",
                        default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or "127.0.0.1:9092",
                        help="Kafka address (default: $KAFKA_BOOTSTRAP_SERVERS, else 127.0.0.1:9092)")
    parser.add_argument("--topic", default="rollouts")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--rollouts", type=int, default=4, help="rollouts per prompt (n_samples_per_prompt)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    groups = []
    index = 0
    for g in range(args.groups):
        groups.append(synthetic_group(g, args.rollouts, rng, first_index=index))
        index += len(groups[-1])
    with RolloutProducer(args.bootstrap_servers, topic=args.topic) as producer:
        sent = publish_groups(producer, groups)
    print(f"published {args.groups} prompt groups ({sent} samples) to {args.topic}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
