"""The best logged config of a task, compiled in this process and callable on torch tensors."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from . import records
from .build import load_compiled
from .task import Task
from .tuning_log import TuningLog


class NoTunedKernel(LookupError):
    pass


def best_record(task: Task, logs: Iterable[str | Path] | TuningLog, include_stale: bool = False) -> records.Record:
    """The fastest correct record of `task` in `logs` (files that must exist, or a log already read), of the
    current template version unless `include_stale`."""
    log = logs if isinstance(logs, TuningLog) else TuningLog.existing(logs)
    rec = log.best(task, include_stale)
    if rec is None:
        stale = sum(1 for r in log.stale(task, include_stale) if r.ok)
        hint = (f" ({stale} correct records of older template code were ignored: re-tune, or pass "
                f"include_stale=True / --include-stale)" if stale else "")
        raise NoTunedKernel(f"no correct {task.op} record for this workload on {task.device.name} in "
                            f"{', '.join(map(str, log.paths)) or 'the shipped logs'}{hint}; run `autotune tune` first")
    return rec


class Kernel:
    """A compiled kernel with the reference's argument order: `kernel(weight, indices, offsets)`.

    Inputs are checked (unless `validate=False`), then run through `runtime.BoundKernel` on a library loaded as
    the tuner's measure worker loads it (`build.load_compiled`): the call path and thread pool the tuner timed,
    so a logged latency is what this call costs (plus the check)."""

    def __init__(self, task: Task, config: Any, validate: bool = True):
        self.task = task
        self.config = config
        self.validate = validate
        self.bound = task.bind(config, load_compiled(task, config))

    def __call__(self, *tensors: Any) -> Any:
        if self.validate:
            self.task.template.check_inputs(self.task.workload, *tensors)
        return self.bound(*tensors)

    def __repr__(self) -> str:
        return f"Kernel({self.task.op}, {self.task.device.name}, {self.config})"


def load_kernel(task: Task, logs: Iterable[str | Path] | None = None, validate: bool = True,
                include_stale: bool = False) -> Kernel:
    rec = best_record(task, logs if logs is not None else TuningLog.shipped(task.op, task.device.name), include_stale)
    return Kernel(task, task.space.from_json(rec.config), validate=validate)
