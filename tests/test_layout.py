"""The architecture as a test: which package may import which (README "Layout"), no import cycles (between
modules at import time, between the layout's packages at all), and kafka-python only inside its
implementation of the Kafka seam, imported only when a Connection chooses it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the installed package's folders (pyproject.toml's package-dir), and the workshop beside it (not installed)
FOLDERS = {"stream": "rollout_stream", "core": "rollout_stream.core", "codec": "rollout_stream.codec",
           "bench": "bench"}
P = "rollout_stream"

# package (or module prefix) → project packages it may import (at module level or inside a function)
# Connections, security settings, logs and errors: the seam imports them, so they import nothing of it.
SETTINGS = (f"{P}.clients", f"{P}.security", f"{P}.logs", f"{P}.errors")
BASE = (f"{P}.clients", f"{P}.config", f"{P}.errors", f"{P}.logs", f"{P}.names", f"{P}.security",
        f"{P}.topics",
        f"{P}.layout", f"{P}.retry", f"{P}.core", f"{P}.codec")
ALLOWED: dict[str, tuple[str, ...]] = {
    f"{P}.codec": (f"{P}.codec",),
    f"{P}.core": (f"{P}.core", f"{P}.codec"),
    f"{P}.errors": (),  # the error tree: importable from anywhere because it imports nothing of the project
    f"{P}.retry": (f"{P}.errors",),  # one retry helper, for the seam and everything above it
    # the seam and its clients
    f"{P}.kafka": (f"{P}.kafka", f"{P}.logs", f"{P}.security", f"{P}.clients", f"{P}.errors", f"{P}.retry"),
    # pacing: the progress topic and the producer's admission gate (the rule is rollout_stream.core.admission)
    f"{P}.pacing": (f"{P}.pacing", f"{P}.kafka", *BASE),
    # the worker
    f"{P}.worker": (f"{P}.worker", f"{P}.pacing", f"{P}.kafka", *BASE),
    # what other processes import
    f"{P}.producer": (f"{P}.producer", f"{P}.pacing", f"{P}.kafka", *BASE),
    f"{P}.reader": (f"{P}.reader", f"{P}.pacing", f"{P}.kafka", *BASE),
    f"{P}.prompts": (f"{P}.prompts", f"{P}.producer", f"{P}.pacing", f"{P}.kafka", *BASE),
    # the worker's check of its ACLs at start, and the ACL lists `acls` applies
    f"{P}.access": (f"{P}.acls", f"{P}.kafka", *BASE),
    f"{P}.acls": (f"{P}.kafka", *BASE),
    # trainer frameworks on the reader, the producer and the prompt source (each framework imported only in
    # its own module)
    f"{P}.integrations": (f"{P}.integrations", f"{P}.reader", f"{P}.producer", f"{P}.prompts", f"{P}.pacing",
                          f"{P}.kafka", *BASE),
    # the development broker: a package of its own (`demo`, `broker`, the tests), never imported by `run`
    f"{P}.broker": (f"{P}.broker", f"{P}.kafka", *BASE),
    # operator tools (the CLI's dlq, lag, prompts, synth): beside the product, never imported by it
    f"{P}.ops": (f"{P}.ops", f"{P}.kafka", f"{P}.worker", f"{P}.pacing", f"{P}.producer", f"{P}.reader",
                 f"{P}.prompts", f"{P}.access", f"{P}.acls", *BASE),
    # the shared base: the settings, names and errors everything else uses
    **{module: (f"{P}.kafka", *BASE) for module in BASE
       if module.startswith(f"{P}.") and module not in SETTINGS and module.count(".") == 1},
    # how to reach the cluster: what the seam builds its clients from, so nothing of the seam, even lazily
    **{module: SETTINGS for module in SETTINGS if module != f"{P}.errors"},
    # the public surface (rollout_stream/__init__.py) and the commands that only parse and call
    P: (P,),
    # the workshop: benchmarks and acceptance harnesses, run by hand or by tests, imported by nothing
    # installed
    "bench": ("bench", P),
}
CLIENT_LIBRARIES = {"kafka": f"{P}.kafka.kafka_python", "confluent_kafka": f"{P}.kafka.confluent"}
# Besides their seam implementation, only the benchmark scripts that measure the client libraries themselves
RAW_CLIENTS = "bench.scripts"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([FOLDERS[parts[0]], *parts[1:]])


def modules() -> dict[str, Path]:
    return {module_name(p): p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")}


def imports(path: Path, *, top_level_only: bool) -> set[str]:
    """Modules imported by `path` (module level only when `top_level_only`: lazy imports cannot cycle)."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.If) and top_level_only:  # `if TYPE_CHECKING:` blocks run no import
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def project(name: str, known: dict[str, Path]) -> str | None:
    """The project module `name` refers to (a module, or the package a `from x import y` names)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def layout_unit(module: str) -> str:
    """The most specific package (or module prefix) of ALLOWED that `module` belongs to."""
    for prefix in sorted(ALLOWED, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return prefix
    raise AssertionError(f"no layout rule for {module}")


def rule_for(module: str) -> tuple[str, ...]:
    return ALLOWED[layout_unit(module)]


def test_each_package_imports_only_what_the_layout_allows():
    known = modules()
    wrong = []
    for module, path in known.items():
        allowed = rule_for(module)
        for target in imports(path, top_level_only=False):
            ref = project(target, known)
            if ref is not None and not any(ref == a or ref.startswith(a + ".") for a in allowed):
                wrong.append(f"{module} imports {ref}")
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_kafka_python_is_imported_only_inside_its_seam_implementation():
    wrong = []
    for module, path in modules().items():
        for target in imports(path, top_level_only=False):
            root = target.split(".")[0]
            home = CLIENT_LIBRARIES.get(root)
            inside = module == home or module.startswith((f"{home}.", f"{RAW_CLIENTS}."))
            if home is not None and not inside:
                wrong.append(f"{module} imports {target}")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_cycles():
    known = modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in known.items():
        for target in imports(path, top_level_only=True):
            ref = project(target, known)
            if ref is not None and ref != module and not module.startswith(ref + "."):
                graph[module].add(ref)  # a package's own __init__ importing its parts is not a cycle
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(known):
        if node not in state:
            visit(node)
    assert not cycles, "\n".join(" → ".join(c) for c in cycles)


def test_no_cycles_between_the_layouts_packages_even_through_lazy_imports():
    """A function-level import only postpones a cycle: the packages still depend on each other (the Kafka
    seam on the connection settings and those on a seam implementation was one)."""
    known = modules()
    graph: dict[str, set[str]] = defaultdict(set)
    why: dict[tuple[str, str], str] = {}
    for module, path in known.items():
        for target in imports(path, top_level_only=False):
            ref = project(target, known)
            if ref is None:
                continue
            here, there = layout_unit(module), layout_unit(ref)
            if here != there:
                graph[here].add(there)
                why.setdefault((here, there), f"{module} imports {ref}")

    def reachable(start: str) -> set[str]:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    looped = sorted(unit for unit in list(graph) if unit in reachable(unit))
    assert not looped, "\n".join(
        f"{unit}: {why[(unit, nxt)]}"
        for unit in looped
        for nxt in sorted(graph[unit])
        if unit in reachable(nxt)
    )


def import_closure(start: str, known: dict[str, Path]) -> set[str]:
    """The project modules importing `start` may import, at module level or in a function (run or not), with
    the packages each import runs the `__init__` of."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parents = [module.rsplit(".", depth)[0] for depth in range(1, module.count(".") + 1)]
        targets = [project(t, known) for t in imports(known[module], top_level_only=False)]
        todo += [m for m in [*parents, *targets] if m is not None and m in known and m not in seen]
    return seen


