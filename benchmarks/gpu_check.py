"""The GPU check: every operator's candidates built here for a GPU, measured there on a machine with PyTorch and
no TVM, and brought back as tuning records. Runbook and figures: benchmarks/GPU.md.

    python benchmarks/gpu_check.py prepare DIR [--candidates 64]            # here: build, record, pack
    python DIR/check.py                                                     # there (DIR/check.py --help)
    python benchmarks/gpu_check.py ingest OUT/gpu_check/results.json --prepared DIR [--log-dir logs/cuda]

`prepare` builds, for `cuda:sm_90`, each of the six operators at its DLRM shape (the tasks tune_model finds in
examples/dlrm.py) and at one other shape: the default config, hand-picked fast tilings (qmatmul's tensor-core
paths first), then configs sampled per code path, --candidates per task in that order (the order they are
measured in, so a run cut short has measured the likely best). It then runs the device-side chain on this
machine as far as it goes without a GPU (record_launches.py, with the device image's Python where this machine
has it): every library loaded by tvm_ffi from the carried wheel, called under a stub CUDA driver, its launches
recorded for the fallback launcher and repeated by it. Kernels are packed per batch (gzip); DIR then holds all
the device needs: the scripts of benchmarks/gpu_device/, TVM's runtime libraries, the wheels.

`ingest` appends the measurements to logs/<device kind>/<op>.jsonl as records (with the template version that
built them and, from DIR, their program features), so the cost model learns from them and `autotune export`
can ship them; results already in a log are not added twice.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable

ROOT = Path(__file__).resolve().parent.parent
DEVICE_SIDE = Path(__file__).resolve().parent / "gpu_device"
sys.path.insert(0, str(DEVICE_SIDE))

import device_env  # noqa: E402

DEVICE_PYTHON = (3, 12)  # the device image's Python: the wheels carried are for it
WHEELS = ("apache-tvm-ffi==" + device_env.TVM_FFI_VERSION, "typing_extensions==4.16.0")
FEATURES = "features.json.gz"  # host-side: each candidate's program features, for ingest
SIZE_LIMIT = 48 << 20  # what one `run` may carry with room to spare
OPS = ("embedding_bag", "batched_embedding_bag", "interaction", "qmatmul", "qmatmul_requant", "quantize_rows")

# examples/dlrm.py's model (26 Criteo tables capped at 200k rows, dim 64, batch 2048, 8 indices per bag; its int8
# MLPs) as tune_model splits it, then one other shape per operator (larger tables, dim 128, bigger matmuls)
CRITEO_ROWS_CAPPED = "+".join(str(min(r, 200_000)) for r in (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992, 5461306, 10, 5652,
    2173, 4, 7046547, 18, 15, 286181, 105, 142572))
SHAPES: dict[str, tuple[str, str]] = {
    "embedding_bag": ("rows=200000,dim=64,batch=2048,pooling=8", "rows=1000000,dim=128,batch=2048,pooling=20-80"),
    "batched_embedding_bag": (f"rows={CRITEO_ROWS_CAPPED},dim=64,batch=2048,pooling=8",
                              "rows=1000000x2+100000x8+10000x16,dim=128,batch=2048,pooling=20-80"),
    "interaction": ("batch=2048,tables=26,dim=64", "batch=2048,tables=26,dim=128"),
    "qmatmul": ("m=2048,k=512,n=256,relu=true", "m=4096,k=1024,n=1024"),
    "qmatmul_requant": ("m=2048,k=415,n=512,relu=true", "m=2048,k=512,n=256,relu=true"),
    "quantize_rows": ("rows=2048,cols=415", "rows=16384,cols=1024"),
}
INT8_TC = ("qmatmul", "qmatmul_requant")  # measured against the int8 tensor-core peak; the others by bytes


def _mma(bm: int, bn: int, wm: int, wn: int, bk: int = 64, **more: Any) -> dict[str, Any]:
    return {"compute": "mma", "block_m": bm, "block_n": bn, "warp_m": wm, "warp_n": wn, "block_k": bk, **more}


def _dp4a(bm: int, bn: int, tm: int, tn: int, bk: int = 32) -> dict[str, Any]:
    return {"compute": "dp4a", "block_m": bm, "block_n": bn, "thread_m": tm, "thread_n": tn, "block_k": bk}


_MATMUL_PICKS = [_mma(128, 128, 64, 64, 128), _mma(128, 128, 64, 32), _mma(128, 64, 64, 32), _mma(64, 128, 32, 64),
                 _mma(64, 64, 32, 32), _mma(64, 64, 32, 32, 128), _mma(256, 128, 64, 64), _mma(128, 256, 64, 64),
                 _mma(128, 128, 64, 64, prefetch=False), _mma(128, 128, 64, 64, max_unroll=256),
                 _mma(64, 32, 32, 16), _mma(32, 64, 16, 32),
                 _dp4a(128, 128, 8, 8), _dp4a(64, 64, 4, 4, 64), _dp4a(128, 64, 8, 4), _dp4a(64, 128, 4, 8)]
# Hand-picked tilings, as knob values over the default config (those the shape's space refuses are dropped):
# what a CUDA programmer would try first (16-byte loads, a warp or half a warp per embedding row, enough rows per
# block; for the int8 matmuls, tensor-core tiles of 64x64 warps first, then dp4a register tiles).
PICKS: dict[str, Callable[[Any], list[dict[str, Any]]]] = {
    "qmatmul": lambda w: _MATMUL_PICKS,
    "qmatmul_requant": lambda w: _MATMUL_PICKS,
    "embedding_bag": lambda w: [
        {"gpu_vector": 4, "dim_threads": dt, "threads": t, "gpu_unroll": u, "index_prefetch": p}
        for dt in (w.dim // 4, w.dim // 8) for (t, u) in ((128, 8), (256, 8), (256, 16), (512, 8), (128, 4))
        for p in ("shuffle", "none")],
    "batched_embedding_bag": lambda w: [
        {"gpu_vector": 4, "dim_iters": i, "threads": t, "bag_rounds": r, "gpu_unroll": u}
        for i in (1, 2) for t in (256, 512, 128) for (r, u) in ((1, 4), (2, 4), (1, 8))],
    "interaction": lambda w: [
        {"samples_per_block": s, "staging": st, "pair_tile": 4, "dot_lanes": lanes, "vector": 4, "threads": t,
         "output": o}
        for s in (1, 2, 4) for st in ("padded", "shared") for lanes in (4, 8) for t in (128, 256)
        for o in ("staged", "direct")],
    "quantize_rows": lambda w: [{"threads": t, "rows_per_block": r}
                                for (t, r) in ((128, 1), (256, 1), (64, 2), (32, 4), (128, 2), (512, 1))],
}


# ---- what to build ---------------------------------------------------------------------------------------------
def choose_configs(task: Any, n: int, seed: int) -> list[Any]:
    """Up to `n` configs in the order they are measured: the default, the valid hand-picked ones, then configs
    sampled from each code path in turn (qmatmul's tensor cores, dp4a and plain multiply-adds alike)."""
    from search_spaces import InvalidConfig

    space = task.space
    chosen = [space.default()]
    base = chosen[0].to_json()
    for override in PICKS.get(task.op, lambda w: [])(task.workload):
        try:
            cfg = space.make({**base, **override})
        except InvalidConfig:
            continue
        if cfg not in chosen:
            chosen.append(cfg)
    rng = random.Random(seed)
    paths = space.paths_present() if space.paths else [()]
    turn, misses = 0, 0
    while len(chosen) < n and misses < 200 * n:
        cfg = space.sample(rng)
        if cfg in chosen or (space.paths and space.path_of(cfg) != paths[turn % len(paths)]):
            misses += 1
            continue
        chosen.append(cfg)
        turn += 1
    return chosen[:n]


def guided_configs(task: Any, n: int, log_dir: Path, seed: int, builder: Any, confirm: int = 3) -> list[Any]:
    """Up to `n` configs for a second run, given what `log_dir` (a GPU check's ingested records) holds for the
    task: those the tuner would measure next, ranked by the cost model those records trained (the proposal of
    `autotune tune`, measured on the lent GPU instead of here), then the `confirm` fastest measured ones again
    (as a tuning run ends: the best is the fastest over both runs, and their spread is the runs' noise)."""
    from autotune.tuner import Proposer
    from autotune.tuning_log import TuningLog

    proposer = Proposer(task, TuningLog(log_dir / f"{task.op}.jsonl"), "xgb", seed, builder)
    again = proposer.leaders(min(confirm, n - 1))  # at least one new candidate
    return proposer.ask(n - len(again)) + again


def describe_args(task: Any, cfg: Any, inputs: tuple[Any, ...]) -> list[dict[str, Any]]:
    """The kernel's arguments for these inputs, as TVM's `main` takes them: shapes and dtypes of tensors,
    values of numbers (what the launch is recorded with, and the fallback launcher checks)."""
    import torch

    args, _ = task.bind(cfg).arguments(*inputs)
    return [{"shape": list(a.shape), "dtype": str(a.dtype).removeprefix("torch.")} if isinstance(a, torch.Tensor)
            else {"value": a} for a in args]


# ---- the device image's Python, the wheels, the stub driver ---------------------------------------------------
def device_python(env_var: str = "GPU_CHECK_PYTHON") -> str | None:
    """A Python of the device image's version on this machine ($GPU_CHECK_PYTHON, python3.12 on PATH, or a pyenv
    install), or None."""
    import glob

    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    version = ".".join(map(str, DEVICE_PYTHON))
    candidates = [os.environ.get(env_var), shutil.which(f"python{version}"),
                  *sorted(glob.glob(f"{pyenv}/versions/{version}*/bin/python{version}"), reverse=True)]
    for exe in filter(None, candidates):
        try:
            out = subprocess.run([exe, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                                 text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            continue
        if out == str(DEVICE_PYTHON):
            return exe
    return None


def wheel_dir() -> Path:
    from autotune.runtime import cache_dir

    return Path(cache_dir()) / "gpu-check-wheels"


def fetch_wheels(dest: Path | None = None) -> list[Path]:
    """The wheels the device needs (for the device image's Python), from `dest` (default: a cache directory)
    where they are, else downloaded into it by pip (network needed once)."""
    dest = dest or wheel_dir()
    tag = "cp" + "".join(map(str, DEVICE_PYTHON))
    found = [next(iter(sorted(dest.glob(f"{spec.split('==')[0].replace('-', '_')}-{spec.split('==')[1]}-*.whl"))),
                  None) for spec in WHEELS]
    if all(found) and tag in found[0].name:
        return found  # type: ignore[return-value]
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version",
           ".".join(map(str, DEVICE_PYTHON)), "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
           "-d", str(dest), *WHEELS]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"cannot get the device's wheels ({', '.join(WHEELS)}) into {dest}: "
                           f"{proc.stderr.strip()[-500:]}\nput them there by hand: {' '.join(cmd)}")
    return fetch_wheels(dest)


def stub_driver_dir() -> str:
    """A directory with the stub libcuda.so.1 and libcudart.so.13 (gpu_device/stub_cuda.c), built once per
    machine with cc."""
    from autotune.runtime import cache_dir

    source = (DEVICE_SIDE / "stub_cuda.c").read_text()
    out = Path(cache_dir()) / f"gpu-check-stub-{hashlib.sha256(source.encode()).hexdigest()[:16]}"
    if not out.exists():
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".stub-"))
        src = tmp / "stub_cuda.c"
        src.write_text(source)
        for lib, extra in (("libcuda.so.1", []), ("libcudart.so.13", ["-DSTUB_RUNTIME"])):
            subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-O1", *extra, f"-Wl,-soname,{lib}", "-o",
                            str(tmp / lib), str(src)], check=True, capture_output=True)
        try:
            tmp.rename(out)
        except OSError:  # another process built it first
            shutil.rmtree(tmp, ignore_errors=True)
    return str(out)


