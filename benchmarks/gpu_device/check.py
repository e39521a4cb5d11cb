"""The GPU check, on the GPU machine: every prepared candidate checked and timed, PyTorch's paths timed beside
them, a table per operator, and the measurements written for `autotune` to ingest as records.

    python DIR/check.py [--budget-s 540] [--timeout-s 20] [--ops qmatmul,interaction] [--out $OUT]

Needs PyTorch with a CUDA GPU; TVM is not needed (its runtime libraries travel in DIR/lib, apache-tvm-ffi in
DIR/wheels, unpacked here without pip). Run on the device machine as
    run(carry=["gpu_check"], command="python3 -u gpu_check/check.py")        (see benchmarks/GPU.md)

What it does, all within --budget-s (default: a 600 s command with a minute to spare):
  1. a probe process: the GPU, a device-to-device copy's bandwidth (this run's memory roof), whether the driver
     loads the prepared cubins (if not, they are compiled again from their CUDA C with this machine's nvcc);
  2. each batch (one operator at one shape) in a worker process of its own (gpu_worker.py): the task's inputs
     and reference, PyTorch's paths, then the candidates, each checked against the reference and timed in CUDA
     graphs, L2 flushed (cold) and hot. A candidate may run --timeout-s; a worker that hangs is killed and one
     that dies (a crash, a CUDA error that poisons its context) is replaced, the candidate it was on blamed;
     each batch gets an equal share of the time left, so a slow operator cannot starve the others;
  3. prints per batch: candidates built / correct, the best (cold, hot) against PyTorch's fastest path, the
     speed-up, and the share of the roof (bytes moved per second against the copy's bandwidth and the
     datasheet's, or int8 tensor-core operations against the datasheet's peak);
  4. writes four files to OUT/gpu_check/ (the device tool brings back at most eight): results.json (the probe
     and every batch: what `benchmarks/gpu_check.py ingest` turns into records), summary.txt (the table),
     check.log (this output) and worker.log (a line per candidate). The workers' progress files stay in DIR/.work
     (a second run with the same DIR resumes from them).
Output is unbuffered and results.json is rewritten as each batch ends: a run cut short keeps what it finished.
Exit status 0 if some candidate was measured, 1 if none, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import device_env  # noqa: E402

MAX_TIMEOUT_S = 20.0  # a candidate's limit: no kernel of these shapes needs a second, a hang must not cost more
REPORT_RESERVE_S = 15.0  # kept back from the budget for the table and the files
PROBE_TIMEOUT_S = 120.0
WORKER = HERE / "gpu_worker.py"
NOT_MEASURED = "not measured: the time budget ran out"
RESULTS = "results.json"


def _seconds(limit: float | None = None):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
        if not value > 0 or (limit is not None and value > limit):
            raise argparse.ArgumentTypeError(f"must be in (0, {limit:g}]" if limit else "must be positive")
        return value
    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget-s", type=_seconds(), default=540.0,
                   help="the whole run's time, probe and report included (default 540: a 600 s command)")
    p.add_argument("--timeout-s", type=_seconds(MAX_TIMEOUT_S), default=MAX_TIMEOUT_S,
                   help=f"seconds one candidate (or PyTorch path) may run before it counts as hung "
                        f"(<= {MAX_TIMEOUT_S:g})")
    p.add_argument("--setup-timeout-s", type=_seconds(), default=120.0,
                   help="seconds a worker may take to start and make its task's inputs and reference")
    p.add_argument("--ops", help="comma-separated operators to measure (default: all prepared)")
    p.add_argument("--loader", choices=("auto", "tvm", "fallback"), default="auto",
                   help="auto: TVM's runtime, the fallback launcher where that fails; or only one of them")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu_check_out"),
                   help="where gpu_check/ with the results goes (default: $OUT, else ./gpu_check_out)")
    args = p.parse_args(argv)
    plan = device_env.read_json(HERE / device_env.PLAN)
    known = {device_env.read_json(HERE / b / device_env.BATCH)["op"] for b in plan["batches"]}
    args.op_list = [o.strip() for o in args.ops.split(",") if o.strip()] if args.ops else sorted(known)
    unknown = sorted(set(args.op_list) - known)
    if unknown:
        p.error(f"--ops: {', '.join(unknown)} not prepared here (prepared: {', '.join(sorted(known))})")
    return args


# ---- running workers -----------------------------------------------------------------------------------------
def run_worker(cmd: list[str], progress: Path, timeout: float, setup_timeout: float, hard_deadline: float
               ) -> int | str | None:
    """Run one worker: None once it exits 0, its exit status if it fails, "timeout" if it was killed because the
    item it named in the progress file ran past `timeout` (or its setup past `setup_timeout`), "deadline" if it
    was killed at `hard_deadline`. An item's start is the progress file's last write (the worker writes it as
    items start and end)."""
    proc = subprocess.Popen(cmd)
    started = time.time()
    while True:
        try:
            code = proc.wait(timeout=0.2)
            return None if code == 0 else code
        except subprocess.TimeoutExpired:
            pass
        try:
            since = max(started, progress.stat().st_mtime)
            current = device_env.read_json(progress).get("current")
        except (OSError, ValueError):  # not written yet
            since, current = started, "setup"
        limit = setup_timeout if current in (None, "setup") else timeout
        now = time.time()
        if now - since > limit or now > hard_deadline:
            proc.kill()
            proc.wait()
            return "timeout" if now - since > limit else "deadline"


def measure_batch(batch: Path, work: Path, deadline: float, args: argparse.Namespace, log: Path) -> dict[str, Any]:
    """The batch's progress once every item is done, the deadline has passed or its setup failed twice."""
    progress = work / f"{batch.name}.progress.json"
    setup_failures, last_error = 0, ""
    while True:
        state = device_env.read_json(progress) if progress.exists() else {"items": {}}
        pending = [c for c in device_env.read_json(batch / device_env.BATCH)["candidates"]
                   if f"c{c['id']}" not in state["items"]]
        if not pending or time.time() >= deadline or setup_failures >= 2:
            break
        before = len(state["items"])
        cmd = [sys.executable, "-u", str(WORKER), str(batch), "--progress", str(progress), "--deadline",
               str(deadline), "--loader", args.loader, "--log", str(log)]
        outcome = run_worker(cmd, progress, args.timeout_s, args.setup_timeout_s, deadline + args.timeout_s)
        if outcome == "deadline":  # the batch's time is up: what was running is not to blame, and stays unmeasured
            break
        state = device_env.read_json(progress) if progress.exists() else {"items": {}, "current": "setup"}
        current = state.get("current")
        if outcome is None and len(state["items"]) == before:  # it ended well and did nothing: its time was up
            break
        if outcome is not None and current not in (None, "setup"):  # the item it was on is to blame
            kind = "timeout" if outcome == "timeout" else "crash"
            why = (f"no result within {args.timeout_s:g} s (hang?)" if outcome == "timeout" else
                   f"the measuring process died (exit {outcome})")
            state["items"][current] = {"error_kind": kind, "error": why, "costs": [], "timestamp": time.time()}
            state["current"] = None
            device_env.write_json(progress, state)
        elif outcome is not None and len(state["items"]) == before:
            setup_failures += 1
            last_error = state.get("setup") if state.get("setup") not in (None, "ok") else (
                f"setup took over {args.setup_timeout_s:g} s" if outcome == "timeout" else f"worker exit {outcome}")
    state = device_env.read_json(progress) if progress.exists() else {"items": {}}
    if setup_failures >= 2:
        state["setup"] = last_error
    return state


