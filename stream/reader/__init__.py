"""Train data for async trainers: whole prompt groups as torch batches, per DP rank (docs/spec.md §4.6).

How every rank reads the same sequence without talking to the others (docs/reader.md has the details).
The decisions are pure and live in `rollout_stream.core.assembly`; this package polls, decodes, commits and
logs, in parts:

* **Groups** (`sources`, picked by `fetch`). Each rank reads *all* partitions of the train-data topic
  (manual assignment, read_committed). Per partition, records are assembled into groups by group key until
  `group_sample_count` distinct records (by source topic/partition/offset) are held; copies of a record from
  an at-least-once republication are dropped, and a complete copy of a group already assembled is dropped
  whole (`assembler`). Or, with `fetch="own"` and a stage that writes group heads (`write_heads`), every
  rank folds the heads topic instead (same partitions, one small record per group: `heads`) into the same
  sequence, batches and shards, then fetches its own rows of each batch by offset (`payloads`); commits and
  resume then work on the heads topic's offsets with the same metadata.
* **Global order** (`fetch`). Completed groups are merged across partitions by (timestamp of the record that
  completed the group, its rollouts lineage, partition), each partition in its own offset order, in the
  fetch thread, which queues them for the trainer's thread.
* **Batches** (`batching`, `shapes`). The next `groups_per_batch` groups that are neither stale nor
  invalid, judged when the batch is completed against the weight version set at that moment. Every rank
  shards the same batch and keeps its part: plain tensors (`layout="tensors"`, `Batch`), or also miles'
  `rollout_data` shard (`layout="miles"`).
* **Chunked values** (`assembler`). A train record larger than the stage's `chunk_bytes` travels as chunk
  records (an `x-chunk` header, codec/chunks.py) of one partition, written in one transaction. They are
  reassembled into the whole record before it is decoded; plain records pay one check of their headers.
  Every chunk's offset is held, and released with the value: none is committed before the value is consumed
  into a batch (or dropped), so a restart reads again every chunk of a value not yet consumed.
* **Resume** (`position`). Rank r commits to its own consumer group `<group_id>-rank<r>`, each commit with
  the world it trains in (the settings every rank must share); on start a rank whose settings differ from
  the world rank 0 committed refuses (`WorldMismatch`), and every rank resumes from the commit of the rank
  with the lowest batch index.
"""

from __future__ import annotations

from rollout_stream.reader.batch import Batch, GroupInfo
from rollout_stream.reader.errors import (
    ChunkLimitError,
    PayloadError,
    ReaderError,
    UncoveredRecords,
    WorldMismatch,
)
from rollout_stream.reader.position import BatchPosition
from rollout_stream.reader.stats import ReaderStats
from rollout_stream.reader.train_data import TrainDataReader

__all__ = ["Batch", "BatchPosition", "ChunkLimitError", "GroupInfo", "PayloadError", "ReaderError",
           "ReaderStats", "TrainDataReader", "UncoveredRecords", "WorldMismatch"]
