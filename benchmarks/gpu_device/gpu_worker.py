"""The GPU check's measuring process: one per batch, started (and restarted) by check.py.

    python gpu_worker.py --probe OUT.json [--cubin FILE]      the GPU, a copy's bandwidth, whether cubins load
    python gpu_worker.py BATCH --progress FILE --deadline T   measure one batch's candidates and PyTorch's paths

A batch is measured in this order: the task's inputs and reference (`setup`), PyTorch's paths, then the
candidates in the batch's order (default, hand-picked, sampled) until the deadline. Every item's outcome goes to
the progress file as it ends, and the item being measured is named there (`current`) while it runs, so the
supervisor can blame a hang or a crash on it and start a new worker for the rest. A CUDA error that leaves the
context unusable ends this process (exit 3) once it is recorded.

Each candidate is loaded by TVM's runtime or, where that fails, by the fallback launcher (cuda_launcher.py),
called once and judged against the reference (autotune_runtime's rule), then timed as captured in CUDA graphs,
so the launch costs nothing: `cold` replays calls each after an L2 flush, timed between event nodes around the
call alone; `hot` replays back-to-back calls on the same inputs. Where a graph cannot be captured, CUDA events
around eager calls are used instead (`method: events`: launches included).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import device_env  # noqa: E402

COLD_CALLS = 20  # calls per cold graph, each after its own L2 flush
REPEATS = 5  # replays of each graph: the costs of a record
HOT_GRAPH_S = 2e-3  # a hot graph holds about this much work (10 to 1000 calls)
CUDA_DEAD = 3  # exit status: a CUDA error left the context unusable (the error is recorded)
SETUP_FAILED = 4  # exit status: the task's inputs or reference could not be made (recorded as `setup`)


class ContextLost(RuntimeError):
    """The CUDA context is unusable after an error: this process must end."""


def cuda_alive() -> bool:
    import torch

    try:
        torch.cuda.synchronize()
        return torch.ones(1, device="cuda").add_(1).item() == 2.0
    except Exception:  # noqa: BLE001 -- any failure here means the context is gone
        return False


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[-1][:400] if text else ''}"


# ---- timing ------------------------------------------------------------------------------------------------
def time_call(run: Callable[[], Any], flush: Any) -> dict[str, Any]:
    """{"cold": seconds per call after an L2 flush, per repeat, "hot": back to back, "method": ...}. `flush` is
    a buffer twice the L2's size. Cold calls are timed as the tuner's runners time them
    (autotune_runtime.time_cuda_graph; where the call cannot be captured, time_cuda_events: an event pair
    around each eager call)."""
    import autotune_runtime as rt

    out: dict[str, Any] = {}
    rt.warm_up_cuda(run)
    try:
        out["cold"], out["method"] = rt.time_cuda_graph(run, COLD_CALLS, REPEATS, flush), "graph"
    except Exception as err:  # noqa: BLE001 -- not capturable (a sync inside, an old torch): eager calls instead
        _require_context()
        cold = rt.time_cuda_events(run, rt.Timing(number=COLD_CALLS, repeat=REPEATS, min_repeat_ms=0.0), flush)
        out["cold"], out["method"], out["why_not_graph"] = cold, "events", _short(err)
    calls = max(10, min(1000, int(HOT_GRAPH_S / max(statistics.median(out["cold"]), 1e-7))))
    try:
        out["hot"] = _hot_graph(run, calls) if out["method"] == "graph" else _hot_events(run, calls)
    except Exception as err:  # noqa: BLE001
        _require_context()
        out["hot"], out["method"], out["why_not_graph"] = _hot_events(run, calls), "events", _short(err)
    return out


def _require_context() -> None:
    if not cuda_alive():
        raise ContextLost("the CUDA context is unusable")


def _hot_graph(run: Callable[[], Any], calls: int) -> list[float]:
    import torch

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        for _ in range(calls):
            run()
    graph.replay()  # the first replay uploads the graph
    return _events_around(graph.replay, 1, calls)


def _events_around(fn: Callable[[], Any], times: int, calls: int) -> list[float]:
    import torch

    costs = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(times):
            fn()
        end.record()
        torch.cuda.synchronize()
        costs.append(start.elapsed_time(end) / 1e3 / calls)
    return costs


def _hot_events(run: Callable[[], Any], calls: int) -> list[float]:
    return _events_around(run, calls, calls)


# ---- loading a candidate -----------------------------------------------------------------------------------
@dataclass
class Loaders:
    """How this worker loads candidates: TVM's runtime first ("auto"), and once TVM fails where the fallback
    launcher works, the fallback for the rest of the batch."""

    kernels: Path
    order: list[str]
    tvm_error: str | None = None
    driver: Any = None
    notes: list[str] = field(default_factory=list)

    def load(self, how: str, cand: dict[str, Any]) -> Any:
        if how == "tvm":
            import tvm_ffi

            return tvm_ffi.load_module(str(self.kernels / cand["file"]))["main"]
        import cuda_launcher

        if "launch" not in cand:
            raise RuntimeError(f"no fallback launch was recorded: {cand.get('launch_error', '?')}")
        if self.driver is None:
            self.driver = cuda_launcher.Driver()
        return cuda_launcher.load(self.kernels, cand, self.driver)

    def prefer_fallback(self, why: str) -> None:
        if self.order[:1] == ["tvm"] and "fallback" in self.order:
            self.order = ["fallback"]
            self.tvm_error = why
            self.notes.append(f"TVM's runtime failed where the fallback launcher worked ({why}); the fallback "
                              "loads the rest of this batch")


def measure_candidate(cand: dict[str, Any], data: Any, template: Any, loaders: Loaders, flush: Any,
                      rt: Any) -> dict[str, Any]:
    """One candidate's outcome: costs (cold), hot costs, method and loader; or an error kind and message, with
    `context_lost` where a CUDA error left the context unusable (the process must end once it is recorded)."""
    import torch
    from search_spaces.space import Config

    config = Config(tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in cand["config"].items()))
    errors = []
    for how in list(loaders.order):
        try:
            func = loaders.load(how, cand)
        except Exception as err:  # noqa: BLE001 -- this loader's failure; the next may work
            errors.append(f"{how} load: {_short(err)}")
            continue
        bound = rt.BoundKernel(template, data.workload, config, func, on_gpu=how == "tvm")  # the fallback
        try:  # launches on the current stream itself, with no tvm_ffi stream context
            out = bound(*data.inputs)
            torch.cuda.synchronize()
        except Exception as err:  # noqa: BLE001
            errors.append(f"{how}: {_short(err)}")
            if not cuda_alive():
                return {"error_kind": "runtime", "error": "; ".join(errors), "loader": how, "context_lost": True}
            continue
        why = rt.mismatch(out, data.expected)
        if why is not None:
            return {"error_kind": "wrong", "error": why, "loader": how}
        if errors:
            loaders.prefer_fallback(errors[-1])
        args, _ = bound.arguments(*data.inputs)
        run = (lambda: rt.call(func, args, True)) if how == "tvm" else (lambda: func(*args))
        try:
            timed = time_call(run, flush)
        except Exception as err:  # noqa: BLE001 -- a call that worked once failed while timed
            return {"error_kind": "runtime", "error": f"timing: {_short(err)}", "loader": how,
                    "context_lost": isinstance(err, ContextLost) or not cuda_alive()}
        return {"costs": timed["cold"], "hot_costs": timed["hot"], "method": timed["method"], "loader": how,
                "error_kind": None, "error": None, **({"why_not_graph": timed["why_not_graph"]}
                                                      if "why_not_graph" in timed else {})}
    return {"error_kind": "runtime", "loader": None,
            "error": "; ".join(errors) or "no loader: TVM's runtime did not load (see tvm_runtime) and --loader tvm"}


# ---- one batch -----------------------------------------------------------------------------------------------
class Progress:
    """The batch's progress file: what check.py reads to see what is done and what is running."""

    def __init__(self, path: Path):
        self.path = path
        self.state = device_env.read_json(path) if path.exists() else {"items": {}, "current": None}

    def start(self, key: str) -> None:
        self.state["current"] = key
        device_env.write_json(self.path, self.state)

    def done(self, key: str, outcome: dict[str, Any]) -> None:
        self.state["items"][key] = {**outcome, "timestamp": time.time()}
        self.state["current"] = None
        device_env.write_json(self.path, self.state)

    def set(self, **fields: Any) -> None:
        self.state.update(fields)
        device_env.write_json(self.path, self.state)


