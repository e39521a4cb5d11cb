"""Quantized matmul as DLRM's MLPs use it: `Y = epilogue(A @ W.T)` with W stored (N, K) like nn.Linear.

int8 x int8 -> exact int32 accumulation with a fused dequant/bias/ReLU epilogue, or fp32 x int8 weight-only
(workload.py has the semantics, checks.py what the op accepts). The weight is packed once into the layout the
config's kernel reads: CPU register tiles in cpu.py, CUDA thread-block tiles (tensor cores, dp4a or plain) in
cuda.py.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..space import Config, InvalidConfig, Space
from ..template import GraphRule, TorchBinding, is_gpu
from . import cpu, cuda
from .workload import Workload, baselines, inputs, padded_args, reference, tolerance, traffic

__all__ = ["DOC", "EXAMPLE_SHAPE", "NAME", "TEST_SHAPE", "WEIGHTS", "Workload", "baselines", "call_dims",
           "check_inputs", "graph_rules", "inputs", "kernel_args", "lower", "pack", "padded_dims", "reference",
           "scalar_args", "sized_args", "space", "tolerance", "torch_binding", "traffic"]

NAME = "qmatmul"
DOC = "int8 x int8 -> int32 matmul with a fused dequant/bias/ReLU epilogue; or int8 weight-only"
EXAMPLE_SHAPE = "m=2048,k=1024,n=1024"
TEST_SHAPE = "m=10,k=40,n=24,relu=1"  # M, K and N not whole tiles: padding is exercised
WEIGHTS = (1,)  # the weight (reference argument 1) is packed once, outside the timed call


def _device_of(cfg: Config) -> Any:
    """The device module whose space `cfg` is a point of (pack and kernel_args get no target)."""
    return cuda if cuda.is_config(cfg) else cpu


def space(w: Workload, target: Any) -> Space:
    return (cuda if is_gpu(target) else cpu).space(w, target)


def lower(w: Workload, cfg: Config, target: Any) -> Any:
    device = cuda if is_gpu(target) else cpu
    if _device_of(cfg) is not device:
        raise InvalidConfig(f"qmatmul: config {cfg.key()} is not one of the {target.kind.name} space")
    return device.lower(w, cfg, target)


def pack(w: Workload, cfg: Config, weight: Any) -> tuple[Any, ...]:
    return _device_of(cfg).pack(w, cfg, weight)


def kernel_args(w: Workload, cfg: Config, packed: Sequence[Any], *tensors: Any) -> tuple[list[Any], Any]:
    """Kernel arguments from reference-order tensors with the weight already packed by `pack`."""
    return sized_args(padded_args, w, cfg, packed, *tensors)


def sized_args(padded: Callable[..., tuple[list[Any], Any]], w: Workload, cfg: Config, packed: Sequence[Any],
               *tensors: Any) -> tuple[list[Any], Any]:
    """`padded(w, dims, packed, *tensors)` (a template's arguments and output for padded dims) for the call's rows
    (`call_dims`, from the first tensor's), then the kernel's trailing integer arguments: the kernel_args of
    qmatmul and of the templates on its kernel."""
    dims, scalars = call_dims(w, cfg, tensors[0].shape[0])
    args, out = padded(w, dims, packed, *tensors)
    return [*args, *scalars], out


_PADDED: dict[tuple[int, int], tuple[Workload, Config, tuple[int, int, int], int]] = {}


def padded_dims(w: Workload, cfg: Config) -> tuple[int, int, int]:
    """The padded (M, K, N) of a kernel at its tuned M (`call_dims` for a call's)."""
    return _padding(w, cfg)[0]


def call_dims(w: Workload, cfg: Config, m: int) -> tuple[tuple[int, int, int], tuple[int, ...]]:
    """The padded (M, K, N) a call of `m` rows runs, and the kernel's trailing scalar arguments. A CPU kernel
    runs any whole number of its parallel tasks (`cpu.task_rows` rows each; the count is its last argument):
    `m` is padded up to whole tasks. A GPU kernel runs exactly its tuned M (the torch op pads or splits calls)."""
    (mp, kp, np_), task = _padding(w, cfg)
    if not task:
        return (mp, kp, np_), ()
    tasks = -(-m // task)
    return (tasks * task, kp, np_), (tasks,)


def scalar_args(w: Workload, cfg: Config) -> tuple[int, ...]:
    """The kernel's trailing integer arguments at the tuned M (`autotune.lowered --specialized`)."""
    return call_dims(w, cfg, w.m)[1]


def _padding(w: Workload, cfg: Config) -> tuple[tuple[int, int, int], int]:
    """(the padded (M, K, N) at the tuned M, rows per task of a CPU kernel or 0), found again by the identity of
    the workload and config (2 us a call otherwise). The entry holds both, so their ids cannot be reused while
    it lives; bounded like a cache."""
    hit = _PADDED.get((id(w), id(cfg)))
    if hit is not None and hit[0] is w and hit[1] is cfg:
        return hit[2], hit[3]
    if len(_PADDED) > 1024:
        _PADDED.clear()
    device = _device_of(cfg)
    dims, task = device.padded(w, cfg), cpu.task_rows(w, cfg) if device is cpu else 0
    _PADDED[(id(w), id(cfg))] = (w, cfg, dims, task)
    return dims, task


def check_inputs(w: Workload, *tensors: Any) -> None:
    """Raise a clear error for tensors the kernel cannot take (checks.py, imports torch)."""
    from .checks import check_inputs as check

    check(w, *tensors)


def torch_binding() -> TorchBinding:
    from .torch_op import BINDING

    return BINDING


def graph_rules() -> tuple[GraphRule, ...]:
    """How the operator is found in a captured PyTorch graph (graph.py, imports torch; tune_model reads it)."""
    from .graph import RULES

    return RULES
