"""Per-call cost of `torch.ops.autotune.*` over calling the TVM function directly, in microseconds.

On small inputs (the kernel's own work is a few microseconds) each operator is timed eight ways, interleaved in
rounds: the exported TVM function called with ready arguments (output preallocated), the loaded kernel
(arguments and output made per call), the custom operator with `validate=False` and with `validate=True`, each
in normal (grad) mode and in `torch.inference_mode`, PyTorch's own implementation for scale, and the
dispatcher's floor: an operator of the same schema whose Python kernel does nothing but return a ready output
(what any `torch.library` operator implemented in Python pays to be called: boxing the arguments into Python
objects and the result back). The difference between the custom operator and the direct call is what the
dispatcher, the checks, the kernel choice and the output allocation cost; the target is <= 10 us with
validation on. The ops run on the compiled call path (autotune/torch/callpath.py) where it builds; beside
them, the Python dispatch it falls back to, called directly (a call through the Python kernels costs that plus
the floor; AUTOTUNE_CALLPATH=python times them through the dispatcher). Two figures per contender: the median wall
time (the measurement core's timer) and the least CPU time of this thread over the rounds, which a shared
machine disturbs least (torch and TVM run one thread each here: set TVM_NUM_THREADS=1).

Then the one-hot embedding bag (rows=200000, dim=64, batch=2048, pooling=1): the custom op against
`F.embedding_bag` on the same tensors in this process, as a ratio (> 1: the op is faster). Usage:
    python -m benchmarks.torch_op_overhead [--package DIR | --log LOG ...] [--rounds N]
    # default: a package of untuned (default-config) kernels, built here; --log puts the best logged config
    # of each of these workloads in it instead (e.g. a tuned one-hot log); --package takes a ready one
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F

import autotune.torch as at
import search_spaces
from autotune.bench import median_seconds
from autotune.task import make_task
from benchmarks.lib.timing import interleaved
from benchmarks.lib.workloads import ONE_HOT_BAG, kernel_package

WORKLOADS = {
    "embedding_bag": dict(rows=1000, dim=64, batch=64, pooling=(1, 4)),
    "interaction": dict(batch=16, tables=8, dim=16),
    "qmatmul": dict(m=16, k=64, n=32),
}
RAW = "TVM function, ready arguments"
PYTHON = "Python dispatch, called directly"
FLOOR = "dispatcher floor (no-op kernel)"
_FLOOR_LIB = torch.library.Library("autotune_overhead_floor", "DEF")  # the no-op twins of the ops (kept alive)


def floor_op(op: str, out: Any) -> Any:
    """An operator with `op`'s schema whose CPU kernel returns `out` (no checks, no kernel, no allocation)."""
    name = f"{op}_floor"
    if not hasattr(torch.ops.autotune_overhead_floor, name):
        schema = torch.library.infer_schema(at.ops.BINDINGS[op].op, mutates_args=())
        _FLOOR_LIB.define(name + schema)
        _FLOOR_LIB.impl(name, lambda *args: out, "CPU")
    return getattr(torch.ops.autotune_overhead_floor, name).default


class Inference:
    """A contender timed inside `torch.inference_mode` (entered once around its timing, as a serving loop would:
    no autograd keys, so the dispatcher goes straight to the CPU kernel)."""

    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn

    def __call__(self) -> Any:
        return self.fn()