def measure_batch(batch: Path, progress: Progress, deadline: float, loader: str, log: Any) -> int:
    """Measure what the progress file lacks until the deadline; the exit status (0, CUDA_DEAD, SETUP_FAILED)."""
    import torch

    import autotune_runtime as rt
    import search_spaces

    spec = device_env.read_json(batch / device_env.BATCH)
    template = search_spaces.get(spec["op"])
    workload = template.Workload.from_json(spec["workload"])
    order = {"auto": ["tvm", "fallback"], "tvm": ["tvm"], "fallback": ["fallback"]}[loader]
    try:
        rt.load_runtime(str(HERE / "lib"), cuda=True)
    except Exception as err:  # noqa: BLE001 -- TVM's runtime is out; the fallback may still run everything
        order = [o for o in order if o != "tvm"]
        progress.set(tvm_runtime=_short(err))
    loaders = Loaders(device_env.unpack_kernels(batch), order)  # empty: every candidate fails to load, saying so
    if progress.state.get("fallback_only"):
        loaders.order = ["fallback"]
    progress.start("setup")
    try:
        data = rt.TaskData(template, workload, spec["seed"], "cuda")
        l2 = rt.l2_bytes_here(spec.get("l2_bytes", 0))
        flush = torch.empty(max(2 * l2, 1 << 20), dtype=torch.uint8, device="cuda")
        traffic = template.traffic(workload, *data.inputs)
    except Exception as err:  # noqa: BLE001
        progress.set(setup=_short(err), current=None)
        return SETUP_FAILED
    progress.set(setup="ok", current=None, traffic={"bytes": traffic.bytes, "ops": traffic.ops, "unit": traffic.unit})
    try:
        baselines = getattr(template, "baselines", None)
        paths = (baselines(workload, *data.inputs) if baselines else {}) or {
            "reference": lambda: template.reference(workload, *data.inputs)}
    except Exception as err:  # noqa: BLE001 -- PyTorch's side failed to set up; the candidates still run
        paths = {}
        if "torch:baselines" not in progress.state["items"]:
            progress.done("torch:baselines", {"error": _short(err)})
    for name, fn in paths.items():
        key = f"torch:{name}"
        if key in progress.state["items"]:
            continue
        progress.start(key)
        try:
            timed = time_call(fn, flush)
            outcome = {"costs": timed["cold"], "hot_costs": timed["hot"], "method": timed["method"], "error": None}
        except ContextLost as err:
            progress.done(key, {"error": str(err)})
            return CUDA_DEAD
        except Exception as err:  # noqa: BLE001 -- one path's failure; the others and the candidates go on
            outcome = {"error": _short(err)}
            if not cuda_alive():
                progress.done(key, outcome)
                return CUDA_DEAD
        progress.done(key, outcome)
    for cand in spec["candidates"]:
        key = f"c{cand['id']}"
        if key in progress.state["items"]:
            continue
        if time.time() >= deadline:
            break
        progress.start(key)
        t0 = time.perf_counter()
        outcome = measure_candidate(cand, data, template, loaders, flush, rt)
        lost = outcome.pop("context_lost", False)
        progress.done(key, outcome)
        print(f"{batch.name} {key}: {outcome['error_kind'] or 'ok'} via {outcome['loader']} in "
              f"{time.perf_counter() - t0:.2f} s" + (f": {outcome['error']}" if outcome["error"] else ""),
              file=log, flush=True)
        if loaders.notes:
            progress.set(notes=progress.state.get("notes", []) + loaders.notes, tvm_error=loaders.tvm_error,
                         fallback_only=loaders.order == ["fallback"])
            loaders.notes = []
        if lost:
            return CUDA_DEAD
    return 0


