"""Batch shapes: which rows of a planned batch are this rank's, and in what form, picked once by `layout`.

* `TensorRows` (`layout="tensors"`): this rank's share as `plan_batch` shards it (whole rollouts, siblings
  together, optionally token-balanced), collated into plain tensors.
* `MilesRows` (`layout="miles"`): the rows and the finished `rollout_data` shard miles' trainer builds
  in-process (`convert_samples_to_train_data` + `split_train_data_by_dp`): strided over the batch's global
  sample list, or Karmarkar–Karp on total lengths with `balance_data`; not whole rollouts per rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

from rollout_stream.codec import TrainSample
from rollout_stream.core.assembly import BatchPlan
from rollout_stream.core.staleness import without_stale_tokens
from rollout_stream.reader.sources import Fetched, GroupSource
from rollout_stream.reader.stats import ReaderStats

__all__ = ["BatchShape", "Layout", "MilesRows", "TensorRows", "batch_shape"]

Layout = Literal["tensors", "miles"]
Rows = tuple[list[TrainSample], dict[str, Any] | None]


class BatchShape(Protocol):
    def own(self, plan: BatchPlan) -> list[TrainSample]:
        """The samples of the planned batch whose payloads are this rank's rows."""
        ...

    def rows(self, plan: BatchPlan, batch: Sequence[Fetched], source: GroupSource, stats: ReaderStats,
             floor: int | None = None) -> Rows:
        """This rank's samples of the planned batch (their payloads from `source`), and its `rollout_data`
        shard where the shape has one. `floor`: with staleness by token, tokens generated under a weight
        version below it leave the loss of the rows fetched (`plan` already holds them so)."""
        ...


def _payloads(rows: Sequence[TrainSample], batch: Sequence[Fetched], source: GroupSource, stats: ReaderStats,
              floor: int | None) -> list[TrainSample]:
    """The payloads behind the planned rows, with the loss masks the plan judged on their outlines."""
    fetched = source.payloads(rows, batch, stats)
    if floor is None or source.carries_payloads:
        return fetched
    return [without_stale_tokens(t, floor) for t in fetched]


class TensorRows:
    """This rank's share of the batch as `plan_batch` shards it."""

    def own(self, plan: BatchPlan) -> list[TrainSample]:
        return list(plan.samples)

    def rows(self, plan: BatchPlan, batch: Sequence[Fetched], source: GroupSource, stats: ReaderStats,
             floor: int | None = None) -> Rows:
        return _payloads(plan.samples, batch, source, stats, floor), None


class MilesRows:
    """This rank's rows and `rollout_data` shard, as miles splits the batch over DP ranks.

    `rank`, `world_size`: the data-parallel rank and size; `balance_data`: miles' `--balance-data`
    (Karmarkar–Karp on total lengths instead of strided rows).
    """

    def __init__(self, rank: int, world_size: int, *, balance_data: bool) -> None:
        self.rank, self.world_size, self.balance_data = rank, world_size, balance_data

    def own(self, plan: BatchPlan) -> list[TrainSample]:
        everything, data = self._data(plan)
        return [everything[row] for row in self._rows(data)]

    def rows(self, plan: BatchPlan, batch: Sequence[Fetched], source: GroupSource, stats: ReaderStats,
             floor: int | None = None) -> Rows:
        from rollout_stream.core.miles import shard_of_rows, split_by_dp, train_data, trainer_shard

        everything, data = self._data(plan)
        if source.carries_payloads:
            shard = split_by_dp(data, self.world_size, balance_data=self.balance_data)[self.rank]
            return [everything[row] for row in shard["partition"]], trainer_shard(shard)
        # outlines: the whole-batch keys from them, this rank's rows fetched
        rows = self._rows(data)
        mine = _payloads([everything[row] for row in rows], batch, source, stats, floor)
        own = shard_of_rows(data, train_data(mine) if mine else None, rows)
        return mine, trainer_shard(own)

    @staticmethod
    def _data(plan: BatchPlan) -> tuple[list[TrainSample], dict[str, Any]]:
        """The batch's samples and miles' train data of them."""
        from rollout_stream.core.miles import train_data

        everything = [s for g in plan.groups for s in g.samples]
        return everything, train_data(everything, prompt_group_sizes=[len(g.samples) for g in plan.groups])

    def _rows(self, data: dict[str, Any]) -> range | list[int]:
        """The indices of this rank's rows in the batch miles' `data` is of."""
        from rollout_stream.core.miles import dp_rows

        return dp_rows([len(t) for t in data["tokens"]], self.world_size, self.rank,
                       balance_data=self.balance_data)


def batch_shape(layout: Layout, *, rank: int, world_size: int, balance_data: bool) -> BatchShape:
    """The shape `layout` names: "tensors" (`TensorRows`) or "miles" (`MilesRows`)."""
    if layout == "tensors":
        if balance_data:
            raise ValueError(
                "balance_data applies to layout='miles' (balance_tokens shards the tensor layout)")
        return TensorRows()
    if layout == "miles":
        return MilesRows(rank, world_size, balance_data=balance_data)
    raise ValueError(f"layout must be tensors or miles, got {layout!r}")
