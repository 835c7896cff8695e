"""The benchmark scripts beside `python -m bench run`: each measures one thing (a codec, the stage's own
work, the reader, pacing across processes, ...) and says how to run it in its docstring; docs/benchmarks.md
has their latest results and method."""
