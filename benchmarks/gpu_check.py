"""The GPU check: candidates built here for sm_90, measured on a GPU machine that has no TVM.

    python benchmarks/gpu_check.py prepare gpu_check/ --candidates 8   # here: nvcc-compiled batches
    python gpu_check/check.py                                          # there: PyTorch + apache-tvm-ffi

With the `device` tool's H200 (torch and nvcc, no TVM, no apache-tvm-ffi; about 4.5 MB travels):
    echo /gpu_check/ >> .git/info/exclude; echo /.whl/ >> .git/info/exclude
    python benchmarks/gpu_check.py prepare gpu_check --candidates 8
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 -d .whl apache-tvm-ffi==0.1.14.post1
    run(carry=["gpu_check", ".whl"], command="python3 -m pip install -q --no-index --no-deps --target /tmp/site
        .whl/*.whl && PYTHONPATH=/tmp/site python3 gpu_check/check.py 2>&1 | tee $OUT/gpu_check.log")

`prepare` writes one offline batch per operator at the DLRM shapes (the default config plus random ones of
the GPU space) with TVM's runtime libraries. `check.py` (a copy of this file) measures every batch with the
offline runner's script (each candidate checked against PyTorch on the GPU before it is timed, L2 flushed
between calls), times PyTorch's paths on the same inputs, and prints per operator: candidates correct,
best/PyTorch ratio and the achieved TB/s or TOPS against the device's peak.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

SHAPES = {  # the acceptance shapes of the CUDA issue
    "embedding_bag": "rows=1000000,dim=128,batch=2048,pooling=20-80",
    "interaction": "batch=2048,tables=26,dim=128",
    "qmatmul": "m=4096,k=1024,n=1024",
}


def prepare(out: Path, candidates: int, arch: str, seed: int) -> None:
    import shutil

    from autotune.build import Builder
    from autotune.measure import Timing
    from autotune.measure.offline import OfflineRunner
    from autotune.task import make_task
    from autotune.tuner import dry_run

    runner = OfflineRunner(out, Timing(number=10, repeat=5, min_repeat_ms=20))
    with Builder(timeout=600) as builder:
        for op, shape in SHAPES.items():
            task = make_task(op, f"cuda:{arch}", shape=shape)
            built = dry_run(task, candidates, seed=seed, builder=builder)
            ok = sum(b.lib is not None for b in built)
            print(f"{op}: {ok}/{len(built)} candidates built for {arch}", flush=True)
            runner.write_batch(task, [b for b in built if b.lib is not None])
    shutil.copy2(__file__, out / "check.py")


def check(root: Path) -> None:
    """On the GPU machine: measure the batches, then compare the best with PyTorch's paths."""
    import torch

    sys.path.insert(0, str(root))
    import autotune_runtime as rt
    import search_spaces

    subprocess.run([sys.executable, str(root / "measure.py"), "--timeout", "900"], check=True)
    props = torch.cuda.get_device_properties(0)
    print(f"device: {props.name}, {props.multi_processor_count} SMs, L2 {props.L2_cache_size >> 20} MiB")
    for batch in sorted(root.glob("batch-*")):
        spec = json.loads((batch / "batch.json").read_text())
        results = json.loads((batch / "results.json").read_text())["results"]
        template = search_spaces.get(spec["op"])
        w = template.Workload.from_json(spec["workload"])
        good = [r for r in results if r["error_kind"] is None]
        kinds: dict[str, int] = {}
        for r in results:
            kinds[r["error_kind"] or "ok"] = kinds.get(r["error_kind"] or "ok", 0) + 1
        print(f"\n{spec['op']} {json.dumps(spec['workload'])}\n  candidates: {kinds}")
        for r in results:
            if r["error_kind"] not in (None,):
                print(f"    {r['id']}: {r['error_kind']}: {r['error']}")
        if not good:
            continue
        best = min(good, key=lambda r: sorted(r["costs"])[len(r["costs"]) // 2])
        best_s = sorted(best["costs"])[len(best["costs"]) // 2]
        data = rt.TaskData(template, w, spec["seed"], "cuda")
        timing = rt.Timing(**spec["timing"])
        paths = template.baselines(w, *data.inputs) if hasattr(template, "baselines") else {}
        paths = paths or {"reference": lambda: template.reference(w, *data.inputs)}
        torch_s = {}
        for name, fn in paths.items():
            costs = rt.time_cuda(fn, timing, int(props.L2_cache_size))
            torch_s[name] = sorted(costs)[len(costs) // 2]
        traffic = template.traffic(w, *data.inputs)
        fastest = min(torch_s.values())
        cfg = next(c["config"] for c in spec["candidates"] if c["id"] == best["id"])
        print(f"  best candidate {best['id']}: {best_s * 1e6:.1f} us  config {json.dumps(cfg, sort_keys=True)}")
        for name, secs in torch_s.items():
            print(f"  torch {name}: {secs * 1e6:.1f} us  -> tuned/torch speed-up {secs / best_s:.2f}x")
        if traffic.unit == "GB/s":
            print(f"  achieved {traffic.bytes / best_s / 1e12:.2f} TB/s on gathered bytes "
                  f"(torch: {traffic.bytes / fastest / 1e12:.2f} TB/s)")
        else:
            print(f"  achieved {traffic.ops / best_s / 1e12:.1f} TOPS (torch: {traffic.ops / fastest / 1e12:.1f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd")
    pp = sub.add_parser("prepare")
    pp.add_argument("out", type=Path)
    pp.add_argument("--candidates", type=int, default=8)
    pp.add_argument("--arch", default="sm_90")
    pp.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.cmd == "prepare":
        prepare(args.out, args.candidates, args.arch, args.seed)
    else:  # run as DIR/check.py on the GPU machine
        check(Path(__file__).resolve().parent)


if __name__ == "__main__":
    main()