def op_tensors(op: str, kernel: at.LoadedKernel) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The custom op's arguments for the kernel's workload (qmatmul's differ from the reference order)."""
    tensors = kernel.template.inputs(kernel.workload, 0)
    if op == "qmatmul":
        from search_spaces.qmatmul.checks import op_arguments

        return op_arguments(kernel.workload, tensors)
    return tuple(tensors), {}


def contenders(op: str, kernel: at.LoadedKernel) -> dict[str, Callable[[], Any]]:
    template, w = kernel.template, kernel.workload
    tensors = template.inputs(w, 0)
    args, _ = kernel.arguments(*tensors)
    custom = getattr(torch.ops.autotune, op).default
    targs, kwargs = op_tensors(op, kernel)
    if op == "embedding_bag":
        weight, idx, off = tensors
        torch_path = lambda: F.embedding_bag(idx, weight, off, mode="sum")  # noqa: E731
    else:
        torch_path = lambda: template.reference(w, *tensors)  # noqa: E731
    unchecked = lambda: custom(*targs, **kwargs, validate=False)  # noqa: E731
    checked = lambda: custom(*targs, **kwargs)  # noqa: E731
    python = python_dispatch(op, targs, kwargs)
    floor = floor_op(op, kernel(*tensors))
    return {
        RAW: lambda: kernel.func(*args),
        "loaded kernel (args + output)": lambda: kernel(*tensors),
        PYTHON: lambda: python(),
        "custom op, validate=False": unchecked,
        "custom op, validate=False, inference": Inference(unchecked),
        "custom op, validate=True": checked,
        "custom op, validate=True, inference": Inference(checked),
        "PyTorch": torch_path,
        FLOOR: lambda: floor(*targs, **kwargs),
    }


def python_dispatch(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[], Any]:
    """The op's Python CPU dispatch called directly (validation on): what a call costs without the compiled call
    path, less the dispatcher's own boxing (the floor below)."""
    import inspect

    bound = inspect.signature(at.ops.BINDINGS[op].op).bind(*args, **kwargs)
    bound.apply_defaults()
    impl, full = at.ops.PYTHON_DISPATCH[op], tuple(bound.args)
    return lambda: impl(*full)


def timed(fns: dict[str, Callable[[], Any]], rounds: int, seconds: float) -> dict[str, float]:
    """Median over `rounds` of each contender's median call time, in us; contenders interleaved per round."""

    def time_one(fn: Callable[[], Any]) -> float:
        with torch.inference_mode(isinstance(fn, Inference)):
            return median_seconds(getattr(fn, "fn", fn), seconds)

    return {name: statistics.median(t) * 1e6 for name, t in interleaved(fns, rounds, time_one).items()}


def cpu_best(fns: dict[str, Callable[[], Any]], rounds: int, calls: int = 2000) -> dict[str, float]:
    """Each contender's least CPU time (this thread's) per call over `rounds` batches of `calls`, in us: on a
    shared machine, the figure least disturbed by other processes (the whole call runs on this thread when
    torch and TVM run one thread each, as here)."""

    def time_one(fn: Callable[[], Any]) -> float:
        run = getattr(fn, "fn", fn)
        with torch.inference_mode(isinstance(fn, Inference)):
            t0 = time.thread_time()
            for _ in range(calls):
                run()
            return (time.thread_time() - t0) / calls * 1e6

    return {name: min(t) for name, t in interleaved(fns, rounds, time_one).items()}


def overhead(pkg: at.Package, rounds: int) -> None:
    for op, fields in WORKLOADS.items():
        w = search_spaces.get(op).Workload(**fields)
        kernel = next(k for k in pkg.kernels if k.op == op and k.workload == w)
        fns = contenders(op, kernel)
        med, best = timed(fns, rounds, 0.2), cpu_best(fns, 3 * rounds)
        print(f"{op} {fields}   (us per call: wall median | least CPU time; + over the TVM function)")
        for name in fns:
            print(f"  {name:<38s} {med[name]:8.1f} (+{med[name] - med[RAW]:6.1f})   "
                  f"{best[name]:8.1f} (+{best[name] - best[RAW]:6.1f})")


def one_hot(pkg: at.Package, rounds: int) -> None:
    """DLRM's one-hot shape: the op (validation on) must be at least as fast as F.embedding_bag."""
    w = search_spaces.get("embedding_bag").Workload(**ONE_HOT_BAG)
    kernel = next((k for k in pkg.kernels if k.op == "embedding_bag" and k.workload.rows == w.rows
                   and k.workload.dim == w.dim and k.workload.pooling == w.pooling), None)
    if kernel is None:
        print(f"one-hot: no embedding_bag kernel for {ONE_HOT_BAG} in the package")
        return
    weight, idx, off = kernel.template.inputs(w, 0)
    custom = torch.ops.autotune.embedding_bag.default
    fns = {
        "F.embedding_bag": lambda: F.embedding_bag(idx, weight, off, mode="sum"),
        "custom op, validate=True": lambda: custom(weight, idx, off),
        "custom op, validate=True, inference": Inference(lambda: custom(weight, idx, off)),
        "custom op, validate=False": lambda: custom(weight, idx, off, validate=False),
        PYTHON: python_dispatch("embedding_bag", (weight, idx, off), {}),
        "loaded kernel (args + output)": lambda: kernel(weight, idx, off),
    }
    med = timed(fns, rounds, 0.3)
    base = med["F.embedding_bag"]
    print(f"one-hot embedding_bag {ONE_HOT_BAG} (torch threads {torch.get_num_threads()}, config "
          f"{kernel.config.key()})")
    for name, us in med.items():
        print(f"  {name:<38s} {us:8.1f} us   {base / us:5.2f}x F.embedding_bag")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--package", help="a package with kernels for the workloads above (default: build one)")
    p.add_argument("--log", nargs="+", default=[], help="logs whose best configs replace the defaults")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    pkg_dir = args.package
    if pkg_dir is None:
        tasks = [make_task(op, "cpu", **fields) for op, fields in WORKLOADS.items()]
        tasks.append(make_task("embedding_bag", "cpu", **ONE_HOT_BAG))
        pkg_dir = kernel_package(tasks, args.log, prefix="autotune-overhead-")
    pkg = at.load(pkg_dir)
    one_hot(pkg, args.rounds)  # at the process's thread settings, as a model would run it
    torch.set_num_threads(1)  # small inputs: the figure is the fixed cost, not parallel speed
    overhead(pkg, args.rounds)


if __name__ == "__main__":
    main()
