"""DLRM operator autotuner: tune TVM schedule templates, keep every measurement, run the best kernel.

    import autotune
    autotune.tune("embedding_bag", "cpu", log="logs/cpu/embedding_bag.jsonl", trials=64,
                  rows=1_000_000, dim=64, batch=2048, pooling=(20, 80))
    eb = autotune.kernel("embedding_bag", "cpu", log="logs/cpu/embedding_bag.jsonl",
                         rows=1_000_000, dim=64, batch=2048, pooling=(20, 80))
    out = eb(weight, indices, offsets)
"""

from __future__ import annotations

import os
from pathlib import Path

# TVM's CPU thread pool defaults to half the hardware threads on x86 (1 thread on a 2-vCPU machine), while
# PyTorch uses all cores: kernels are tuned, run and compared with every core unless the user says otherwise.
# Set before any TVM pool starts; worker processes inherit it.
os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
from . import thread_env  # noqa: E402

thread_env.apply()  # TVM_THREAD_POOL_SPIN_COUNT=0 unless the user set it: TVM's workers sleep, not spin
from typing import Any

from .kernel import Kernel, NoTunedKernel, load_kernel
from .measure import Runner, make_runner
from .runtime import Timing
from .task import Task, make_task
from .tuner import TuneResult
from .tuner import tune as _tune

__all__ = ["Kernel", "NoTunedKernel", "Task", "Timing", "TuneResult", "kernel", "make_task", "tune"]


def tune(op: str, device: str = "cpu", *, log: str | Path, trials: int = 64, strategy: str = "xgb",
         seed: int = 0, shape: str | None = None, progress: bool = True, runner: Runner | str | None = None,
         include_stale: bool = False, retry_errors: tuple[str, ...] = (), **workload: Any) -> TuneResult:
    """Tune one operator for one device; every measurement is appended to `log`.

    The workload is given either as `shape="rows=...,dim=..."` (the CLI's text) or as keyword fields.
    `runner` is the CLI's `--runner` text ("local", "offline:DIR", "rpc://HOST:PORT/KEY") or a runner object.
    Records of older template code are ignored unless `include_stale`; configs whose records failed with a
    kind in `retry_errors` (e.g. ("timeout",)) are measured again.
    """
    task = make_task(op, device, shape=shape, **workload)
    opts = dict(trials=trials, log=log, strategy=strategy, seed=seed, progress=progress,
                include_stale=include_stale, retry_errors=retry_errors)
    if not isinstance(runner, str):
        return _tune(task, runner=runner, **opts)  # type: ignore[arg-type]
    made = make_runner(runner)
    try:
        return _tune(task, runner=made, **opts)  # type: ignore[arg-type]
    finally:
        if made is not None:
            made.close()


def kernel(op: str, device: str = "cpu", *, log: str | Path | list[str | Path] | None = None,
           validate: bool = True, shape: str | None = None, include_stale: bool = False,
           **workload: Any) -> Kernel:
    """The best logged kernel for a workload, as a callable on torch tensors (reference argument order).

    Without `log`, the project's shipped logs (logs/<device>/<op>.jsonl) are searched. Records of older
    template code are ignored unless `include_stale`.
    """
    task = make_task(op, device, shape=shape, **workload)
    logs = None if log is None else ([log] if isinstance(log, (str, Path)) else list(log))
    return load_kernel(task, logs, validate=validate, include_stale=include_stale)
