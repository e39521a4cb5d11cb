"""A test-only template whose candidates misbehave on purpose: crash, hang or compute the wrong thing.

`out = x + 1`, where the `fault` knob swaps in a segfaulting write, an endless loop or `x + 2`.
"""

from __future__ import annotations

from typing import Any

from search_spaces import Choice, Constraint, Space, Traffic
from search_spaces.template import Workload as _Workload
from dataclasses import dataclass

NAME = "faulty"
DOC = "x + 1 with injectable faults (tests only)"
EXAMPLE_SHAPE = "n=64"

FAULT = Choice("fault", ("none", "wrong", "crash", "hang"), doc="which misbehaviour to inject")
LANES = Choice("lanes", (1, 4), doc="vector lanes, so there are several correct configs")


@dataclass(frozen=True)
class Workload(_Workload):
    n: int


def space(w: Workload, target: Any) -> Space:
    return Space([FAULT, LANES], [Constraint("one crashing and one hanging config",
                                             lambda c: c[FAULT] in ("none", "wrong") or c[LANES] == 1)])


def lower(w: Workload, cfg: Any, target: Any) -> Any:
    import tvm
    from tvm.script import tirx as T
    from tvm.s_tir import Schedule

    n, fault = w.n, cfg[FAULT]
    delta = 2.0 if fault == "wrong" else 1.0

    @T.prim_func(s_tir=True)
    def main(x: T.Buffer((n,), "float32"), y: T.Buffer((n,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for i in range(n):
            with T.sblock("y"):
                vi = T.axis.spatial(n, i)
                y[vi] = x[vi] + T.float32(delta)
        if fault == "crash":
            with T.sblock("crash"):
                T.reads()
                T.writes()
                y[T.int64(1) << T.int64(40)] = T.float32(0)
        if fault == "hang":
            with T.sblock("hang"):
                T.reads()
                T.writes()
                while x[0] > T.float32(-1) or x[0] <= T.float32(-1):
                    y[0] = y[0] + T.float32(1)

    sch = Schedule(tvm.IRModule({"main": main}))
    (i,) = sch.get_loops(sch.get_sblock("y"))
    if cfg[LANES] > 1 and n % cfg[LANES] == 0:
        _, v = sch.split(i, [None, cfg[LANES]])
        sch.vectorize(v)
    return sch.mod


def inputs(w: Workload, seed: int = 0) -> tuple[Any, ...]:
    import torch

    return (torch.arange(w.n, dtype=torch.float32),)


def reference(w: Workload, x: Any) -> Any:
    return x + 1


def check_inputs(w: Workload, x: Any) -> None:
    pass


WEIGHTS: tuple[int, ...] = ()


def kernel_args(w: Workload, cfg: Any, packed: Any, x: Any) -> tuple[list[Any], Any]:
    import torch

    out = torch.empty_like(x)
    return [x, out], out


def traffic(w: Workload, x: Any) -> Traffic:
    return Traffic(bytes=8.0 * w.n)


def tolerance(w: Workload) -> tuple[float, float]:
    return (0.0, 1e-6)
