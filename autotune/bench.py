"""Side-by-side benchmark of one task: the best logged kernel, PyTorch's reference, the untuned default.

All three run in this process on the same inputs, interleaved in rounds so that drift in a noisy machine
hits them alike; the figures that matter are the ratios. Outputs are checked to agree before any timing.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from .kernel import Kernel, best_record
from .measure import mismatch
from .task import Task


@dataclass(frozen=True)
class BenchResult:
    tuned_s: float
    torch_s: float
    default_s: float
    unit: str
    tuned_rate: float  # GB/s or GFLOPS of the tuned kernel (the template's figure of merit)
    torch_rate: float
    config: str
    baselines: tuple[tuple[str, float], ...] = ()  # every PyTorch path timed; torch_s is the fastest

    @property
    def speedup_vs_torch(self) -> float:
        return self.torch_s / self.tuned_s

    @property
    def speedup_vs_default(self) -> float:
        return self.default_s / self.tuned_s

    def to_json(self) -> dict[str, Any]:
        key = {"GB/s": "gbps", "GFLOPS": "gflops", "GOPS": "gops"}[self.unit]
        return {"tuned_s": self.tuned_s, "torch_s": self.torch_s, "default_s": self.default_s,
                "speedup_vs_torch": self.speedup_vs_torch, "speedup_vs_default": self.speedup_vs_default,
                key: self.tuned_rate, f"torch_{key}": self.torch_rate, "config": self.config,
                "baselines": dict(self.baselines)}


def median_seconds(fn: Callable[[], Any], min_run_time: float) -> float:
    """Median per-call time by torch.utils.benchmark's blocked autorange (warm-up included)."""
    from torch.utils.benchmark import Timer

    return Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time).median


def bench(task: Task, logs: Iterable[str | Path], seed: int = 0, rounds: int = 3,
          min_run_time: float = 0.5) -> BenchResult:
    template, w = task.template, task.workload
    rec = best_record(task, logs)
    tuned = Kernel(task, task.space.from_json(rec.config), validate=False)
    default = Kernel(task, task.space.default(), validate=False)
    inputs = template.inputs(w, seed)
    ref = template.reference(w, *inputs)
    for name, k in (("tuned", tuned), ("default", default)):
        why = mismatch(task, k(*inputs), ref)
        if why is not None:
            raise AssertionError(f"the {name} kernel disagrees with PyTorch: {why}")
    # A template may name PyTorch's fastest paths for its op (prepared outside the timing); else the reference.
    torch_paths = (template.baselines(w, *inputs) if hasattr(template, "baselines")
                   else {"torch": lambda: template.reference(w, *inputs)})
    contenders = {"tuned": lambda: tuned(*inputs), "default": lambda: default(*inputs), **torch_paths}
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            times[name].append(median_seconds(fn, min_run_time))
    med = {k: statistics.median(v) for k, v in times.items()}
    torch_s = min(med[k] for k in torch_paths)
    traffic = template.traffic(w, *inputs)
    return BenchResult(tuned_s=med["tuned"], torch_s=torch_s, default_s=med["default"], unit=traffic.unit,
                       tuned_rate=traffic.rate(med["tuned"]), torch_rate=traffic.rate(torch_s),
                       config=str(tuned.config), baselines=tuple((k, med[k]) for k in torch_paths))


def format_result(task: Task, r: BenchResult) -> str:
    return "\n".join([
        f"{task.op} on {task.device.name}: {task.workload_key}",
        f"  best config      {r.config}",
        f"  tuned            {r.tuned_s * 1e3:9.3f} ms  {r.tuned_rate:8.2f} {r.unit}",
        *(f"  {name:<16s} {t * 1e3:9.3f} ms" for name, t in r.baselines),
        f"  untuned default  {r.default_s * 1e3:9.3f} ms",
        f"  speed-up vs fastest torch path {r.speedup_vs_torch:.2f}x ({r.torch_rate:.2f} {r.unit}), "
        f"vs untuned default {r.speedup_vs_default:.2f}x",
    ])
