"""Side-by-side benchmark of one task: the best logged kernel, PyTorch, the untuned default, and the roofline.

Every contender is timed by the measurement core (`runtime.time_cpu`, one `Timing`), the kernels through the
`runtime.BoundKernel` call path the tuner records. PyTorch is timed twice on the same inputs (made from the
workload and seed, cycled through the template's timed input sets as the kernels are): in a child process that
never imports TVM (`bench_child`: no TVM thread pool competes for the cores; the headline `torch_s`), and in
this process next to the TVM kernels (`torch_s_in_process`).
Rounds interleave so that drift hits all alike: each round times tuned, default and PyTorch here, then the
child's round of PyTorch while this process waits. Outputs are checked to agree before any timing. The
roofline is the kernel's share of this machine's measured limit (`roofline`).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from . import roofline, runtime
from .bench_child import cycled_paths, median_time
from .kernel import Kernel, best_record
from .runtime import Timing
from .task import Task
from .tuning_log import TuningLog

BENCH_TIMING = Timing(number=1, repeat=5, min_repeat_ms=100.0)  # ~0.5 s per contender per round
ORDER = ("per round: tuned, default, torch in-process, then torch isolated (child process, this one idle), then "
         "the roof")
_KEYS = {"GB/s": "gbps", "GFLOPS": "gflops", "GOPS": "gops"}


@dataclass(frozen=True)
class BenchResult:
    tuned_s: float
    default_s: float
    unit: str
    config: str
    baselines_isolated: dict[str, float]  # PyTorch path -> median seconds, timed without TVM in the process
    baselines_in_process: dict[str, float]  # the same paths timed here, next to the TVM kernels
    rate_per_s: float  # the template's work per call (bytes or ops) / 1e9: rate = rate_per_s / seconds
    roof: roofline.Roof | None = None
    roof_error: str | None = None  # why there is no roofline (no compiler, a GPU ...)
    isolated_tvm_imported: bool = False  # the child's own report (True would make torch_s_isolated unfair)
    rounds: int = 0
    torch_process: str = "isolated"  # which figure torch_s and speedup_vs_torch use

    @property
    def torch_s_isolated(self) -> float:
        return min(self.baselines_isolated.values())

    @property
    def torch_s_in_process(self) -> float:
        return min(self.baselines_in_process.values())

    @property
    def torch_s(self) -> float:
        return self.torch_s_isolated if self.torch_process == "isolated" else self.torch_s_in_process

    @property
    def speedup_vs_torch(self) -> float:
        return self.torch_s / self.tuned_s

    @property
    def speedup_vs_default(self) -> float:
        return self.default_s / self.tuned_s

    def rate(self, seconds: float) -> float:
        return self.rate_per_s / seconds

    @property
    def roof_share(self) -> float | None:
        return None if self.roof is None else self.roof.share(self.rate(self.tuned_s))

    def to_json(self) -> dict[str, Any]:
        key = _KEYS[self.unit]
        roof = None if self.roof is None else {**self.roof.to_json(), "share": self.roof_share}
        return {"tuned_s": self.tuned_s, "default_s": self.default_s, "torch_s": self.torch_s,
                "torch_process": self.torch_process, "torch_s_isolated": self.torch_s_isolated,
                "torch_s_in_process": self.torch_s_in_process, "speedup_vs_torch": self.speedup_vs_torch,
                "speedup_vs_torch_in_process": self.torch_s_in_process / self.tuned_s,
                "speedup_vs_default": self.speedup_vs_default, key: self.rate(self.tuned_s),
                f"torch_{key}": self.rate(self.torch_s), "unit": self.unit, "config": self.config,
                "baselines_isolated": self.baselines_isolated, "baselines_in_process": self.baselines_in_process,
                "isolated_tvm_imported": self.isolated_tvm_imported, "rounds": self.rounds, "order": ORDER,
                "roofline": roof, "roofline_error": self.roof_error}


class IsolatedTorch:
    """The child process timing PyTorch's paths: started early (its setup overlaps our compiles), one round
    per `round()` call, while this process waits."""

    def __init__(self, task: Task, seed: int, timing: Timing, torch_threads: int):
        child = Path(__file__).with_name("bench_child.py")
        code = f"import runpy; runpy.run_path({str(child)!r}, run_name='__main__')"
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        timing_json = {k: getattr(timing, k) for k in ("number", "repeat", "min_repeat_ms", "seed")}
        self._send(json.dumps({"op": task.op, "workload": task.workload.to_json(), "seed": seed,
                               "timing": timing_json, "torch_threads": torch_threads,
                               "sys_path": [p for p in sys.path if p]}))
        self.tvm_imported = False
        self.names: list[str] | None = None

    def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def _reply(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            err = (self.proc.stderr.read() if self.proc.stderr else "").strip().splitlines()
            raise RuntimeError("the isolated PyTorch process failed: " + " | ".join(err[-3:]))
        msg = json.loads(line)
        self.tvm_imported = self.tvm_imported or bool(msg["tvm_imported"])
        return msg

    def ready(self) -> list[str]:
        if self.names is None:
            self.names = list(self._reply()["ready"])
        return self.names

    def round(self) -> dict[str, float]:
        self.ready()
        self._send("round")
        return {k: float(v) for k, v in self._reply()["medians"].items()}

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # type: ignore[union-attr]
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def _table_shape(inputs: tuple[Any, ...]) -> tuple[int, ...]:
    """(rows, fp32 words per row) of the largest input: the table a gather-bound (GB/s) kernel reads rows of,
    in the roof's fp32 terms (a table of fp16 or int8 rows gathers its bytes, not dim floats, per row)."""
    tensors = [t for x in inputs for t in (x if isinstance(x, (list, tuple)) else (x,)) if hasattr(t, "numel")]
    if not tensors:
        return ()
    table = max(tensors, key=lambda t: t.numel() * t.element_size())
    if table.dim() < 2:
        return tuple(table.shape)
    return (table.shape[0], max(1, table[0].numel() * table.element_size() // 4))


def gathered_stream(template: Any, w: Any, sets: Iterable[tuple[Any, ...]]) -> Any:
    """The rows the timed calls gather, set after set (the template's `gathered_rows`), for a roof that gathers
    the same ones; None where the template does not say."""
    rows_of = getattr(template, "gathered_rows", None)
    if rows_of is None:
        return None
    import numpy as np

    return np.concatenate([rows_of(w, *s) for s in sets])


def measure_roof(unit: str, inputs: tuple[Any, ...], fresh: bool = False, indices: Any = None
                 ) -> tuple[roofline.Roof | None, str | None]:
    """(roof, None), or (None, why not): a bench without a roofline still benches. `indices`: the rows a gather
    roof gathers (`gathered_stream`), else uniformly random ones."""
    try:
        return roofline.for_unit(unit, _table_shape(inputs), fresh, indices), None
    except (roofline.RooflineUnavailable, ValueError) as err:
        return None, str(err)


def bench(task: Task, logs: Iterable[str | Path] | TuningLog, seed: int = 0, rounds: int = 3, timing: Timing = BENCH_TIMING,
          roof: bool = True, include_stale: bool = False) -> BenchResult:
    if task.device.is_gpu:
        raise ValueError(f"bench times CPU kernels; for {task.device.name} use benchmarks/gpu_check.py")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    import torch

    template, w = task.template, task.workload
    rec = best_record(task, logs, include_stale)
    child = IsolatedTorch(task, seed, timing, torch.get_num_threads())
    try:
        data = runtime.TaskData(template, w, seed, "cpu")
        kernels = {"tuned": Kernel(task, task.space.from_json(rec.config), validate=False),
                   "default": Kernel(task, task.space.default(), validate=False)}
        for name, k in kernels.items():
            why = runtime.mismatch(k.bound(*data.inputs), data.expected)
            if why is not None:
                raise AssertionError(f"the {name} kernel disagrees with PyTorch: {why}")
        paths = cycled_paths(template, w, data.sets, runtime)
        inputs = data.inputs
        contenders: dict[str, Callable[[], Any]] = {
            **{name: data.calls(k.bound) for name, k in kernels.items()}, **paths}
        if set(child.ready()) != set(paths):
            raise RuntimeError(f"the isolated process prepared {child.ready()}, this one {list(paths)}")
        times: dict[str, list[float]] = {k: [] for k in contenders}
        isolated: dict[str, list[float]] = {k: [] for k in paths}
        traffic = template.traffic(w, *inputs)
        stream = gathered_stream(template, w, data.sets) if roof and traffic.unit == "GB/s" else None
        roofs: list[roofline.Roof] = []
        why = None if roof else "not measured (roof=False)"
        for _ in range(rounds):
            for name, fn in contenders.items():
                times[name].append(median_time(fn, timing, runtime))
            for name, t in child.round().items():
                isolated[name].append(t)
            if why is None:  # the roof in every round, beside the kernels: a shared machine's bandwidth moves
                found, why = measure_roof(traffic.unit, inputs, fresh=True, indices=stream)
                roofs += [found] if found is not None else []
    finally:
        child.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    found = roofline.median_of(roofs) if roofs and why is None else None
    return BenchResult(tuned_s=med["tuned"], default_s=med["default"], unit=traffic.unit,
                       config=str(kernels["tuned"].config),
                       baselines_isolated={k: statistics.median(v) for k, v in isolated.items()},
                       baselines_in_process={k: med[k] for k in paths}, rate_per_s=traffic.rate(1.0),
                       roof=found, roof_error=why, isolated_tvm_imported=child.tvm_imported, rounds=rounds)


def format_result(task: Task, r: BenchResult) -> str:
    """The bench as text: one line per contender, PyTorch's two processes side by side, then the roofline."""
    width = max(16, *(len(n) for n in r.baselines_isolated))
    lines = [f"{task.op} on {task.device.name}: {task.workload_key}",
             f"  best config      {r.config}",
             f"  {'':<{width}s} {'ms':>9s}  {r.unit:>8s}",
             f"  {'tuned':<{width}s} {r.tuned_s * 1e3:9.3f}  {r.rate(r.tuned_s):8.2f}",
             f"  {'untuned default':<{width}s} {r.default_s * 1e3:9.3f}  {r.rate(r.default_s):8.2f}",
             f"  {'PyTorch paths':<{width}s} {'isolated':>9s}  in-process (next to TVM), ms"]
    for name, t in r.baselines_isolated.items():
        lines.append(f"  {name:<{width}s} {t * 1e3:9.3f}  {r.baselines_in_process[name] * 1e3:9.3f}")
    lines.append(f"  speed-up vs fastest torch path {r.speedup_vs_torch:.2f}x isolated "
                 f"({r.rate(r.torch_s):.2f} {r.unit}), {r.torch_s_in_process / r.tuned_s:.2f}x in-process; "
                 f"vs untuned default {r.speedup_vs_default:.2f}x")
    if r.roof is not None:
        spread = (f"; {min(r.roof.samples):.1f}-{max(r.roof.samples):.1f} over the rounds"
                  if len(r.roof.samples) > 1 else "")
        lines.append(f"  roofline  {r.roof_share:.0%} of measured {r.roof.name} "
                     f"({r.rate(r.tuned_s):.1f} of {r.roof.value:.1f} {r.unit}{spread})"
                     + ("; above it: rows reused within the call hit in cache (the roof's rows are uniform)"
                        if r.roof_share > 1 and r.roof.name == "random-gather bandwidth" else ""))
    lines.append(f"  ({r.rounds} rounds, {ORDER})")
    return "\n".join(lines)


def median_seconds(fn: Callable[[], Any], min_run_time: float) -> float:
    """Median per-call seconds of `fn` over about `min_run_time` s, by the measurement core's timer (for the
    examples and benchmarks that time their own contenders)."""
    return median_time(fn, Timing(number=1, repeat=5, min_repeat_ms=min_run_time * 1e3 / 5), runtime)
