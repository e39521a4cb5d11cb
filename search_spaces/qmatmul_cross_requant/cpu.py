"""qmatmul_cross_requant on CPUs: qmatmul_cross's kernel (its cross-tail epilogue) with tasks of whole rows, each
quantizing the rows it computed while they are in its cache (qmatmul's `_quantize_rows`, as qmatmul_requant's).
Its knobs are qmatmul's less n_block."""

from __future__ import annotations

from typing import Any

from ..qmatmul import cpu as _qmatmul
from ..qmatmul.compute import quantized_rows
from ..qmatmul_cross.cpu import cross_output
from ..space import Config, Space
from .workload import Workload


def space(w: Workload, target: Any) -> Space:
    return _qmatmul.space(w, target, whole_rows=True)


def compute(w: Workload, cfg: Config) -> Any:
    """qmatmul_cross's Y, then its rows (times the column factors `smooth`, where smoothed) quantized (`Q`, `S`);
    argument order (A, Wp, [comp], a_scale, w_scale, [bias], X0, X, [smooth], [Y], Q, S): Y a buffer of the
    caller's with `out_float`, else the tasks' own."""
    import tvm
    from tvm import te

    inputs, Y = cross_output(w, cfg)
    smooth = [te.placeholder((int(Y.shape[1]),), "float32", name="smooth")] if w.smooth else []
    q, s = quantized_rows(Y, w.out_qmax, fma_quotient=True, smooth=smooth[0] if smooth else None)
    return tvm.IRModule({"main": te.create_prim_func(inputs + smooth + ([Y] if w.out_float else []) + [q, s])})


def lower(w: Workload, cfg: Config, target: Any) -> Any:
    from tvm.s_tir import Schedule

    sch = Schedule(compute(w, cfg))
    _qmatmul.schedule(sch, w, cfg, out_qmax=w.out_qmax)
    return sch.mod
