"""What the embedding-bag kernels share: the signature of the CPU and CUDA TVMScript (cpu.py, cuda.py), the
bounds checks their gathers make (also batched_embedding_bag's), and the CPU kernels' software prefetch.

The kernels check their inputs themselves, so that a call needs no pass over the indices before it. Each
gathered index is compared with its table's rows, and one out of range is not read (nothing is added for it)
and sets a bit of the error flag: a 1-element int32 argument, zero on entry, that the template's `after_call`
raises after the call (`workload.INDEX_ERROR`, `OFFSETS_ERROR`, `TABLE_OFFSETS_ERROR`). The compares are per
index, never per element of a row. Offsets are checked as boundaries (from 0, non-decreasing, within the
indices): on the CPU by one vectorised pass over them before the gather, which it skips when they are bad (a
compare and branch per bag in the gather costs more: a one-hot gather is latency-bound, and each instruction
per bag shortens the out-of-order window over the bags whose loads are in flight; benchmarks/EMBEDDING_BAG.md);
on a GPU per bag, where a bad bag pools nothing (a host statement could not read them there).
"""

from __future__ import annotations

from typing import Any

from .rows import RowFormat
from .workload import Workload

def signature(w: Workload, body: Any) -> Any:
    """The kernel's signature around a `body(W, S, I, Off, PSW, O, Flag, NB, NNZ)` macro: rows, indices and batch
    are symbolic; the table W holds rows in the workload's format (rows.py; S: the float32 view of an int8
    table's scales and biases, W itself otherwise); per-sample weights are an argument only when the workload
    has them; the error flag is last."""
    import tvm
    from tvm.script import tirx as T

    D, idt = w.dim, w.index_dtype
    fmt = w.rows_format
    WD, storage = fmt.width, fmt.storage
    extra = 1 if w.include_last_offset else 0
    ialign = index_alignment(idt)
    if w.per_sample_weights:
        @T.prim_func(s_tir=True)
        def main(w_: T.handle, ind: T.handle, off: T.handle, psw: T.handle, out: T.handle, flag: T.handle):
            T.func_attr({"global_symbol": "main", "tirx.noalias": True})
            R = T.int64()
            NNZ = T.int64()
            NB = T.int64()
            W = T.match_buffer(w_, (R, WD), storage)
            I = T.match_buffer(ind, (NNZ,), idt, align=ialign)
            Off = T.match_buffer(off, (NB + extra,), idt, align=ialign)
            PSW = T.match_buffer(psw, (NNZ,), "float32")
            O = T.match_buffer(out, (NB, D), "float32")
            Flag = T.match_buffer(flag, (1,), "int32")
            if fmt.fused:
                S = fmt.scales(W)
                body(W, S, I, Off, PSW, O, Flag, NB, NNZ)
            else:
                body(W, W, I, Off, PSW, O, Flag, NB, NNZ)
    else:
        @T.prim_func(s_tir=True)
        def main(w_: T.handle, ind: T.handle, off: T.handle, out: T.handle, flag: T.handle):
            T.func_attr({"global_symbol": "main", "tirx.noalias": True})
            R = T.int64()
            NNZ = T.int64()
            NB = T.int64()
            W = T.match_buffer(w_, (R, WD), storage)
            I = T.match_buffer(ind, (NNZ,), idt, align=ialign)
            Off = T.match_buffer(off, (NB + extra,), idt, align=ialign)
            O = T.match_buffer(out, (NB, D), "float32")
            Flag = T.match_buffer(flag, (1,), "int32")
            # PSW unused: the table stands in so the macro type-checks
            if fmt.fused:
                S = fmt.scales(W)
                body(W, S, I, Off, W, O, Flag, NB, NNZ)
            else:
                body(W, W, I, Off, W, O, Flag, NB, NNZ)

    return tvm.IRModule({"main": main})


