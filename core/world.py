"""One world per trainer group: the settings every rank must share, as the ranks' commits record them.

Ranks never talk to each other; each takes its share of one global sequence of batches. Two ranks that
disagree on how a batch is made or split (`world_size`, `groups_per_batch`, `balance_tokens`, `layout`,
`balance_data`, `fetch`, `max_weight_staleness`, `staleness`) train some samples twice and others never,
silently. So every commit carries the world it was made in (`World.text`, after the read mark's metadata),
rank 0 records it before its first batch, and a rank whose settings differ refuses to start (docs/reader.md,
"One world per trainer group").

A deliberate change of settings is a rescale: it starts a new `generation` at a batch every rank of the
old world committed (`committed_batches`); commits of older generations no longer count for resume.

Pure: commit metadata in, decisions out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace

from rollout_stream.core.assembly import COMMIT_METADATA_PREFIX, Mark

__all__ = ["SETTINGS", "World", "committed_batches", "newest_world", "of_generation"]

SETTINGS = ("world_size", "groups_per_batch", "balance_tokens", "layout", "balance_data", "fetch",
            "max_weight_staleness", "staleness")
"""What changes what a rank trains, in the order a refusal names them."""


def _show(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True, slots=True)
class World:
    """The settings of a trainer group's ranks (`SETTINGS`) and the rescale `generation` they belong to."""

    world_size: int
    groups_per_batch: int
    balance_tokens: bool = False
    layout: str = "tensors"
    balance_data: bool = False
    fetch: str = "all"
    max_weight_staleness: int | None = None
    staleness: str = "group"  # the bound's grain: group, rollout or token
    generation: int = 0

    def text(self) -> str:
        """The fields as commit metadata carries them: `world_size=2 groups_per_batch=8 ... generation=0`."""
        return " ".join(f"{f.name}={_show(getattr(self, f.name))}" for f in fields(self))

    @staticmethod
    def parse(metadata: str | None) -> World | None:
        """The world a reader commit's metadata records (None: none, e.g. a commit of an older reader)."""
        if not (metadata or "").startswith(COMMIT_METADATA_PREFIX + " "):
            return None
        found = dict(p.split("=", 1) for p in (metadata or "").split(" ")[1:] if "=" in p)
        if "world_size" not in found or "generation" not in found:
            return None
        try:
            staleness = found.get("max_weight_staleness", "none")
            return World(
                world_size=int(found["world_size"]), groups_per_batch=int(found.get("groups_per_batch", 0)),
                balance_tokens=found.get("balance_tokens") == "true", layout=found.get("layout", "tensors"),
                balance_data=found.get("balance_data") == "true", fetch=found.get("fetch", "all"),
                max_weight_staleness=None if staleness == "none" else int(staleness),
                staleness=found.get("staleness", "group"), generation=int(found["generation"]))
        except ValueError:
            return None

    def same_settings(self, other: World) -> bool:
        return replace(self, generation=0) == replace(other, generation=0)

    def differences(self, other: World) -> list[tuple[str, str, str]]:
        """(setting, this world's value, `other`'s value) for every setting they disagree on."""
        return [(name, _show(getattr(self, name)), _show(getattr(other, name))) for name in SETTINGS
                if getattr(self, name) != getattr(other, name)]


Committed = Mapping[int, tuple[int | None, str | None]]
"""One rank's commit: partition → (offset, metadata), as `core.assembly.choose_resume` takes it."""


def newest_world(committed: Committed) -> World | None:
    """The world of the newest generation a rank's commit records over its partitions (None: none)."""
    worlds = [w for _, meta in committed.values() if (w := World.parse(meta)) is not None]
    return max(worlds, key=lambda w: w.generation, default=None)


def of_generation(committed: Committed, generation: int) -> Committed:
    """The partitions of a rank's commit made in `generation` (a commit that records no world counts as
    generation 0: an older reader's, before worlds were recorded)."""
    def gen(meta: str | None) -> int:
        world = World.parse(meta)
        return 0 if world is None else world.generation
    return {p: (o, m) for p, (o, m) in committed.items() if gen(m) == generation}


def committed_batches(commits: Sequence[Committed]) -> list[int | None]:
    """The last batch each rank's commit records (None: the rank committed no batch yet). A world is at a
    batch boundary, where it may be rescaled, when they are all equal."""
    batches: list[int | None] = []
    for committed in commits:
        found = [b for offset, meta in committed.values() if offset is not None and offset >= 0
                 and (b := Mark.parse(offset, meta)[0]) is not None and b >= 0]
        batches.append(max(found) if found else None)
    return batches
