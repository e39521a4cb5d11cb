"""`--runner offline:DIR`: measure on a machine the tuner cannot reach, through a directory.

For each batch the tuner writes DIR/batch-NNNN/ (the compiled candidates and batch.json) and waits for
DIR/batch-NNNN/results.json. On the device, `python DIR/measure.py [--watch]` (PyTorch and apache-tvm-ffi,
no TVM compiler) checks and times the candidates and writes the results; the tuner ingests them, updates its
cost model and proposes the next batch. DIR can be a shared mount, or be copied to the device and back.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import package
from ..build import Built
from ..runtime import HARNESS, Timing
from ..task import Task
from . import offline_device
from .base import Measured
from .common import check_anchor, say_on_stderr
from .offline_device import BATCH, RESULTS, write_json


class OfflineTimeout(TimeoutError):
    pass


class OfflineRunner:
    """Hands each batch to a device through the directory `root` and waits (`wait_s`; None: as long as it takes,
    looking every `poll_s`) for its results; `say` tells the user what to run there (default: stderr)."""

    def __init__(self, root: str | Path, timing: Timing = Timing(), poll_s: float = 1.0,
                 wait_s: float | None = None, say: Callable[[str], None] | None = None):
        check_anchor(timing, gpu=False, runner="the offline runner")
        self.root = Path(root)
        self.timing = timing
        self.poll_s = poll_s
        self.wait_s = wait_s  # None: wait as long as it takes
        self.say = say or say_on_stderr
        self._ready_for: set[str] = set()

    def _prepare(self, task: Task) -> None:
        if task.op in self._ready_for:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        package.write_support_files(self.root, [task.op], gpu=task.device.is_gpu)
        shutil.copy2(offline_device.__file__, self.root / "measure.py")  # the device-side script
        self._ready_for.add(task.op)

    def _next_batch_dir(self) -> Path:
        taken = [int(p.name.split("-")[1]) for p in self.root.glob("batch-*") if p.name.split("-")[1].isdigit()]
        path = self.root / f"batch-{max(taken, default=-1) + 1:04d}"
        (path / "kernels").mkdir(parents=True)
        return path

    def write_batch(self, task: Task, ready: Sequence[Built]) -> Path:
        """Move built candidates into a new batch directory for measure.py; returns the directory."""
        self._prepare(task)
        batch = self._next_batch_dir()
        candidates = []
        for i, b in enumerate(ready):
            name = f"kernels/c{i:03d}.so"
            shutil.move(b.lib, batch / name)  # type: ignore[arg-type]
            candidates.append({"id": i, "config": b.config.to_json(), "file": name})
        spec = {"format": package.FORMAT, "op": task.op, "workload": task.workload.to_json(),
                "device": task.device.name, "gpu": task.device.is_gpu,
                "l2_bytes": task.device.gpu.l2_bytes if task.device.gpu else 0, "seed": self.timing.seed,
                "timing": asdict(self.timing),
                "candidates": candidates}
        write_json(batch / BATCH, spec)  # written last: a watcher never sees a half-written batch
        return batch

    def measure(self, task: Task, built: Sequence[Built]) -> list[Measured]:
        ready = [b for b in built if b.lib is not None]
        outcome: dict[int, Measured] = {}
        if ready:
            batch = self.write_batch(task, ready)
            self.say(f"offline: {batch} has {len(ready)} candidates; measure them on the device with "
                     f"`python {self.root}/measure.py` (waiting for {batch.name}/{RESULTS})")
            by_id = {r["id"]: r for r in self._wait(batch / RESULTS)["results"]}
            for i, b in enumerate(ready):
                r = by_id.get(i, {"costs": [], "error_kind": HARNESS, "error": "missing from results.json"})
                outcome[id(b)] = Measured(b, tuple(r["costs"]), r["error_kind"], r["error"])
        return [outcome.get(id(b)) or Measured.unbuilt(b) for b in built]

    def _wait(self, path: Path) -> dict[str, Any]:
        deadline = None if self.wait_s is None else time.monotonic() + self.wait_s
        while True:
            if path.exists():
                try:
                    return json.loads(path.read_text())
                except json.JSONDecodeError:  # still being copied back by hand: look again
                    pass
            if deadline is not None and time.monotonic() > deadline:
                raise OfflineTimeout(f"no complete {path} after {self.wait_s:.0f} s; rerun the same command to "
                                     "resume (measured batches are in the log)")
            time.sleep(self.poll_s)

    def close(self) -> None:
        pass