def index_alignment(dtype: str) -> int:
    """The alignment index buffers are declared with: their element's (TVM would assume 64 bytes, and LLVM then
    emits aligned vector loads for the offsets' check, which fault on a tensor that is not: a slice, or NumPy's
    16-byte aligned memory through torch.from_numpy)."""
    return 8 if dtype == "int64" else 4


# ---- bounds checks (TIR expressions and macros; see the module's docstring) ------------------------------
def in_range(row: Any, rows: Any) -> Any:
    """0 <= row < rows, as one unsigned compare (a negative row wraps to a huge one)."""
    from tvm.script import tirx as T

    return T.Cast("uint64", T.Cast("int64", row)) < T.Cast("uint64", T.Cast("int64", rows))


def bag_ok(start: Any, end: Any, nnz: Any) -> Any:
    """0 <= start <= end <= nnz (a bag inside the indices), as two unsigned compares."""
    from tvm.script import tirx as T

    def u(x: Any) -> Any:
        return T.Cast("uint64", T.Cast("int64", x))

    return T.And(u(start) <= u(end), u(end) <= u(nnz))


def bag_length(start: Any, end: Any, nnz: Any) -> Any:
    """The number of indices a bag pools: end - start, or 0 for a bag outside the indices (GPU kernels: it
    reads nothing, and is flagged)."""
    from tvm.script import tirx as T

    return T.Select(bag_ok(start, end, nnz), T.Cast("int64", end) - T.Cast("int64", start), T.int64(0))


def flag_where() -> Any:
    """A TVMScript macro `flag_if(Flag, bad, code)`: sets the `code` bit of the error flag where `bad`: a branch
    never taken on good input (a store by every bag would make the cores fight over the flag's cache line). Two
    threads may race on it; the flag is then nonzero whichever wins, and after_call finds what was wrong."""
    from tvm.script import tirx as T

    @T.macro
    def flag_if(Flag, bad, code):
        with T.sblock("flag"):
            T.reads()
            T.writes(Flag[0])
            if bad:
                Flag[0] = T.bitwise_or(Flag[0], T.int32(code))

    return flag_if


def boundaries_checker() -> Any:
    """A TVMScript macro `check_boundaries(B, Flag, count, limit, code)` for CPU kernels: sets the `code` bit of
    the flag unless B[0:count] starts at 0, never decreases and ends within `limit` (offsets into the indices,
    a table's first rows). One pass that LLVM vectorises: the flag is OR-ed in a register, without a branch."""
    from tvm.script import tirx as T

    @T.macro
    def check_boundaries(B, Flag, count, limit, code):
        with T.sblock("check_boundaries"):
            T.reads(B[0:count])
            T.writes(Flag[0])
            if count > 0:
                Flag[0] = T.bitwise_or(Flag[0], T.Select(T.Cast("int64", B[0]) != T.int64(0), T.int32(code),
                                                         T.int32(0)))
                for i in range(count - 1):
                    Flag[0] = T.bitwise_or(Flag[0], T.Select(B[i + 1] < B[i], T.int32(code), T.int32(0)))
                Flag[0] = T.bitwise_or(Flag[0], T.Select(T.Cast("int64", B[count - 1]) > limit, T.int32(code),
                                                         T.int32(0)))

    return check_boundaries


def prefetcher(lines: int, fmt: RowFormat) -> Any:
    """A TVMScript macro `prefetch_row(W, row)`: LLVM's prefetch of the first `lines` 64-byte cache lines of
    row `row` of W (rows of `fmt`: the last one at the row's last element where a row ends within it), in an
    opaque block that reads and writes nothing (a hint, not an access: a row out of range is prefetched
    harmlessly)."""
    from tvm.script import tirx as T

    step, last = fmt.line_elements, fmt.width - 1

    def element(c: Any) -> Any:
        return T.min(c * step, last) if (lines - 1) * step > last else c * step

    @T.macro
    def prefetch_row(W, row):
        with T.sblock("prefetch"):
            T.reads()
            T.writes()
            for c in T.unroll(lines):
                T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch.p0", T.address_of(W[row, element(c)]),
                                              0, 3, 1))

    return prefetch_row
