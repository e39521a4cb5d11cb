"""What the runners share: the measurement core as a worker or server runs it, and the checks and chores around it.

`measure_here` is the one place a candidate is checked and timed on this machine's device; the local runner's
worker and an `autotune rpc server` both call it, so a farm's figures are the local runner's (the offline
runner's device script calls the same core, `runtime.measure_file`, without TVM).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .. import runtime
from ..build import describe_error
from ..runtime import Timing
from ..task import Task


def task_data(task: Task, seed: int) -> runtime.TaskData:
    """Inputs and reference output of a task on its device, kept in this process for the next candidate."""
    return runtime.task_data(task.template, task.workload, seed, "cuda" if task.device.is_gpu else "cpu")


def _l2_bytes(task: Task) -> int:
    return runtime.l2_bytes_here(task.device.gpu.l2_bytes if task.device.gpu else 0) if task.device.is_gpu else 0


def measure_here(task: Task, cfg: Any, lib: str, timing: Timing) -> tuple[tuple[float, ...], str | None, str | None]:
    """Runs in a measure worker or on an RPC server: the core's check-then-time of the library `lib` on this
    machine's device; (costs, error kind, error)."""
    import tvm  # noqa: F401  (TVM's runtime, which the libraries link against; loaded once per worker)

    return runtime.measure_file(task_data(task, timing.seed), cfg, lib, timing, _l2_bytes(task))


def harness_error(err: BaseException, where: str) -> str:
    """The message of a "harness" error: the measuring machinery failed `where`, not the candidate."""
    return f"{where}: {describe_error(err)}"


def check_anchor(timing: Timing, gpu: bool, runner: str = "") -> None:
    """Anchored timing (`Timing.anchor`) compiles its anchor in the measure worker: CPU tasks on a local runner
    only (a GPU is timed by CUDA events with L2 flushed; remote machines need not have TVM's compiler)."""
    if timing.anchor and (gpu or runner):
        raise ValueError(f"anchored timing is for CPU tasks measured by the local runner, not {runner or 'a GPU'}")


def require_local_device(task: Task) -> None:
    """GPU candidates are measured here only if PyTorch sees a GPU: say what to do instead."""
    import torch

    if task.device.is_gpu and not torch.cuda.is_available():
        raise ValueError(f"PyTorch sees no GPU here to measure {task.device.name} candidates; use "
                         "--runner offline:DIR to measure on a GPU machine, or --dry-run to only build")


def call(worker: Any, fn: Any, args: tuple[Any, ...], timeout: float) -> Any:
    """`fn(*args)` in a TVM PopenWorker, which is killed (TimeoutError) after `timeout` seconds."""
    worker.send(fn, args, timeout=timeout)
    return worker.recv()


def discard(lib: str) -> None:
    """Remove a candidate's library once measured (or found not needed); one already gone is no error."""
    try:
        os.unlink(lib)
    except OSError:
        pass


def say_on_stderr(msg: str) -> None:
    """Where a runner that waits for something outside (a device, a farm) says so, unless told otherwise."""
    print(msg, file=sys.stderr, flush=True)
