# The C module's interface (core/_plain_scan.c); core/plain_scan.py is the only place that imports it.
from rollout_stream.core.structs import PlainHead

FIELDS: tuple[str, ...]

def configure(head_type: type[PlainHead], item_sizes: dict[int, int], schema_version: int,
              float_sizes: dict[int, int] = ..., int_sizes: dict[int, int] = ..., /) -> None: ...
def plain_head(value: bytes, key: bytes | None, default_group_size: int | None, max_group_size: int,
               max_sibling_count: int, /) -> PlainHead | None: ...
