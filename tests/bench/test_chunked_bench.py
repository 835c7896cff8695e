"""The chunked-sample benchmark's own parts at tiny sizes (the benchmark itself:
bench/scripts/chunked_bench.py, results in docs/benchmarks.md)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.scripts.chunked_bench import LAYERS, TOP_K, cases, moe_sample, parse_args
from rollout_stream.clients import MAX_RECORD_BYTES
from rollout_stream.codec import decode_sample, encode_sample
from rollout_stream.codec.chunks import DEFAULT_CHUNK_BYTES


def test_the_sample_carries_its_routing_replay_of_tokens_minus_one_rows():
    sample = moe_sample(64, 3, 1, 8, "run", np.random.default_rng(0))
    back = decode_sample(encode_sample(sample))
    assert back.rollout_routed_experts is not None
    assert back.rollout_routed_experts.numpy().shape == (63, LAYERS, TOP_K)
    assert (back.group_index, back.rollout_id, back.group_size, back.response_length) == (3, 1, 8, 32)


def test_the_default_cases_are_32k_chunked_and_not_and_128k_chunked():
    got = {c.name: c for c in cases(parse_args([]))}
    assert list(got) == ["32k-chunked", "32k-unchunked", "128k-chunked"]
    assert (got["32k-chunked"].tokens, got["32k-chunked"].samples) == (32_768, 32)
    assert got["32k-chunked"].chunk_bytes == DEFAULT_CHUNK_BYTES
    assert got["32k-unchunked"].chunk_bytes == got["32k-unchunked"].topic_bytes == MAX_RECORD_BYTES
    assert (got["128k-chunked"].tokens, got["128k-chunked"].samples) == (131_072, 2)


def test_an_unknown_case_is_refused():
    with pytest.raises(SystemExit):
        parse_args(["--cases", "128k-unchunked"])