def test_run_cannot_reach_the_development_broker_or_the_workshop():
    """`run` with its address missing must refuse to start, never start a Kafka of its own: nothing it
    imports, even lazily, is the development broker (the local-broker lookup is commands/local.py, which
    only the other commands import), and nothing is the workshop, which the wheel does not hold."""
    closure = import_closure(f"{P}.commands.run", modules())
    assert f"{P}.commands.connection" in closure and f"{P}.worker" in closure  # the walk sees through
    reached = sorted(m for m in closure if m.startswith((f"{P}.broker", f"{P}.commands.local"))
                     or m.split(".")[0] == "bench")
    assert not reached, reached


def test_kafka_python_is_imported_only_when_chosen():
    """The CLI, its connection settings and the seam's client on confluent-kafka load no kafka-python."""
    script = """
import sys
import rollout_stream.cli
from rollout_stream.commands.connection import SecurityOptions, connection_from_options
from rollout_stream.kafka import client_for
conn = connection_from_options("localhost:9092", SecurityOptions(client="confluent"), check=False)
client_for(conn)
assert "kafka" not in sys.modules, "kafka-python imported on the confluent path"
assert "confluent_kafka" in sys.modules
"""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


MAX_WORKER_CLASS_LINES = 200


def test_no_class_of_the_worker_is_longer_than_a_page_or_two():
    """The worker stays a pipeline of parts with one job each (docs/architecture.md): no class in
    stream/worker/ grows past MAX_WORKER_CLASS_LINES lines, docstring and comments included."""
    too_long = []
    for path in sorted((ROOT / "stream" / "worker").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = (node.end_lineno or node.lineno) - first + 1
                if lines > MAX_WORKER_CLASS_LINES:
                    too_long.append(f"{path.relative_to(ROOT)}: {node.name} has {lines} lines")
    assert not too_long, "; ".join(too_long)