def record_launches(out: Path, python: str, batches: Iterable[Path] = (), verify: bool = False,
                    timeout: float = 1800) -> subprocess.CompletedProcess:
    """DIR/record_launches.py run by `python` (see there); its output and status."""
    cmd = [python, str(out / "record_launches.py"), "--stub", stub_driver_dir(), *(["--verify"] if verify else []),
           *map(str, batches)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}  # the device's Python
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


# ---- prepare -------------------------------------------------------------------------------------------------
def prepare(out: Path, candidates: int = 64, arch: str = "sm_90", seed: int = 0, ops: Iterable[str] = OPS,
            shapes: dict[str, tuple[str, ...]] | None = None, wheels: Path | None = None,
            python: str | None = None, say: Callable[[str], None] = functools.partial(print, flush=True),
            guided: Path | None = None) -> dict[str, Any]:
    """Write DIR (see the module docstring); returns a summary (sizes, times, counts). `shapes` replaces
    SHAPES per operator; `python` runs the recording (default: the device image's Python, else this one).
    `guided` (a log directory, e.g. logs/cuda after an ingest) picks each task's candidates by the cost model
    instead (`guided_configs`): a second run measures what the first one taught it to expect fastest."""
    import tvm

    from autotune import package
    from autotune.build import Builder
    from autotune.targets import GPUS
    from autotune.task import make_task

    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty: prepare writes a fresh directory")
    ops = list(ops)
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    for script in DEVICE_SIDE.glob("*.py"):
        shutil.copy2(script, out / script.name)
    package.write_support_files(out, ops, gpu=True)
    (out / device_env.WHEELS).mkdir()
    for wheel in fetch_wheels(wheels):
        shutil.copy2(wheel, out / device_env.WHEELS / wheel.name)
    shapes = {**{op: SHAPES[op] for op in ops}, **(shapes or {})}
    order = [(op, shape) for i in range(max(len(s) for s in shapes.values())) for op in ops
             for shape in shapes[op][i:i + 1]]
    names, features, summary = [], {}, {"batches": {}}
    with Builder(timeout=600) as builder:
        for n, (op, shape) in enumerate(order):
            t1 = time.perf_counter()
            task = make_task(op, f"cuda:{arch}", shape=shape)
            configs = (guided_configs(task, candidates, guided, seed, builder) if guided is not None else
                       choose_configs(task, candidates, seed))
            built = builder.build(task, configs)
            build_s = time.perf_counter() - t1
            name = f"{n:02d}-{op}"
            batch = out / "batches" / name
            (batch / device_env.KERNELS).mkdir(parents=True)
            inputs = task.template.inputs(task.workload, seed)
            cands, failed = [], []
            for b in built:
                if b.lib is None:
                    failed.append({"config": b.config.to_json(), "config_key": b.config.key(), "build_s": b.build_s,
                                   "error_kind": b.error_kind, "error": b.error})
                    continue
                i = len(cands)
                shutil.move(b.lib, batch / device_env.KERNELS / f"c{i:03d}.so")
                (batch / device_env.KERNELS / f"c{i:03d}.cu").write_text(b.device_source)
                cands.append({"id": i, "config": b.config.to_json(), "config_key": b.config.key(),
                              "build_s": b.build_s, "file": f"c{i:03d}.so", "source": f"c{i:03d}.cu",
                              "args": describe_args(task, b.config, inputs)})
                features[f"{name}/{i}"] = b.features
            del inputs
            spec = {"op": op, "shape": shape, "workload": task.workload.to_json(), "workload_key": task.workload_key,
                    "device": task.device.name, "target": task.device.to_json(), "tvm_version": tvm.__version__,
                    "template_version": task.template_version, "seed": seed,
                    "l2_bytes": task.device.gpu.l2_bytes, "roof": "int8_tc" if op in INT8_TC else "bytes",
                    "candidates": cands, "failed": failed}
            device_env.write_json(batch / device_env.BATCH, spec)
            names.append(f"batches/{name}")
            summary["batches"][name] = {"built": len(cands), "tried": len(built), "build_s": build_s,
                                        "s": time.perf_counter() - t1}
            say(f"{name} [{shape}]: {len(cands)}/{len(built)} built in {build_s:.0f} s (the arguments described in "
                f"{time.perf_counter() - t1 - build_s:.0f} s)")
    spec_gpu = GPUS[arch]
    device_env.write_json(out / device_env.PLAN, {
        "format": 1, "device": f"cuda:{arch}", "card": spec_gpu.card, "batches": names,
        "roofs": {"bandwidth": spec_gpu.bandwidth, "peak_int8_tc": spec_gpu.peak_int8_tc},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "candidates": candidates,
        "chosen_by": f"the cost model over {guided}" if guided is not None else "default, picks, samples"})
    with gzip.open(out / FEATURES, "wt") as f:
        json.dump(features, f)
    python = python or device_python() or sys.executable
    t2 = time.perf_counter()
    proc = record_launches(out, python)
    say(proc.stdout.rstrip())
    if proc.returncode:
        raise RuntimeError(f"recording the launches failed ({python}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    summary["record_s"] = time.perf_counter() - t2
    summary["record_python"] = python
    for name in names:
        device_env.pack_kernels(out / name)
    summary["bytes"] = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    summary["s"] = time.perf_counter() - t0
    if summary["bytes"] > SIZE_LIMIT:
        say(f"warning: {out} holds {summary['bytes'] / 2**20:.1f} MiB, over the {SIZE_LIMIT >> 20} MiB one run "
            "carries: prepare fewer --candidates")
    return summary


# ---- ingest ----------------------------------------------------------------------------------------------------
def ingest(results: Path, log_dir: Path, prepared: Path | None = None,
           say: Callable[[str], None] = functools.partial(print, flush=True)) -> dict[str, int]:
    """Append a run's records (results.json, or the folder holding it) to log_dir/<op>.jsonl: one per candidate
    measured or failed there, one per failed build (as the tuner logs them); not the candidates the run did not
    get to, which say nothing of the candidate. Records already in a log (same task, config and measurement
    time) are skipped. Returns the records added per op."""
    from autotune import records
    from autotune.records import Record
    from cost_model.program import PROGRAM_FEATURES_VERSION

    path = results / "results.json" if results.is_dir() else results
    run = json.loads(path.read_text())
    if run.get("format") != 1 or "batches" not in run:
        raise ValueError(f"{path}: not the results of a GPU check (format {run.get('format')!r})")
    features = {}
    if prepared is not None:
        with gzip.open(prepared / FEATURES, "rt") as f:
            features = json.load(f)
    added: dict[str, int] = {}
    for res in run["batches"]:
        current = records.current_version(res["op"], res["device"])
        if current != res["template_version"]:
            say(f"{res['batch']}: built by template version {res['template_version']}, the code here is {current}: "
                "the records keep the version that built them (stale for this code)")
        common = {k: res[k] for k in ("op", "workload", "workload_key", "device", "target", "tvm_version",
                                      "template_version")}
        new = []
        for c in res["candidates"]:
            if c["error_kind"] == "harness":
                continue
            feats = features.get(f"{res['batch']}/{c['id']}") or None
            new.append(Record(**common, config=c["config"], config_key=c["config_key"], costs=tuple(c["costs"]),
                              error_kind=c["error_kind"], error=c["error"], build_s=c["build_s"],
                              timestamp=c["timestamp"], features=feats,
                              features_version=PROGRAM_FEATURES_VERSION if feats else ""))
        for f in res["failed"]:
            new.append(Record(**common, config=f["config"], config_key=f["config_key"], error_kind=f["error_kind"],
                              error=f["error"], build_s=f["build_s"], timestamp=0.0))
        log = log_dir / f"{res['op']}.jsonl"
        seen = {(r.task, r.config_key, r.timestamp) for r in records.load(log)}
        fresh = [r for r in new if (r.task, r.config_key, r.timestamp) not in seen]
        records.append(log, fresh)
        added[res["op"]] = added.get(res["op"], 0) + len(fresh)
        say(f"{res['batch']}: {len(fresh)} records ({sum(r.ok for r in fresh)} measured) -> {log}")
    return added


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare", help="build, record and pack every operator's candidates into DIR")
    pp.add_argument("out", type=Path)
    pp.add_argument("--candidates", type=int, default=64, help="configs per task (default 64)")
    pp.add_argument("--arch", default="sm_90")
    pp.add_argument("--seed", type=int, default=0)
    pp.add_argument("--ops", default=",".join(OPS), help="comma-separated operators (default: all six)")
    pp.add_argument("--shape", action="append", default=[], metavar="OP=SHAPE",
                    help="measure OP at SHAPE instead of its two shapes (repeatable)")
    pp.add_argument("--wheels", type=Path, help="directory holding the device's wheels (default: a cache, "
                    "filled by pip download)")
    pp.add_argument("--python", help="the Python to record launches with (default: the device image's version)")
    pp.add_argument("--guided", type=Path, metavar="LOG_DIR",
                    help="choose each task's candidates with the cost model trained on LOG_DIR's records (e.g. "
                         "logs/cuda after ingesting a first run) instead of default, picks and samples")
    pi = sub.add_parser("ingest", help="append a GPU check's results to the tuning logs")
    pi.add_argument("results", type=Path, help="OUT/gpu_check/results.json (or the folder holding it)")
    pi.add_argument("--prepared", type=Path, help="the prepared DIR: records get the candidates' program features")
    pi.add_argument("--log-dir", type=Path, default=ROOT / "logs" / "cuda")
    args = p.parse_args(argv)
    if args.cmd == "prepare":
        if args.candidates < 1:
            p.error("--candidates must be >= 1")
        ops = [o for o in args.ops.split(",") if o]
        unknown = [o for o in ops if o not in SHAPES]
        if unknown:
            p.error(f"--ops: unknown {', '.join(unknown)} (known: {', '.join(OPS)})")
        shapes: dict[str, tuple[str, ...]] = {}
        for item in args.shape:
            op, sep, shape = item.partition("=")
            if not sep or op not in ops:
                p.error(f"--shape {item!r}: expected OP=SHAPE with OP one of {', '.join(ops)}")
            shapes[op] = shapes.get(op, ()) + (shape,)
        if args.guided is not None and not args.guided.is_dir():
            p.error(f"--guided {args.guided}: not a directory of tuning logs")
        summary = prepare(args.out, args.candidates, args.arch, args.seed, ops, shapes, args.wheels, args.python,
                          guided=args.guided)
        print(f"prepared {args.out}: {sum(b['built'] for b in summary['batches'].values())} candidates in "
              f"{len(summary['batches'])} batches, {summary['bytes'] / 2**20:.1f} MiB, {summary['s']:.0f} s "
              f"(launches recorded with {summary['record_python']} in {summary['record_s']:.0f} s)")
    else:
        ingest(args.results, args.log_dir, args.prepared)


if __name__ == "__main__":
    main()
