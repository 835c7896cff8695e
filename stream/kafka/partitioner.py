"""The Java client's default partitioner for keyed records, so every client puts a key where Java would:
`partition = (murmur2(key) & 0x7FFFFFFF) % partitions`. One group's records share their key, hence their
partition (docs/spec.md §4.1), whichever client produced them."""

from __future__ import annotations

__all__ = ["murmur2"]

def murmur2(data: bytes) -> int:
    """The Java client's murmur2 hash of `data`, as an unsigned 32-bit int (partition: `& 0x7FFFFFFF`)."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    h = (0x9747B28C ^ len(data)) & mask
    tail = len(data) & ~3
    for i in range(0, tail, 4):
        k = (int.from_bytes(data[i:i + 4], "little") * m) & mask
        k = ((k ^ (k >> 24)) * m) & mask
        h = ((h * m) & mask) ^ k
    rest = len(data) - tail
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h = ((h ^ data[tail]) * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    return h ^ (h >> 15)

