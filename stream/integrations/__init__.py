"""Trainer frameworks consuming the stage through their own seams (docs/integrations.md).

One module per framework part, each importing its framework only inside it: `rollout_stream.integrations.trl`
(extra `[trl]`), `rollout_stream.integrations.verl` and `.verl_queue` (extra `[verl]`: verl's rows and
estimator, and its message queue as a Ray actor), `.miles` and `.miles_prompts` (miles' data buffer and data
source; miles is imported only where miles runs them). Importing this package imports none.
"""

from __future__ import annotations

__all__: list[str] = []
