"""A tuning log as an object: read once, asked per task (resume set, current records, best), appended to.

`records` is the file format (a JSON line per measurement) and the rules on a list of records (pooled best,
current template version); this is what the tuner, `tune_model`, `kernel`, `export`, the CLI and the
benchmarks ask a log, as MetaSchedule asks its `Database` and KernelTuner its cache. The resume rule lives
here: what a run counts as measured, and so never measures again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Union

from . import records
from .records import Record, TaskKey
from .runtime import HARNESS

if TYPE_CHECKING:
    from .task import Task

PathLike = Union[str, "os.PathLike[str]"]


def task_key(task: "Task | TaskKey") -> TaskKey:
    return TaskKey(*task) if isinstance(task, tuple) else task.key


def _paths(paths: PathLike | Iterable[PathLike]) -> list[Path]:
    return [Path(paths)] if isinstance(paths, (str, os.PathLike)) else [Path(p) for p in paths]


def existing_paths(paths: PathLike | Iterable[PathLike]) -> list[Path]:
    """The paths of logs a user named, each checked to be a file: FileNotFoundError naming those that are not."""
    out = _paths(paths)
    missing = [str(p) for p in out if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"log not found: {', '.join(missing)}")
    return out


def _host_features(device: str) -> set[str] | None:
    """The LLVM features (`mattr`) this machine adds to CPU kind `device` when it is this machine's (None for
    another device: a GPU, or a CPU kind named for cross-compiling, whose records are taken as they are)."""
    from . import targets

    if not device.startswith("cpu:") or device != f"cpu:{targets.host_cpu()}":
        return None
    return set(dict(targets.resolve(device).target_json).get("mattr", ()))


class TuningLog:
    """The records of a log file, or of several read together (then read-only), loaded once.

    A missing file is an empty log (a first run creates it); `existing` refuses one instead. Queries take a
    `Task` or its (op, workload key, device) triple; records of older template code count only where a query
    is given `include_stale` (`records.current`).
    """

    def __init__(self, paths: PathLike | Iterable[PathLike], keep: Callable[[Record], bool] | None = None):
        self.paths = _paths(paths)
        self.records: list[Record] = [r for r in records.load_many(self.paths) if keep is None or keep(r)]
        self._by_task: dict[TaskKey, list[Record]] = {}
        for r in self.records:
            self._by_task.setdefault(r.task, []).append(r)

    @classmethod
    def existing(cls, paths: PathLike | Iterable[PathLike]) -> "TuningLog":
        """The log of files that must exist (a user named them): FileNotFoundError naming those that do not."""
        return cls(existing_paths(paths))

    @classmethod
    def shipped(cls, op: str, device: str) -> "TuningLog":
        """The pre-tuned records shipped for `op` on this device kind (`records.shipped_logs`) that this machine
        can run: a CPU kind's name is LLVM's model, and a VM may show one model with another's instruction
        sets (an AMX Xeon named "rocketlake"): records compiled for features this machine lacks are left out."""
        host = _host_features(device)
        return cls(records.shipped_logs(op, device),
                   keep=None if host is None else lambda r: set(r.target.get("mattr") or ()) <= host)

    def tasks(self) -> list[TaskKey]:
        """Every task with a record here, sorted."""
        return sorted(self._by_task)

    def of(self, task: "Task | TaskKey") -> list[Record]:
        """Every record of `task`, of any template version, in the order measured."""
        return list(self._by_task.get(task_key(task), ()))

    def current(self, task: "Task | TaskKey", include_stale: bool = False) -> list[Record]:
        """The records of `task` measured with the template code installed here (all with `include_stale`)."""
        return records.current(self._by_task.get(task_key(task), ()), include_stale)

    def stale(self, task: "Task | TaskKey", include_stale: bool = False) -> list[Record]:
        """The records of `task` that `current` leaves out: those of older template code (none with
        `include_stale`)."""
        kept = {id(r) for r in self.current(task, include_stale)}
        return [r for r in self._by_task.get(task_key(task), ()) if id(r) not in kept]

    def resume_set(self, task: "Task | TaskKey", retry_errors: Iterable[str] = (),
                   include_stale: bool = False) -> list[Record]:
        """The records a run of `task` counts as measured: its current records, except failures of a kind in
        `retry_errors` and the harness's own failures, which say nothing about the candidate. Their configs
        are not measured again."""
        again = {HARNESS, *retry_errors}
        return [r for r in self.current(task, include_stale) if r.error_kind not in again]

    def resumed(self, task: "Task | TaskKey", retry_errors: Iterable[str] = (), include_stale: bool = False) -> int:
        """How many configs of `task` a run resumes from (measured ones it skips)."""
        return len({r.config_key for r in self.resume_set(task, retry_errors, include_stale)})

    def best(self, task: "Task | TaskKey", include_stale: bool = False) -> Record | None:
        """The fastest correct config of `task` among its current records, costs pooled (`records.best`)."""
        return records.best(self.current(task, include_stale), *task_key(task))

    def append(self, recs: Iterable[Record]) -> None:
        """Append a batch to the log's file (`records.append`: locked, fsynced) and to what this object holds."""
        if len(self.paths) != 1:
            raise ValueError(f"a log read from {len(self.paths)} files is read-only; append to one file's log")
        recs = list(recs)
        records.append(self.paths[0], recs)
        self.records += recs
        for r in recs:
            self._by_task.setdefault(r.task, []).append(r)
