"""qmatmul_cross on CPUs: qmatmul's register-tiled kernel (qmatmul/cpu.py: knobs, packing, schedule) whose
epilogue block `Y` also reads x0 and x (float32 or bfloat16 state), so the cross layer's float32 product never
leaves the register tile.

The reduction is defined here, not by a parameter of qmatmul's compute: a change to qmatmul's modules would make
every shipped qmatmul and qmatmul_requant record stale (search_spaces/version.py), on GPUs too. Its blocks and
buffers carry qmatmul's names (A, Au, C, Y), which qmatmul's schedule finds them by.
"""

from __future__ import annotations

from typing import Any

from ..qmatmul import cpu as _qmatmul
from ..space import Config, Space
from .workload import Workload


def space(w: Workload, target: Any) -> Space:
    return _qmatmul.space(w, target)


def compute(w: Workload, cfg: Config) -> Any:
    """Y = x0 * ((A @ W.T - comp) * a_scale * w_scale + bias) + x over the padded dims, the weight packed as the
    config's layout, x0, x and Y of the state's dtype; argument order (A, Wp, [comp], a_scale, w_scale, [bias],
    X0, X, Y, tasks)."""
    import tvm
    from tvm import te

    _, kp, np_ = _qmatmul.padded(w, cfg)
    tasks = te.var("tasks")  # the kernel runs any whole number of tasks (qmatmul's call_dims)
    mp = tasks * _qmatmul.task_rows(w, cfg)
    offset = _qmatmul._offset(w, cfg)  # u8 x s8 instructions: A + offset in, offset * sum_k W out
    A = te.placeholder((mp, kp), "uint8" if w.mode == "uint8" else "int8", name="A")
    Wp, weight = _qmatmul._packed_weight(w, cfg, kp, np_)
    args = [A, Wp]
    src = A
    if offset:
        comp = te.placeholder((np_,), "int32", name="comp")
        args.append(comp)
        src = te.compute((mp, kp), lambda i, j: (A[i, j].astype("int32") + offset).astype("uint8"), name="Au")
    k = te.reduce_axis((0, kp), name="k")
    acc = te.compute((mp, np_), lambda i, j: te.sum(src[i, k].astype("int32") * weight(j, k).astype("int32"),
                                                    axis=k), name="C")
    a_scale, w_scale = te.placeholder((mp,), "float32", name="a_scale"), te.placeholder((np_,), "float32",
                                                                                          name="w_scale")
    args += [a_scale, w_scale]
    bias = te.placeholder((np_,), "float32", name="bias") if w.bias else None
    args += [bias] if bias is not None else []
    x0, x = te.placeholder((mp, np_), w.state, name="X0"), te.placeholder((mp, np_), w.state, name="X")

    def product(i: Any, j: Any) -> Any:
        c = (acc[i, j] - comp[j]) if offset else acc[i, j]
        y = c.astype("float32") * a_scale[i] * w_scale[j]
        return y + bias[j] if bias is not None else y

    def tail(i: Any, j: Any) -> Any:
        if w.state == "float32":
            return x0[i, j] * product(i, j) + x[i, j]
        # 16-bit state: widened (exact), the tail in float32, rounded once as stored
        return (x0[i, j].astype("float32") * product(i, j) + x[i, j].astype("float32")).astype(w.state)

    Y = te.compute((mp, np_), tail, name="Y")
    return tvm.IRModule({"main": te.create_prim_func(args + [x0, x, Y, tasks])})


def lower(w: Workload, cfg: Config, target: Any) -> Any:
    from tvm.s_tir import Schedule

    sch = Schedule(compute(w, cfg))
    _qmatmul.schedule(sch, w, cfg)
    return sch.mod
