"""Candidates -> compiled shared libraries, built in parallel worker processes with a timeout.

Workers are TVM's popen pool: each imports TVM once and lives across batches; a build that hangs is killed
and its worker restarted, and either way the candidate becomes an error record, never an exception.
Each config is lowered once: that module is both featurized for the cost model (cost_model.program) and
compiled, so the features describe exactly the code that is measured.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from search_spaces import Config, InvalidConfig

from .task import Task


@dataclass(frozen=True)
class Built:
    """Outcome of one build: a library path, or an error kind and message."""

    config: Config
    lib: str | None
    build_s: float
    error_kind: str | None = None
    error: str | None = None
    usage: tuple[Any, ...] = ()  # GPU: per-kernel registers/shared memory/threads from ptxas (cuda.KernelUsage)
    # cost_model.program features of the module compiled ({} if it did not lower or no extractor coped)
    features: dict[str, float] = field(default_factory=dict, hash=False)


def compile_module(task: Task, cfg: Config):  # -> tvm Executable
    """Lower and compile one config in this process (used by workers, `kernel()` and `bench`)."""
    return compile_with_usage(task, cfg)[0]


def load_compiled(task: Task, cfg: Config) -> Any:
    """One config compiled in this process, as the callable its package would give (`autotune.kernel`, bench).

    A CPU kernel is written to a shared library and loaded the way the tuner's measure worker and the torch ops
    load theirs (`runtime.load_function`), so its parallel loops run on the pool they were timed on: PyTorch's
    OpenMP pool, with PyTorch's thread count. Called straight from the in-memory module they would run on TVM's
    own pool beside PyTorch's, which `bench` then compared with PyTorch's ops in the same process. The file is
    removed once loaded."""
    from . import runtime

    exe = compile_module(task, cfg)
    if task.device.is_gpu:
        return exe["main"]
    fd, lib = tempfile.mkstemp(prefix="autotune-kernel-", suffix=".so")
    os.close(fd)
    try:
        exe.export_library(lib)
        return runtime.load_function(lib)
    finally:
        os.unlink(lib)  # the loader keeps its mapping


def compile_with_usage(task: Task, cfg: Config) -> tuple[Any, tuple[Any, ...]]:
    """(executable, per-kernel GPU resource usage) of one config (see `compile_lowered`)."""
    return compile_lowered(task.lower(cfg), task)


def compile_lowered(mod: Any, task: Task) -> tuple[Any, tuple[Any, ...]]:
    """Compile a lowered module of `task`: GPU kernels are verified against the device's limits and compiled
    with nvcc (see `cuda.compile_gpu`); CPU kernels report no usage."""
    import tvm

    if task.device.is_gpu:
        from .cuda import compile_gpu

        exe, usage = compile_gpu(mod, task.device)
        return exe, tuple(usage)
    return tvm.compile(mod, target=task.device.target()), ()


def _features(task: Task, mod: Any) -> dict[str, float]:
    """The module's program features; a failure costs the features, never the build."""
    try:
        from cost_model.program import program_features

        return program_features(mod, task.device.target())
    except Exception:
        return {}


BuildResult = tuple[str | None, float, str | None, str | None, tuple, dict]


def _build_one(task: Task, cfg: Config, out_dir: str) -> BuildResult:
    """Runs in a worker: lower once, featurize and compile that module, export; returns (lib, seconds,
    error_kind, error, usage, features). Seconds exclude featurizing, so build times stay comparable."""
    t0 = time.perf_counter()
    features: dict[str, float] = {}
    try:
        mod = task.lower(cfg)
        t1 = time.perf_counter()
        features = _features(task, mod)
        t0 += time.perf_counter() - t1
        exe, usage = compile_lowered(mod, task)
    except InvalidConfig as err:
        return None, time.perf_counter() - t0, "invalid", str(err), (), features
    except Exception as err:  # TVM raises many kinds; each is this candidate's failure, not the tuner's
        return None, time.perf_counter() - t0, "build", describe_error(err), (), features
    fd, lib = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    exe.export_library(lib)
    return lib, time.perf_counter() - t0, None, None, usage, features


def _featurize_one(task: Task, cfg: Config) -> dict[str, float]:
    """Runs in a worker: the program features of one config, lowered only ({} if it no longer lowers)."""
    try:
        mod = task.lower(cfg)
    except Exception:  # InvalidConfig, or a schedule error of a config from an older space
        return {}
    return _features(task, mod)


def last_lines(text: str, n: int = 3, width: int = 400) -> str:
    """The end of a long message (a TVM traceback ends with what went wrong): its last `n` non-blank lines on
    one line, at most `width` characters, as records and progress messages carry it."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-width:]


def describe_error(err: BaseException) -> str:
    """`Type: the end of its message`: how a failure that is not ours to explain goes into a record."""
    return f"{type(err).__name__}: {last_lines(str(err))}"


class Builder:
    """A pool of build workers; `build(task, configs)` returns one Built per config, in order."""

    def __init__(self, workers: int | None = None, timeout: float = 60.0):
        self.timeout = timeout
        self.workers = workers or os.cpu_count() or 1
        self._pool: Any = None
        self._gpu_ready = False
        self.out_dir = tempfile.mkdtemp(prefix="autotune-build-")

    def _workers_for(self, task: Task) -> Any:
        """The pool, started (or restarted) so that its workers can build for the task's device."""
        if task.device.is_gpu and not self._gpu_ready:
            from .cuda import prepare_build_environment

            prepare_build_environment()  # workers inherit it: restart any that started without it
            self._gpu_ready = True
            if self._pool is not None:
                self._pool.shutdown(wait=False)
                self._pool = None
        return self._started()

    def _started(self) -> Any:
        from tvm.support.popen_pool import PopenPoolExecutor

        if self._pool is None:
            from .inspect_cache import skip_moduleless_frames

            self._pool = PopenPoolExecutor(max_workers=self.workers, timeout=self.timeout,
                                           initializer=skip_moduleless_frames)  # TVMScript parses 2x faster
        return self._pool

    def build(self, task: Task, configs: Sequence[Config]) -> list[Built]:
        from tvm.support.popen_pool import StatusKind

        job = functools.partial(_build_one, task, out_dir=self.out_dir)  # pickled to workers: no self inside
        results = self._workers_for(task).map_with_error_catching(job, configs)
        out = []
        for cfg, res in zip(configs, results):
            if res.status == StatusKind.COMPLETE:
                lib, secs, kind, msg, usage, features = res.value
                out.append(Built(cfg, lib, secs, kind, msg, usage, features))
            elif res.status == StatusKind.TIMEOUT:
                out.append(Built(cfg, None, self.timeout, "build_timeout", f"build exceeded {self.timeout:.0f} s"))
            else:
                out.append(Built(cfg, None, 0.0, "build", f"build worker failed: {res.value!r}"))
        return out

    def featurize(self, task: Task, configs: Sequence[Config]) -> list[dict[str, float]]:
        """Program features of configs without building them (candidates not built, records of old logs):
        lowered in the same workers; a config that fails to lower or times out gets {}. Lowering needs no
        GPU toolchain, so the pool is not prepared for one."""
        from tvm.support.popen_pool import StatusKind

        results = self._started().map_with_error_catching(functools.partial(_featurize_one, task), configs)
        return [r.value if r.status == StatusKind.COMPLETE and isinstance(r.value, dict) else {} for r in results]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        shutil.rmtree(self.out_dir, ignore_errors=True)

    def __enter__(self) -> "Builder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
