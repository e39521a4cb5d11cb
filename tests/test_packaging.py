"""The wheel ships the pre-tuned records (logs/) where `records.shipped_logs` finds them once installed, and
installed in a fresh virtual environment it serves the torch ops.

Builds the wheel from a copy of the source tree (a stale build/ of the checkout cannot leak into it) without
build isolation (offline, seconds), installs it into a directory or a new venv and asks a fresh interpreter there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
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


def _venv_with_this_environments_packages(path: Path) -> Path:
    """A new venv (`--system-site-packages`) that also sees this interpreter's own site-packages, where torch and
    TVM are installed when this is itself a venv (as `make install`'s .venv): appended to sys.path by a .pth
    file, after the new venv's own site-packages, and as plain paths, so that the .pth files there (this
    checkout's editable install among them) are not run. Its python."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(path)], check=True, timeout=300)
    python = path / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (Path(site) / "zz_this_environment.pth").write_text("".join(f"{p}\n" for p in ours))
    return python


def test_the_wheel_installed_in_a_fresh_venv_serves_a_torch_op(wheel, tmp_path):
    """pip installs the wheel into a new venv; a fresh interpreter there (no PYTHONPATH, not in this checkout)
    imports the installed autotune.torch and calls torch.ops.autotune.embedding_bag with no kernel loaded
    (PyTorch's path), through the compiled call path where this checkout's builds (callpath.cpp is shipped)."""
    python = _venv_with_this_environments_packages(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    run = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                          "--ignore-installed", "-q", str(wheel)], capture_output=True, text=True, timeout=300,
                         env=env)
    assert run.returncode == 0, run.stderr
    code = """if True:
        import json, torch, torch.nn.functional as F
        import autotune, autotune.torch as at
        g = torch.Generator().manual_seed(0)
        weight = torch.randn(40, 8, generator=g)
        indices = torch.randint(0, 40, (12,), generator=g)
        offsets = torch.tensor([0, 3, 3, 7])  # an empty bag among them
        out = torch.ops.autotune.embedding_bag(weight, indices, offsets)
        ref = F.embedding_bag(indices, weight, offsets, mode="sum")
        print(json.dumps({"autotune": autotune.__file__, "torch": torch.__file__, "close": torch.allclose(out, ref),
                          "shape": list(out.shape), "callpath": at.callpath.load() is not None}))
    """
    got = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env=env)
    assert got.returncode == 0, got.stderr
    result = json.loads(got.stdout.strip().splitlines()[-1])
    assert Path(result["autotune"]).is_relative_to(tmp_path / "venv")  # the installed copy, not this checkout
    assert not Path(result["autotune"]).is_relative_to(ROOT)
    assert result["close"] and result["shape"] == [4, 8]
    import autotune.torch as at

    assert result["callpath"] == (at.callpath.load() is not None)  # the shipped callpath.cpp builds as the source's


def test_the_makefile_installs_the_extras_pyproject_pins():
    """The optional extras are installed with --no-deps by the Makefile (their own releases pin another torch):
    its lists and pyproject's must name the same packages at the same versions."""
    import re
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    make = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    pins = re.search(r"^TORCHREC_PINS\s*:=\s*(.+)$", make, re.M).group(1).split()
    assert sorted(pins) == sorted(extras["torchrec"])
    peers = re.findall(r"--no-deps '([^']+)'", make)
    assert sorted(peers) == sorted(extras["peers"])