# ---- results -----------------------------------------------------------------------------------------------
def batch_results(batch: Path, state: dict[str, Any], probe: dict[str, Any]) -> dict[str, Any]:
    """What `gpu_check.py ingest` reads: the batch's record fields and every candidate's outcome."""
    spec = device_env.read_json(batch / device_env.BATCH)
    left = f"setup failed: {state['setup']}" if state.get("setup") not in (None, "ok") else NOT_MEASURED
    candidates = []
    for cand in spec["candidates"]:
        item = state["items"].get(f"c{cand['id']}") or {"error_kind": "harness", "error": left, "costs": []}
        candidates.append({k: cand[k] for k in ("id", "config", "config_key", "build_s")} |
                          {"costs": item.get("costs") or [], **{k: v for k, v in item.items() if k != "costs"}})
    pytorch = {key.removeprefix("torch:"): item for key, item in state["items"].items() if key.startswith("torch:")}
    fields = ("op", "shape", "workload", "workload_key", "device", "target", "tvm_version", "template_version",
              "roof", "failed")
    return {"format": 1, "batch": batch.name, **{k: spec[k] for k in fields}, "gpu": probe.get("gpu"),
            "setup": state.get("setup"), "traffic": state.get("traffic"), "notes": state.get("notes", []),
            "tvm_runtime": state.get("tvm_runtime"), "pytorch": pytorch, "candidates": candidates}


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2]