# ---- the probe -------------------------------------------------------------------------------------------------
def probe(cubin: Path | None) -> dict[str, Any]:
    """The GPU, its runtime's versions, a device-to-device copy's bandwidth (the memory roof this run can
    reach), and whether the driver loads a prepared cubin."""
    import platform

    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "torch_cuda": torch.version.cuda}
    if not torch.cuda.is_available():
        info["error"] = "PyTorch sees no CUDA GPU here"
        return info
    p = torch.cuda.get_device_properties(0)
    info.update(gpu=p.name, capability=f"sm_{p.major}{p.minor}", sms=p.multi_processor_count,
                l2_bytes=int(getattr(p, "L2_cache_size", 0)), memory_bytes=int(p.total_memory))
    try:  # the CUDA version the driver supports (torch 2.11 has no call for it)
        import ctypes

        version = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) == 0:
            info["driver"] = f"CUDA {version.value // 1000}.{version.value % 1000 // 10}"
    except (OSError, AttributeError):  # informational
        pass
    n = 1 << 30
    src, dst = torch.empty(n, dtype=torch.uint8, device="cuda"), torch.empty(n, dtype=torch.uint8, device="cuda")
    src.fill_(1)
    dst.copy_(src)
    copies = _events_around(lambda: dst.copy_(src), 10, 10)
    info["copy_bytes_per_s"] = 2 * n / statistics.median(copies)  # each copy reads and writes n bytes
    del src, dst
    if cubin is not None:
        import cuda_launcher

        try:
            cuda_launcher.Driver().load(cubin.read_bytes())
            info["cubin_loads"] = True
        except cuda_launcher.CudaError as err:
            info["cubin_loads"], info["cubin_error"], info["cubin_error_code"] = False, str(err), err.code
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("batch", nargs="?", type=Path)
    p.add_argument("--probe", type=Path, help="write the probe's findings to this file and exit")
    p.add_argument("--cubin", type=Path, help="(--probe) a prepared cubin to try loading")
    p.add_argument("--progress", type=Path)
    p.add_argument("--deadline", type=float, default=float("inf"), help="epoch seconds: start no candidate after")
    p.add_argument("--loader", choices=("auto", "tvm", "fallback"), default="auto")
    p.add_argument("--log", type=Path, help="append a line per candidate here (default: stderr)")
    args = p.parse_args(argv)
    if args.probe:
        info = probe(args.cubin)
        device_env.write_json(args.probe, info)
        return 2 if "error" in info else 0
    if args.batch is None or args.progress is None:
        p.error("a batch directory and --progress are needed (or --probe)")
    log = open(args.log, "a") if args.log else sys.stderr
    return measure_batch(args.batch, Progress(args.progress), args.deadline, args.loader, log)


if __name__ == "__main__":
    sys.exit(main())
