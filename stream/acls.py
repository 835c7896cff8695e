"""Least privilege: the ACLs each role needs, as kafka-acls commands, as kafka-python ACLs, and as a check.

One list drives all three, so what `rollout-stream acls print` documents is what `acls apply` grants and
what `rollout-stream run` verifies at start (rollout_stream.access), before anything is read or written.

The worker (exactly-once delivery) needs:

    topic   <input>                          Read          consume rollouts
    group   <group-id>                       Read          join the group, commit offsets (in transactions)
    topic   <train-data>, <dead-letter>      Write         publish outcomes
    topic   <group>-<input>-windows-changelog Read, Write  window state (restored on assignment)
    txn id  rollout-stream-<group>-  (prefixed)  Write     one transactional id per worker instance

Read and Write imply Describe. Brokers >= 2.8 let a principal with Write on a topic (or on its transactional
id) initialise an idempotent producer, so IdempotentWrite on the cluster is only needed by older brokers
(`idempotent_write=True`). Create on the topics only if the worker should create them (`create_topics`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from rollout_stream.kafka import AclSpec
from rollout_stream.names import (
    admission_topic,
    changelog_topic_name,
    heads_topic,
    progress_topic,
    rank_group_prefix,
    transactional_id_prefix,
)

__all__ = [
    "Permission",
    "Role",
    "producer_permissions",
    "reader_permissions",
    "render_kafka_acls",
    "worker_permissions",
]

Resource = Literal["topic", "group", "transactional-id", "cluster"]
Operation = Literal["Read", "Write", "Describe", "Create", "IdempotentWrite"]
Role = Literal["worker", "producer", "reader"]

# As the broker names operations in authorized operations (KIP-430).
_OPERATIONS = {"Read": "READ", "Write": "WRITE", "Describe": "DESCRIBE", "Create": "CREATE",
               "IdempotentWrite": "IDEMPOTENT_WRITE"}


@dataclass(frozen=True, slots=True)
class Permission:
    """Allow `operation` on one resource (a prefix of names when `prefixed`)."""

    resource: Resource
    name: str
    operation: Operation
    why: str = ""
    prefixed: bool = False

    def __str__(self) -> str:
        kind = "cluster" if self.resource == "cluster" else f"{self.resource} {self.name!r}"
        return f"{self.op_name} on {kind}{' (prefixed)' if self.prefixed else ''}"

    @property
    def op_name(self) -> str:
        """As the broker names it in authorized operations: READ, WRITE, IDEMPOTENT_WRITE, ..."""
        return _OPERATIONS[self.operation]

    def acl(self, principal: str, host: str = "*") -> AclSpec:
        return AclSpec(principal, self.resource, self.name, self.operation, self.prefixed, host)


# -- the lists -----------------------------------------------------------------------------------------------
def worker_permissions(
    *,
    input_topic: str,
    output_topic: str,
    dead_letter_topic: str,
    group_id: str,
    delivery: str = "exactly-once",
    route_topic: str | None = None,
    create_topics: bool = False,
    idempotent_write: bool = False,
    write_heads: bool = False,
) -> list[Permission]:
    """What `rollout-stream run` needs, nothing more (`write_heads`: `run --write-heads`)."""
    out = [
        Permission("topic", input_topic, "Read", "consume rollout samples"),
        Permission("group", group_id, "Read", "join the consumer group and commit its offsets"),
        Permission("topic", output_topic, "Write", "publish train samples"),
        Permission("topic", dead_letter_topic, "Write", "publish dead-letters"),
    ]
    if route_topic:
        out.append(Permission("topic", route_topic, "Write", "publish routed zero-variance groups"))
    data_topics = [input_topic, output_topic, dead_letter_topic, *([route_topic] if route_topic else [])]
    if write_heads:
        heads = [heads_topic(t) for t in (output_topic, *([route_topic] if route_topic else []))]
        out += [Permission("topic", h, "Write", "publish group heads (rank-local fetch)") for h in heads]
        data_topics += heads
    if delivery == "exactly-once":
        changelog = changelog_topic_name(group_id, input_topic)
        out += [
            Permission("topic", changelog, "Read", "restore window state after an assignment"),
            Permission("topic", changelog, "Write", "record window state in the same transaction"),
            Permission(
                "transactional-id",
                transactional_id_prefix(group_id),
                "Write",
                "transactions (one id per worker instance)",
                prefixed=True,
            ),
        ]
        data_topics.append(changelog)
    if create_topics:
        out += [Permission("topic", t, "Create", "create the topic if it is missing") for t in data_topics]
    if idempotent_write:
        out.append(
            Permission("cluster", "kafka-cluster", "IdempotentWrite", "idempotent producer (brokers < 2.8)")
        )
    return out


def producer_permissions(*, input_topic: str, idempotent_write: bool = False,
                         paced_to_output_topic: str | None = None) -> list[Permission]:
    """What a rollout producer (rollout_stream.producer.RolloutProducer, `rollout-stream synth`) needs; paced
    to a trainer of `paced_to_output_topic` (docs/pacing.md), also its admission log and progress topic."""
    out = [Permission("topic", input_topic, "Write", "publish rollout samples")]
    if paced_to_output_topic is not None:
        admission, progress = admission_topic(paced_to_output_topic), progress_topic(paced_to_output_topic)
        out += [Permission("topic", admission, "Read", "fold the admission log (pacing)"),
                Permission("topic", admission, "Write", "ask for room, name and renew its groups (pacing)"),
                Permission("topic", progress, "Write", "publish this producer's progress (pacing)")]
    if idempotent_write:
        out.append(
            Permission("cluster", "kafka-cluster", "IdempotentWrite", "idempotent producer (brokers < 2.8)")
        )
    return out


def reader_permissions(*, output_topic: str, group_id: str, fetch_own: bool = False) -> list[Permission]:
    """What a trainer's TrainDataReader needs: train-data and its per-rank groups `<group>-rank<r>`
    (`fetch_own`: and the group heads, `TrainDataReader(fetch="own")`)."""
    heads = [Permission("topic", heads_topic(output_topic), "Read", "read group heads (rank-local fetch)")]
    return [
        Permission("topic", output_topic, "Read", "read train samples"),
        *(heads if fetch_own else []),
        Permission(
            "group", rank_group_prefix(group_id), "Read", "commit each rank's position", prefixed=True
        ),
        Permission("topic", admission_topic(output_topic), "Write",
                   "say which groups the trainer group consumed, for paced producers (docs/pacing.md)"),
        Permission("topic", progress_topic(output_topic), "Write",
                   "publish the trainer group's progress (docs/pacing.md)"),
    ]


# -- kafka-acls commands -------------------------------------------------------------------------------------
def render_kafka_acls(
    principal: str,
    permissions: Iterable[Permission],
    *,
    bootstrap: str = "$KAFKA_BOOTSTRAP_SERVERS",
    command_config: str = "admin.properties",
    tool: str = "kafka-acls.sh",
) -> list[str]:
    """One `kafka-acls.sh --add` command per resource, each preceded by a comment saying why."""
    grouped: dict[tuple[str, str, bool], list[Permission]] = {}
    for p in permissions:
        grouped.setdefault((p.resource, p.name, p.prefixed), []).append(p)
    lines = []
    for (resource, name, prefixed), perms in grouped.items():
        ops = list(dict.fromkeys(p.operation for p in perms))
        target = "--cluster" if resource == "cluster" else f"--{resource} {_shell(name)}"
        pattern = " --resource-pattern-type prefixed" if prefixed else ""
        lines.append(f"# {'; '.join(dict.fromkeys(p.why for p in perms if p.why))}")
        lines.append(
            f"{tool} --bootstrap-server {bootstrap} --command-config {_shell(command_config)} --add "
            f"--allow-principal {_shell(principal)} "
            + " ".join(f"--operation {op}" for op in ops)
            + f" {target}{pattern}"
        )
    return lines


def _shell(word: str) -> str:
    if word.startswith("$") or all(c.isalnum() or c in "._-:/=@+,%" for c in word):
        return word
    return "'" + word.replace("'", "'\\''") + "'"
