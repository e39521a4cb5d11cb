import contextlib
import os
import shutil
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


# TVMScript parses about twice as fast in this process too (pytest-xdist's `<string>` frames): see
# autotune.inspect_cache, which the build workers and the CLI call themselves.
from autotune.inspect_cache import skip_moduleless_frames  # noqa: E402

skip_moduleless_frames()


# ---- tests of a part of the install fail where it is missing; a skip is for a missing device ---------------
ALLOW_MISSING = "AUTOTUNE_TEST_ALLOW_MISSING"  # "callpath,onednn,g++": parts a local run may skip; never in CI


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def requires_build(what: str, available, why: str):
    """Mark tests of a part of the install (the compiled call path, oneDNN's op, a C++ compiler), not of a
    device: where `available()` (called once, at the first such test's setup) is false, each test FAILS with
    `why`. A missing build is a broken install (`make install` builds the call path), and a skip would let CI
    pass without running the tests. Locally, AUTOTUNE_TEST_ALLOW_MISSING=<what>[,<what>...] makes them skips
    instead; in CI (CI set, as CI services do) that opt-out is refused."""
    return pytest.mark.requires_build(what=what, available=available, why=why)


_BUILT: dict[str, bool] = {}


def pytest_configure(config):
    config.addinivalue_line("markers", "requires_build(what, available, why): a test of a part of the install; "
                                       "fails where it is missing (tests/conftest.py: requires_build)")


def pytest_runtest_setup(item):
    for mark in item.iter_markers("requires_build"):
        what = mark.kwargs["what"]
        if what not in _BUILT:
            _BUILT[what] = bool(mark.kwargs["available"]())
        if _BUILT[what]:
            continue
        allowed = what in {w.strip() for w in os.environ.get(ALLOW_MISSING, "").split(",")}
        message = f"{what} is missing: {mark.kwargs['why']}"
        if allowed and not in_ci():
            pytest.skip(f"{message} ({ALLOW_MISSING} allows it)")
        if allowed:
            message += f" ({ALLOW_MISSING} is ignored in CI)"
        else:
            message += f" (a broken install; {ALLOW_MISSING}={what} skips it on a machine that cannot build it)"
        pytest.fail(message, pytrace=False)


# The CUDA emulator (tests/cuda_emulator.py) compiles generated CUDA source with g++: the only check of the CUDA
# kernels' numbers on a machine without a GPU, so a missing g++ fails them rather than skipping them.
needs_gxx = requires_build("g++", lambda: shutil.which("g++") is not None,
                           "the CUDA emulator compiles the generated CUDA kernels with g++ (install g++)")


def cpu_flags() -> set[str]:
    """This CPU's feature flags as the kernel reports them (/proc/cpuinfo: "avx", "avx2", "avx512_vnni", ...):
    what a test of a CPU-specific code path asks before skipping, not the code under test's own answer."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


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


@pytest.fixture(scope="session")
def cpu_builder():
    """One CPU build pool with Builder()'s defaults (a worker per core, 60 s timeout) for the tests whose subject
    is not the pool itself: every Builder() (and every export() or tune() given none) starts fresh workers, each
    importing TVM (~5 s apiece on 2 cores). A test that needs fresh workers (another PYTHONPATH, the pool's own
    behaviour) makes its own."""
    from autotune.build import Builder

    with Builder() as builder:
        yield builder


@pytest.fixture(scope="session")
def local_runner():
    """One measure worker for the tests whose subject is not the runner's process: use it through
    `RunnerView(local_runner, timing, timeout)`, which measures with the view's own timing and timeout."""
    from autotune.measure import LocalRunner

    runner = LocalRunner()
    yield runner
    runner.close()


class RunnerView:
    """A LocalRunner's worker process shared, with this view's timing and timeout for each `measure`, and a
    `close()` that leaves the worker running (the session closes it). Which task's data the worker holds stays
    the shared runner's state, so views never measure against another task's data."""

    def __init__(self, shared, timing=None, timeout=30.0):
        from autotune.measure import Timing

        self.shared, self.timing, self.timeout = shared, timing or Timing(), timeout

    def measure(self, task, built):
        saved = self.shared.timing, self.shared.timeout
        self.shared.timing, self.shared.timeout = self.timing, self.timeout
        try:
            return self.shared.measure(task, built)
        finally:
            self.shared.timing, self.shared.timeout = saved

    def close(self):
        pass


class SharedPool:
    """A build pool handed to code that closes what it is given (tune's or export's own): `close()` leaves it
    running for the next test."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def close(self):
        pass


# How the end-to-end tests of tune_model time candidates (`default_pools(timing=BRIEF)`): they pin what is tuned,
# wired and reported, not which config wins, and Timing()'s 5 repeats of >= 50 ms made a fifth of their time
BRIEF = dict(number=1, repeat=3, min_repeat_ms=5.0)


@contextlib.contextmanager
def default_pools(builder, runner=None, timing=None):
    """While open, the pools that tune(), tune_model(), export() and dry_run() make for themselves when given
    none (`Builder()`, `LocalRunner(timing)`) are `builder` and a RunnerView of `runner` (their `close()` leaves
    them running): the same classes and settings, without fresh processes that import TVM. A pool made with
    arguments is made as asked; without `runner`, runners are made as asked too. `timing` (Timing's fields): what
    a runner asked for without a timing measures with (default: Timing()'s). Yields how many of each were asked
    for ({"builders": n, "runners": n})."""
    from autotune import build, measure, tuner
    from autotune.measure import Timing

    Builder, LocalRunner = build.Builder, measure.LocalRunner
    asked = {"builders": 0, "runners": 0}
    timing_fields = timing

    def shared_builder(*args, **kw):
        asked["builders"] += 1
        return Builder(*args, **kw) if args or kw else SharedPool(builder)

    def shared_runner(timing=None, *args, **kw):
        asked["runners"] += 1
        timing = timing or Timing(**(timing_fields or {}))
        return LocalRunner(timing, *args, **kw) if args or kw else RunnerView(runner, timing)

    mp = pytest.MonkeyPatch()
    mp.setattr(tuner, "Builder", shared_builder)
    mp.setattr(build, "Builder", shared_builder)  # export's and tune_model's `from .build import Builder`
    if runner is not None:
        mp.setattr(tuner, "LocalRunner", shared_runner)
        mp.setattr(measure, "LocalRunner", shared_runner)  # tune_model's `from ..measure import LocalRunner`
    try:
        yield asked
    finally:
        mp.undo()


def ending_at_a_guard_page(values):
    """A 1-D int64 CPU tensor of `values` whose last element ends exactly where an inaccessible page begins:
    a kernel reading one element past it crashes the process instead of reading an allocation's slack.
    Linux only (mmap + mprotect); the caller keeps the returned (tensor, mapping) pair alive."""
    import ctypes
    import mmap

    import numpy as np
    import torch

    if not sys.platform.startswith("linux"):
        pytest.skip("guard pages via mprotect: Linux only")
    page, nbytes = mmap.PAGESIZE, len(values) * 8
    pages = -(-nbytes // page) + 1
    buf = mmap.mmap(-1, pages * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(addr + (pages - 1) * page), page, 0) == 0
    arr = np.frombuffer(buf, dtype=np.int64, count=len(values), offset=(pages - 1) * page - nbytes)
    arr[:] = values
    return torch.from_numpy(arr), buf


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
