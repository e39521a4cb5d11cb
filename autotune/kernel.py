"""The best logged config of a task, compiled in this process and callable on torch tensors."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from . import records
from .records import shipped_logs
from .build import compile_module
from .task import Task

class NoTunedKernel(LookupError):
    pass


def best_record(task: Task, logs: Iterable[str | Path]) -> records.Record:
    logs = list(logs)
    missing = [str(p) for p in logs if not Path(p).exists()]
    if missing:
        raise FileNotFoundError(f"log not found: {', '.join(missing)}")
    rec = records.best(records.load_many(logs), task.op, task.workload_key, task.device.name)
    if rec is None:
        raise NoTunedKernel(f"no correct {task.op} record for this workload on {task.device.name} in "
                            f"{', '.join(map(str, logs)) or 'the shipped logs'}; run `autotune tune` first")
    return rec


class Kernel:
    """A compiled kernel with the reference's argument order: `kernel(weight, indices, offsets)`."""

    def __init__(self, task: Task, config: Any, validate: bool = True):
        self.task = task
        self.config = config
        self.validate = validate
        self._func = compile_module(task, config)["main"]
        self._packed: tuple[Any, ...] = ()
        self._packed_for: tuple[Any, ...] | None = None

    def _pack(self, tensors: tuple[Any, ...]) -> tuple[Any, ...]:
        """Packed weights, redone only when a weight tensor changes (new storage or in-place update)."""
        weights = [tensors[i] for i in self.task.template.WEIGHTS]
        key = tuple((t.data_ptr(), t._version, tuple(t.shape)) for t in weights)
        if key != self._packed_for:
            self._packed, self._packed_for = self.task.pack(self.config, tensors), key
        return self._packed

    def __call__(self, *tensors: Any) -> Any:
        if self.validate:
            self.task.template.check_inputs(self.task.workload, *tensors)
        args, out = self.task.kernel_args(self.config, self._pack(tensors), tensors)
        self._func(*args)
        return out

    def __repr__(self) -> str:
        return f"Kernel({self.task.op}, {self.task.device.name}, {self.config})"


def load_kernel(task: Task, logs: Iterable[str | Path] | None = None, validate: bool = True) -> Kernel:
    rec = best_record(task, logs if logs is not None else shipped_logs(task.op, task.device.name))
    return Kernel(task, task.space.from_json(rec.config), validate=validate)