def summarize(res: dict[str, Any], probe: dict[str, Any], plan: dict[str, Any]) -> list[str]:
    """The batch's lines of the table."""
    good = [c for c in res["candidates"] if c["error_kind"] is None and c["costs"]]
    kinds: dict[str, int] = {}
    for c in res["candidates"]:
        kinds[c["error_kind"] or "ok"] = kinds.get(c["error_kind"] or "ok", 0) + 1
    built = len(res["candidates"])
    head = (f"{res['op']} [{res['shape']}]\n    built {built}/{built + len(res['failed'])}, correct {len(good)}"
            f"/{built} ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})")
    lines = [head]
    if res.get("setup") not in (None, "ok"):
        lines.append(f"    setup failed: {res['setup']}")
    torch_paths = {n: p for n, p in res["pytorch"].items() if p.get("costs")}
    for n, p in res["pytorch"].items():
        if not p.get("costs"):
            lines.append(f"    PyTorch {n}: {p.get('error_kind') or 'error'}: {p.get('error')}")
    if not good:
        return lines
    best = min(good, key=lambda c: _median(c["costs"]))
    cold, hot = _median(best["costs"]), _median(best["hot_costs"])
    lines.append(f"    best c{best['id']}: {cold * 1e3:.4f} ms cold, {hot * 1e3:.4f} ms hot ({best['method']}, "
                 f"{best['loader']})  {best['config']}")
    t_cold = float("nan")
    if torch_paths:
        name, fastest = min(torch_paths.items(), key=lambda kv: _median(kv[1]["costs"]))
        t_cold, t_hot = _median(fastest["costs"]), _median(fastest["hot_costs"])
        lines.append(f"    PyTorch {name}: {t_cold * 1e3:.4f} ms cold, {t_hot * 1e3:.4f} ms hot ({fastest['method']})"
                     f"  -> speed-up {t_cold / cold:.2f}x cold, {t_hot / hot:.2f}x hot")
    traffic = res.get("traffic")
    if traffic:
        roofs = plan["roofs"]
        if res["roof"] == "int8_tc":
            rate = traffic["ops"] / cold
            lines.append(f"    roof: {rate / 1e12:.1f} int8 TOPS = {rate / roofs['peak_int8_tc']:.1%} of the "
                         f"{roofs['peak_int8_tc'] / 1e12:.0f} TOPS tensor-core peak (PyTorch "
                         f"{traffic['ops'] / t_cold / 1e12:.1f})")
        else:
            rate = traffic["bytes"] / cold
            copy = probe.get("copy_bytes_per_s") or float("nan")
            lines.append(f"    roof: {rate / 1e12:.2f} TB/s moved = {rate / copy:.0%} of this run's copy "
                         f"({copy / 1e12:.2f} TB/s), {rate / roofs['bandwidth']:.0%} of "
                         f"{roofs['bandwidth'] / 1e12:.1f} TB/s (PyTorch {traffic['bytes'] / t_cold / 1e12:.2f})")
    for note in res.get("notes", []):
        lines.append(f"    note: {note}")
    return lines


# ---- cubins this driver cannot load ----------------------------------------------------------------------------
def compile_locally(batches: list[Path], arch: str, deadline: float) -> tuple[int, list[str]]:
    """Every candidate's CUDA C compiled by this machine's nvcc (all cores), where the prepared cubins do not
    load: (compiled, failures)."""
    import cuda_launcher

    jobs = []
    for batch in batches:
        kernels = device_env.unpack_kernels(batch)
        jobs += [(kernels, c["launch"]) for c in device_env.read_json(batch / device_env.BATCH)["candidates"]
                 if "launch" in c]

    def one(job: tuple[Path, dict[str, Any]]) -> str | None:
        if time.time() > deadline:
            return "skipped: out of time"
        try:
            cuda_launcher.compile_local(job[0], job[1], arch)
            return None
        except (subprocess.SubprocessError, OSError) as err:
            return f"{job[1]['source']}: {str(getattr(err, 'stderr', '') or err).strip()[-300:]}"

    with ThreadPoolExecutor(os.cpu_count() or 4) as pool:
        failures = [f for f in pool.map(one, jobs) if f]
    return len(jobs) - len(failures), failures


