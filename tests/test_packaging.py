"""What installs: one package, `rollout_stream`, and nothing of the workshop (SPEC §4.8, docs/layout.md).

The repository keeps the folders the product was specified with (stream/, core/, codec/); pyproject.toml maps
them onto one import name. These tests build the wheel as a user's `pip install .` does, check what it holds,
and import it from a folder that has packages of its own called `core`, `codec` and `stream`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"stream": "rollout_stream", "core": "rollout_stream.core", "codec": "rollout_stream.codec"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
         str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (path,) = out.glob("rollout_stream-*.whl")
    return path


def test_the_wheel_holds_only_rollout_stream_and_its_metadata(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    outside = [n for n in names if not n.startswith(("rollout_stream/", "rollout_stream-"))]
    assert not outside, outside
    assert not [n for n in names if "/bench/" in n or n.startswith("bench/")], "a benchmark script shipped"
    for expected in ("rollout_stream/__init__.py", "rollout_stream/core/rewards.py",
                     "rollout_stream/codec/wire.py", "rollout_stream/broker/pom.xml"):
        assert expected in names


def test_the_package_list_names_every_folder_with_modules() -> None:
    """pyproject.toml lists the packages by hand (package-dir is not searched): a new folder goes there."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for folder, name in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            inner = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join([name, *inner]))
    assert listed == found


def test_installed_it_imports_beside_packages_named_core_codec_and_stream(wheel: Path, tmp_path: Path):
    """A trainer's working directory with its own `core/` (or `codec/`, `stream/`) does not shadow ours."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    zipfile.ZipFile(wheel).extractall(site)  # what pip does with a wheel, minus the dependencies:
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")  # those come from this venv
    work = tmp_path / "trainer"
    for name in FOLDERS:
        (work / name).mkdir(parents=True)
        (work / name / "__init__.py").write_text(f"MINE = {name!r}\n")
        (work / name / "assembly.py").write_text("raise ImportError('the trainer's own module')\n")
    script = (
        "import rollout_stream, core\n"
        "from rollout_stream import TrainDataReader\n"
        "from rollout_stream.core.assembly import GroupMerger\n"
        "assert core.MINE == 'core'\n"
        "print(rollout_stream.__file__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run([str(venv / "bin" / "python"), "-c", script], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(site)), done.stdout
