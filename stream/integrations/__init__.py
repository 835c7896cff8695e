"""Trainer frameworks consuming the stage through their own seams (docs/integrations.md).

One module per framework, each importing its framework only inside it: `rollout_stream.integrations.trl`
(extra
`[trl]`), `rollout_stream.integrations.verl` (extra `[verl]`). Importing this package imports neither.
"""

from __future__ import annotations

__all__: list[str] = []
