"""The fetch size of the reader's consumers that read partitions on: the whole-topic reader's and the
forward reading of small records (rollout_stream.reader.payloads)."""

__all__ = ["READER_FETCH_BYTES"]

# A reader's fetch size per partition, as large as a whole response (the clients' 16 MiB). The broker cuts a
# partition's data at this size, in the middle of a record batch, and the client drops the cut batch and
# fetches it again: with records of 2.3 MB (32K-token MoE samples with routing replay) the clients' 4 MiB per
# partition fetched 1.8 times the topic, 16 MiB 1.04 times (64 MiB: 1.02, with 64 MiB responses held at
# once; docs/benchmarks.md, "Bytes each rank fetches").
READER_FETCH_BYTES = 16 * 1024 * 1024
