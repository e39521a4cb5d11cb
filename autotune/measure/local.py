"""Built libraries -> timings, in an isolated worker process with a timeout, on this machine's CPU or GPU.

The worker keeps the task's inputs and reference output between candidates (a 1M-row table takes a second
to make). Each candidate goes through the measurement core (`runtime.measure_file`): called once through the
user's call path (`runtime.BoundKernel`) and compared with the PyTorch reference; only a correct result is
timed, on that same call. A candidate that segfaults or hangs takes the worker down, not the tuner: the pool
restarts it. Failures of the machinery rather than of the candidate (the task's data could not be made, the
worker raised outside the kernel) are recorded as "harness" errors, which a resumed run measures again.
"""

from __future__ import annotations

from typing import Any, Sequence

from .. import runtime
from ..build import Built
from ..runtime import HARNESS, Timing
from ..task import Task
from .base import Measured
from .common import call, check_anchor, discard, harness_error, measure_here, require_local_device, task_data


def _prepare(task: Task, timing: Timing, nominal: float | None = None) -> float | None:
    """Make the task's data in the worker and, for anchored timing, compile, check and calibrate its anchor
    (the template's default config, a kernel every template has and the contract test checks); returns the
    anchor's nominal latency. `nominal`: that of an earlier worker of the runner, so that a worker restarted
    after a crash keeps the runner's scale."""
    data = task_data(task, timing.seed)
    if timing.anchor and data.anchor is None:
        from ..build import load_compiled

        cfg = task.space.default()
        bound = data.bind(cfg, load_compiled(task, cfg))
        why = runtime.mismatch(bound(*data.inputs), data.expected)
        if why is not None:
            raise RuntimeError(f"the anchor (the default config) is wrong: {why}")
        data.anchor = runtime.Anchor(data.calls(bound)).calibrate(timing, nominal=nominal)
    return data.anchor.nominal if data.anchor is not None else None


class LocalRunner:
    """Measures built candidates one at a time in a single worker process on this machine.

    One worker, because candidates must not share the cores they are timed on. It is TVM's PopenWorker,
    which takes a timeout per call: making a task's data may take long, a candidate may not.
    """

    def __init__(self, timing: Timing = Timing(), timeout: float = 30.0, prepare_timeout: float = 600.0,
                 anchor_nominal: dict[str, float] | None = None):
        """`anchor_nominal`: anchored timing's nominal anchor latency per workload key, from an earlier runner
        (`self.anchor_nominal`) whose records these are to be compared with; else each task calibrates anew."""
        from tvm.support.popen_pool import PopenWorker

        self.timing = timing
        self.timeout = timeout
        self.prepare_timeout = prepare_timeout
        self._worker = PopenWorker()
        self._prepared: str | None = None
        self.anchor_nominal = dict(anchor_nominal or {})  # anchored timing: per task, kept across workers

    def _ensure_prepared(self, task: Task) -> str | None:
        """Make the task's data in the worker (once per task and worker); why it failed, or None."""
        if self._prepared == task.workload_key and self._worker.is_alive():
            return None
        try:
            nominal = call(self._worker, _prepare, (task, self.timing, self.anchor_nominal.get(task.workload_key)),
                           self.prepare_timeout)
        except TimeoutError:
            return f"making the task's inputs took over {self.prepare_timeout:.0f} s"
        except ChildProcessError:
            return "the measure worker died making the task's inputs"
        except Exception as err:
            return harness_error(err, "making the task's inputs failed")
        self._prepared = task.workload_key
        if nominal is not None:
            self.anchor_nominal[task.workload_key] = nominal
        return None

    def measure(self, task: Task, built: Sequence[Built]) -> list[Measured]:
        check_anchor(self.timing, task.device.is_gpu)
        require_local_device(task)
        out = []
        for b in built:
            if b.lib is None:
                out.append(Measured.unbuilt(b))
                continue
            unprepared = self._ensure_prepared(task)
            if unprepared is not None:
                out.append(Measured(b, (), HARNESS, unprepared))
            else:
                out.append(self._measure_built(task, b))
            discard(b.lib)
        return out

    def _measure_built(self, task: Task, b: Built) -> Measured:
        try:
            costs, kind, msg = call(self._worker, measure_here, (task, b.config, b.lib, self.timing), self.timeout)
            return Measured(b, costs, kind, msg)
        except TimeoutError:
            return Measured(b, (), "timeout", f"no result within {self.timeout:.0f} s (hang?)")
        except ChildProcessError:
            return Measured(b, (), "crash", "the measure worker died running this candidate")
        except Exception as err:  # raised inside the worker by something outside the kernel
            return Measured(b, (), HARNESS, harness_error(err, "the measure worker failed"))

    def close(self) -> None:
        self._worker.kill()