class Output:
    """What this run writes to OUT/gpu_check: its lines (also to stdout), results.json, summary.txt."""

    def __init__(self, out: Path):
        self.dir = out / "gpu_check"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log = open(self.dir / "check.log", "a")
        self.results: dict[str, Any] = {"format": 1, "probe": {}, "batches": []}

    def say(self, text: str) -> None:
        print(text, flush=True)
        print(text, file=self.log, flush=True)

    def add(self, res: dict[str, Any]) -> None:
        self.results["batches"].append(res)
        device_env.write_json(self.dir / RESULTS, self.results)


def run_probe(batches: list[Path], work: Path) -> dict[str, Any]:
    """The probe's findings (an "error" where there is no GPU to measure on)."""
    first = next(((b, c) for b in batches for c in device_env.read_json(b / device_env.BATCH)["candidates"]
                  if "launch" in c), None)
    path = work / "probe.json"
    path.unlink(missing_ok=True)
    cmd = [sys.executable, "-u", str(WORKER), "--probe", str(path)]
    if first is not None:
        cmd += ["--cubin", str(device_env.unpack_kernels(first[0]) / first[1]["launch"]["cubin"])]
    try:
        subprocess.run(cmd, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"the probe did not finish within {PROBE_TIMEOUT_S:g} s"}
    return device_env.read_json(path) if path.exists() else {"error": "the probe died (see above)"}


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    args = parse_args(argv)
    deadline = started + args.budget_s - REPORT_RESERVE_S
    plan = device_env.read_json(HERE / device_env.PLAN)
    output = Output(args.out)
    work = HERE / ".work"
    work.mkdir(exist_ok=True)
    os.environ["PYTHONUNBUFFERED"] = "1"
    device_env.unpack_wheels(HERE, HERE / ".site")  # workers inherit the path
    batches = [b for b in device_env.batches(HERE)
               if device_env.read_json(b / device_env.BATCH)["op"] in args.op_list]
    output.say(f"gpu_check: {len(batches)} batches prepared for {plan['device']} ({plan['card']}), budget "
               f"{args.budget_s:g} s, {args.timeout_s:g} s per candidate; results in {output.dir}")
    probe = output.results["probe"] = run_probe(batches, work)
    if "error" in probe:
        output.say(f"gpu_check: no GPU to measure on: {probe['error']} ({probe})")
        device_env.write_json(output.dir / RESULTS, output.results)
        (output.dir / "summary.txt").write_text(f"no GPU: {probe['error']}\n")
        return 1
    output.say(f"device: {probe['gpu']} ({probe['capability']}, {probe['sms']} SMs, L2 {probe['l2_bytes'] >> 20} "
               f"MiB), driver {probe.get('driver')}, torch {probe['torch']} (CUDA {probe['torch_cuda']}), Python "
               f"{probe['python']}; device-to-device copy {probe['copy_bytes_per_s'] / 1e12:.2f} TB/s")
    if probe.get("cubin_loads") is False:
        nvcc = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.path.exists(p)), None)
        output.say(f"the driver does not load the prepared cubins ({probe['cubin_error']}); "
                   + (f"compiling them again with {nvcc}" if nvcc else "no nvcc here to compile them again"))
        if nvcc:
            os.environ["PATH"] = os.pathsep.join([os.path.dirname(nvcc), os.environ.get("PATH", "")])
            done, failures = compile_locally(batches, probe["capability"], started + args.budget_s / 3)
            output.say(f"  {done} compiled, {len(failures)} failed" + "".join(f"\n    {f}" for f in failures[:5]))
    table = []
    for i, batch in enumerate(batches):
        share = max(0.0, deadline - time.time()) / (len(batches) - i)
        state = measure_batch(batch, work, time.time() + share, args, output.dir / "worker.log")
        res = batch_results(batch, state, probe)
        output.add(res)
        lines = summarize(res, probe, plan)
        output.say("\n".join(lines))
        table += lines
    (output.dir / "summary.txt").write_text("\n".join([f"{probe['gpu']}, copy {probe['copy_bytes_per_s'] / 1e12:.2f} "
                                                       f"TB/s, {time.time() - started:.0f} s"] + table) + "\n")
    measured = sum(c["error_kind"] is None for r in output.results["batches"] for c in r["candidates"])
    output.say(f"gpu_check: {measured} candidates measured in {time.time() - started:.0f} s; bring them home with\n"
               f"    python benchmarks/gpu_check.py ingest <OUT>/gpu_check/{RESULTS} --prepared <the prepared DIR>")
    return 0 if measured else 1


if __name__ == "__main__":
    sys.exit(main())
