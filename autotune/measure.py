"""Built libraries -> timings, in an isolated worker process with a timeout.

The worker keeps the task's inputs and reference output between candidates (a 1M-row table takes a second
to make). Each candidate is first run once and compared with the PyTorch reference; only a correct result
is timed. A candidate that segfaults or hangs takes the worker down, not the tuner: the pool restarts it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

from . import runtime
from .build import Built, _last_lines
from .task import Task


@dataclass(frozen=True)
class Timing:
    """How to time a candidate: TVM's time_evaluator settings (median of `repeat`, each >= min_repeat_ms)."""

    number: int = 3
    repeat: int = 5
    min_repeat_ms: float = 50.0
    seed: int = 0


@dataclass(frozen=True)
class Measured:
    built: Built
    costs: tuple[float, ...] = ()
    error_kind: str | None = None
    error: str | None = None


_CACHE: dict[tuple[str, str, int], tuple[tuple[Any, ...], Any]] = {}
_TVM_COPIES: dict[int, Any] = {}  # id(torch input) -> 64-byte aligned TVM copy, for time_evaluator


def task_data(task: Task, seed: int) -> tuple[tuple[Any, ...], Any]:
    """Inputs and reference output of a task, cached in this process."""
    key = (task.op, task.workload_key, seed)
    if key not in _CACHE:
        _CACHE.clear()  # one task's data at a time: tables are large
        _TVM_COPIES.clear()
        inputs = task.template.inputs(task.workload, seed)
        _CACHE[key] = (inputs, task.template.reference(task.workload, *inputs))
    return _CACHE[key]


def mismatch(task: Task, out: Any, ref: Any) -> str | None:
    """Why `out` is not `ref` within the template's tolerance, or None if it is."""
    return runtime.mismatch(out, ref, *task.template.tolerance(task.workload))


_GPU_DATA: dict[tuple[str, str, int], runtime.TaskData] = {}


def _measure_gpu(task: Task, cfg: Any, lib: str, timing: Timing) -> tuple[tuple[float, ...], str | None, str | None]:
    """The local GPU: CUDA events with L2 flushed between calls, via the same code as the offline runner."""
    import torch

    key = (task.op, task.workload_key, timing.seed)
    if key not in _GPU_DATA:
        _GPU_DATA.clear()
        _GPU_DATA[key] = runtime.TaskData(task.template, task.workload, timing.seed, "cuda")
    try:
        func = runtime.load_function(lib)
    except Exception as err:
        return (), "runtime", f"{type(err).__name__}: {_last_lines(str(err))}"
    l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0))
    spec = runtime.TimingSpec(timing.number, timing.repeat, timing.min_repeat_ms)
    return runtime.check_and_time(_GPU_DATA[key], cfg, func, spec, l2)


def _measure_one(task: Task, cfg: Any, lib: str, timing: Timing) -> tuple[tuple[float, ...], str | None, str | None]:
    """Runs in the measure worker: check against the reference, then time."""
    import tvm

    if task.device.is_gpu:
        return _measure_gpu(task, cfg, lib, timing)
    inputs, ref = task_data(task, timing.seed)
    try:
        mod = tvm.runtime.load_module(lib)
        args, out = task.kernel_args(cfg, task.pack(cfg, inputs), inputs)  # packing is not timed
        mod["main"](*args)
    except Exception as err:
        return (), "runtime", f"{type(err).__name__}: {_last_lines(str(err))}"
    why = mismatch(task, out, ref)
    if why is not None:
        return (), "wrong", why
    dev = tvm.cpu(0)
    evaluator = mod.time_evaluator("main", dev, number=timing.number, repeat=timing.repeat,
                                   min_repeat_ms=int(timing.min_repeat_ms))
    res = evaluator(*[_tvm_copy(a, dev, cache=any(a is t for t in inputs)) for a in args])
    return tuple(float(c) for c in res.results), None, None


def _prepare(task: Task, seed: int) -> None:
    if not task.device.is_gpu:
        task_data(task, seed)


def require_local_device(task: Task) -> None:
    """GPU candidates are measured here only if PyTorch sees a GPU: say what to do instead."""
    import torch

    if task.device.is_gpu and not torch.cuda.is_available():
        raise ValueError(f"PyTorch sees no GPU here to measure {task.device.name} candidates; use "
                         "--runner offline:DIR to measure on a GPU machine, or --dry-run to only build")


def _tvm_copy(t: Any, dev: Any, cache: bool) -> Any:
    """time_evaluator takes TVM tensors, which must be 64-byte aligned; torch's small tensors may not be."""
    import tvm

    if cache and id(t) in _TVM_COPIES:
        return _TVM_COPIES[id(t)]
    copy = tvm.runtime.tensor(t.numpy(), dev)
    if cache:
        _TVM_COPIES[id(t)] = copy
    return copy


class LocalRunner:
    """Measures built candidates one at a time in a single worker process on this machine.

    One worker, because candidates must not share the cores they are timed on. It is TVM's PopenWorker,
    which takes a timeout per call: making a task's data may take long, a candidate may not.
    """

    def __init__(self, timing: Timing = Timing(), timeout: float = 30.0, prepare_timeout: float = 600.0):
        from tvm.support.popen_pool import PopenWorker

        self.timing = timing
        self.timeout = timeout
        self.prepare_timeout = prepare_timeout
        self._worker = PopenWorker()
        self._prepared: str | None = None

    def _call(self, fn: Any, args: tuple[Any, ...], timeout: float) -> Any:
        self._worker.send(fn, args, timeout=timeout)
        return self._worker.recv()

    def measure(self, task: Task, built: Sequence[Built]) -> list[Measured]:
        require_local_device(task)
        out = []
        for b in built:
            if b.lib is None:
                out.append(Measured(b, (), b.error_kind, b.error))
                continue
            if self._prepared != task.workload_key or not self._worker.is_alive():
                self._call(_prepare, (task, self.timing.seed), self.prepare_timeout)
                self._prepared = task.workload_key
            try:
                costs, kind, msg = self._call(_measure_one, (task, b.config, b.lib, self.timing), self.timeout)
                out.append(Measured(b, costs, kind, msg))
            except TimeoutError:
                out.append(Measured(b, (), "timeout", f"no result within {self.timeout:.0f} s (hang?)"))
            except ChildProcessError:
                out.append(Measured(b, (), "crash", "the measure worker died running this candidate"))
            except Exception as err:  # raised inside the worker by something outside the kernel
                out.append(Measured(b, (), "runtime", f"{type(err).__name__}: {_last_lines(str(err))}"))
            try:
                os.unlink(b.lib)
            except OSError:
                pass
        return out

    def close(self) -> None:
        self._worker.kill()
