import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# Test-only templates (tests/templates) must import in TVM's worker processes too. The repository root goes
# before them: an editable install's import finder comes after sys.path, so without it `search_spaces` would
# resolve to the test folder tests/search_spaces (a namespace package) instead of the real package.
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS.parent))
# The repository root comes first: tests/search_spaces (test files, no __init__) must not shadow the package
# as a namespace package in workers started from another directory.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS.parent), str(TESTS), os.environ.get("PYTHONPATH")]))
# Keep timings of the suite's tiny kernels from fighting each other for the two cores.
os.environ.setdefault("TVM_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def host():
    from autotune.targets import resolve

    return resolve("cpu")


@pytest.fixture(scope="session")
def gpu_builder():
    """One build pool for every GPU test (its workers import TVM once)."""
    from autotune.build import Builder

    with Builder(timeout=300) as builder:
        yield builder


def load_counting(path):
    """Load a kernel package with a call counter on each kernel (`kernel.calls`): tells a kernel run from a
    fallback. Unloads every package first; the caller unloads after."""
    import autotune.torch as at

    at.unload_all()
    loaded = at.load(path)
    for k in loaded.kernels:
        k.calls = 0

        def counting(*args, _k=k, _f=k.func):
            _k.calls += 1
            return _f(*args)

        k.func = counting
    return loaded
