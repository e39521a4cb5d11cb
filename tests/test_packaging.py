"""The wheel ships the pre-tuned records (logs/) where `records.shipped_logs` finds them once installed.

Builds the wheel from a copy of the source tree (a stale build/ of the checkout cannot leak into it) without
build isolation (offline, seconds), installs it into a directory and asks a fresh interpreter there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from autotune import records

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted(p.relative_to(ROOT / "logs") for p in (ROOT / "logs").glob("*/*.jsonl")
                 if p.parts[-2] != "local")

pytestmark = pytest.mark.packaging


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "local")
    for name in ("autotune", "search_spaces", "cost_model", "logs"):
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=skip)
    (src / "logs" / "local").mkdir()
    (src / "logs" / "local" / "mine.jsonl").write_text("{}\n")  # a user's own run: never shipped
    out = tmp_path_factory.mktemp("dist")
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                          "-q", "-w", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    (whl,) = out.glob("*.whl")
    return whl


def test_the_shipped_logs_are_in_the_wheel_and_user_runs_are_not(wheel):
    assert SHIPPED, "logs/ holds no shipped records to check"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for rel in SHIPPED:
            assert z.read(f"autotune/_shipped_logs/{rel.as_posix()}") == (ROOT / "logs" / rel).read_bytes()
    assert not any("/local/" in n for n in names)
    # Every package is in it, operator packages included (discovered, not listed in pyproject.toml).
    for pkg in ("autotune", "search_spaces", "cost_model"):
        for init in (ROOT / pkg).rglob("__init__.py"):
            assert init.relative_to(ROOT).as_posix() in names


def test_an_installed_wheel_finds_its_shipped_logs(wheel, tmp_path):
    target = tmp_path / "site"
    run = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target",
                          str(target), str(wheel)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    ops = sorted({(rel.parts[0], rel.stem) for rel in SHIPPED})
    code = ("import json, sys, autotune.records as r; "
            f"print(json.dumps([r.__file__] + [[str(p) for p in r.shipped_logs(op, kind)] for kind, op in {ops!r}]))")
    env = {**os.environ, "PYTHONPATH": str(target)}
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env=env)
    assert got.returncode == 0, got.stderr
    module, *found = json.loads(got.stdout)
    assert Path(module).is_relative_to(target)  # the installed copy, not this checkout
    for (kind, op), paths in zip(ops, found):
        (path,) = map(Path, paths)
        assert path == target / "autotune" / "_shipped_logs" / kind / f"{op}.jsonl"
        assert path.read_bytes() == (ROOT / "logs" / kind / f"{op}.jsonl").read_bytes()


def test_this_checkout_finds_the_repository_logs():
    for rel in SHIPPED:
        (path,) = records.shipped_logs(rel.stem, f"{rel.parts[0]}:any-model")
        assert path.resolve() == (ROOT / "logs" / rel).resolve()
