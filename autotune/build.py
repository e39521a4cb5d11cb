"""Candidates -> compiled shared libraries, built in parallel worker processes with a timeout.

Workers are TVM's popen pool: each imports TVM once and lives across batches; a build that hangs is killed
and its worker restarted, and either way the candidate becomes an error record, never an exception.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
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


def compile_module(task: Task, cfg: Config):  # -> tvm Executable
    """Lower and compile one config in this process (used by workers, `kernel()` and `bench`)."""
    return compile_with_usage(task, cfg)[0]


def compile_with_usage(task: Task, cfg: Config) -> tuple[Any, tuple[Any, ...]]:
    """(executable, per-kernel GPU resource usage): GPU kernels are verified against the device's limits and
    compiled with nvcc (see `cuda.compile_gpu`); CPU kernels report no usage."""
    import tvm

    if task.device.is_gpu:
        from .cuda import compile_gpu

        exe, usage = compile_gpu(task.lower(cfg), task.device)
        return exe, tuple(usage)
    return tvm.compile(task.lower(cfg), target=task.device.target()), ()


def _build_one(task: Task, cfg: Config, out_dir: str) -> tuple[str | None, float, str | None, str | None, tuple]:
    """Runs in a worker: compile and export; returns (lib, seconds, error_kind, error, usage)."""
    t0 = time.perf_counter()
    try:
        exe, usage = compile_with_usage(task, cfg)
    except InvalidConfig as err:
        return None, time.perf_counter() - t0, "invalid", str(err), ()
    except Exception as err:  # TVM raises many kinds; each is this candidate's failure, not the tuner's
        return None, time.perf_counter() - t0, "build", f"{type(err).__name__}: {_last_lines(str(err))}", ()
    fd, lib = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    exe.export_library(lib)
    return lib, time.perf_counter() - t0, None, None, usage


def _last_lines(text: str, n: int = 3, width: int = 400) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-width:]


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
        from tvm.support.popen_pool import PopenPoolExecutor

        if task.device.is_gpu and not self._gpu_ready:
            from .cuda import prepare_build_environment

            prepare_build_environment()  # workers inherit it: restart any that started without it
            self._gpu_ready = True
            if self._pool is not None:
                self._pool.shutdown(wait=False)
                self._pool = None
        if self._pool is None:
            self._pool = PopenPoolExecutor(max_workers=self.workers, timeout=self.timeout)
        return self._pool

    def build(self, task: Task, configs: Sequence[Config]) -> list[Built]:
        from tvm.support.popen_pool import StatusKind

        job = functools.partial(_build_one, task, out_dir=self.out_dir)  # pickled to workers: no self inside
        results = self._workers_for(task).map_with_error_catching(job, configs)
        out = []
        for cfg, res in zip(configs, results):
            if res.status == StatusKind.COMPLETE:
                lib, secs, kind, msg, usage = res.value
                out.append(Built(cfg, lib, secs, kind, msg, usage))
            elif res.status == StatusKind.TIMEOUT:
                out.append(Built(cfg, None, self.timeout, "build_timeout", f"build exceeded {self.timeout:.0f} s"))
            else:
                out.append(Built(cfg, None, 0.0, "build", f"build worker failed: {res.value!r}"))
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        shutil.rmtree(self.out_dir, ignore_errors=True)

    def __enter__(self) -> "Builder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
