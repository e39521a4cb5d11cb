"""Per-call cost of `torch.ops.autotune.*` over calling the TVM function directly, in microseconds.

On small inputs (the kernel's own work is a few microseconds) each operator is timed five ways, interleaved in
rounds: the exported TVM function called with ready arguments (output preallocated), the loaded kernel
(arguments and output made per call), the custom operator with `validate=False` (also in inference mode) and
with `validate=True`, and
PyTorch's own implementation for scale. The difference between the custom operator and the direct call is what
the dispatcher, the kernel choice and the output allocation cost. Usage:
    python benchmarks/torch_op_overhead.py [--package DIR]   # default: a package of untuned kernels, built here
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import torch
import torch.nn.functional as F

import autotune.torch as at
import search_spaces
from autotune.bench import median_seconds
from autotune.package import export
from autotune.task import make_task

WORKLOADS = {
    "embedding_bag": dict(rows=1000, dim=64, batch=64, pooling=(1, 4)),
    "interaction": dict(batch=16, tables=8, dim=16),
    "qmatmul": dict(m=16, k=64, n=32),
}


def inference(custom: object, tensors: tuple) -> object:
    with torch.inference_mode():  # no autograd key: the dispatcher skips custom_op's autograd wrapper
        return custom(*tensors, validate=False)  # type: ignore[operator]


def contenders(op: str, kernel: at.LoadedKernel) -> dict:
    template, w = kernel.template, kernel.workload
    tensors = template.inputs(w, 0)
    args, _ = kernel.arguments(*tensors)
    custom = getattr(torch.ops.autotune, op).default
    if op == "embedding_bag":
        weight, idx, off = tensors
        torch_path = lambda: F.embedding_bag(idx, weight, off, mode="sum")  # noqa: E731
    else:
        torch_path = lambda: template.reference(w, *tensors)  # noqa: E731
    return {
        "TVM function, ready arguments": lambda: kernel.func(*args),
        "loaded kernel (args + output)": lambda: kernel(*tensors),
        "custom op, validate=False": lambda: custom(*tensors, validate=False),
        "  the same in inference_mode": lambda: inference(custom, tensors),
        "custom op, validate=True": lambda: custom(*tensors),
        "PyTorch": torch_path,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--package", help="a package with kernels for the workloads above (default: build one)")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)  # small inputs: the figure is the fixed cost, not parallel speed
    pkg_dir = args.package
    if pkg_dir is None:
        pkg_dir = tempfile.mkdtemp(prefix="autotune-overhead-")
        tasks = [make_task(op, "cpu", **fields) for op, fields in WORKLOADS.items()]
        export([t.record(t.space.default(), costs=(0.0,)) for t in tasks], pkg_dir)
    pkg = at.load(pkg_dir)
    for op, fields in WORKLOADS.items():
        w = search_spaces.get(op).Workload(**fields)
        kernel = next(k for k in pkg.kernels if k.op == op and k.workload == w)
        fns = contenders(op, kernel)
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(args.rounds):
            for name, fn in fns.items():
                times[name].append(median_seconds(fn, 0.2))
        med = {name: statistics.median(t) * 1e6 for name, t in times.items()}
        base = med["TVM function, ready arguments"]
        print(f"{op} {fields}")
        for name, us in med.items():
            print(f"  {name:<32s} {us:8.1f} us   (+{us - base:6.1f})")


if __name__ == "__main__":
    main()
