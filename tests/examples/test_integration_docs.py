"""Every code block of docs/integrations.md runs as written. A block whose first line names an example file
(`# examples/<name>.py`) is that file's own lines, in runs separated by `# ...` lines (indentation and
`# noqa` comments aside), and a test in tests/examples runs that file; any other block runs here, in an
interpreter of its own."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "integrations.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", DOCS.read_text(), re.S | re.M)
EXCERPT = re.compile(r"# (examples/\w+\.py)\s*")


def normalized(lines: list[str]) -> list[str]:
    return [re.sub(r"\s+# noqa: \w+$", "", line.strip()) for line in lines if line.strip()]


def runs(body: str) -> list[list[str]]:
    parts: list[list[str]] = [[]]
    for line in body.splitlines():
        if line.strip() == "# ...":
            parts.append([])
        else:
            parts[-1].append(line)
    return [normalized(part) for part in parts if normalized(part)]


def test_the_docs_have_the_snippets_these_tests_expect():
    assert len(BLOCKS) >= 4 and sum(bool(EXCERPT.fullmatch(b.partition("\n")[0])) for b in BLOCKS) >= 2


@pytest.mark.parametrize("block", BLOCKS, ids=[b.partition("\n")[0][:40] for b in BLOCKS])
def test_each_snippet_runs_as_written(block: str, tmp_path: Path) -> None:
    first, _, body = block.partition("\n")
    if (named := EXCERPT.fullmatch(first)) is not None:
        example = ROOT / named[1]
        have = normalized(example.read_text().splitlines())
        at = 0
        for run in runs(body):  # each run where the file has it, in the file's order
            found = [i for i in range(at, len(have) - len(run) + 1) if have[i:i + len(run)] == run]
            assert found, f"{named[1]} has no lines {run}"
            at = found[0] + len(run)
        tests = [t.name for t in (ROOT / "tests" / "examples").glob("test_*.py")
                 if f'"{example.name}"' in t.read_text()]
        assert tests, f"no test in tests/examples runs {named[1]}"
    else:
        proc = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
