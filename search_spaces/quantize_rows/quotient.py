"""`x / scale` as an IEEE division rounds it, on CPUs, without a division instruction.

A row's quantization divides every value by the row's scale and must match PyTorch's `x / scale` in the last
bit (workload.py). `vdivps` is the slowest vector instruction of that pass: one every 5 cycles for 8 lanes
(10 for 16) on recent Intel cores, where an FMA issues twice a cycle. With `r = 1 / scale` (one IEEE division per
row), the product `q0 = x * r` is within about 1.5 ulp of the quotient; the remainder `x - q0 * scale` is then
exactly a float32 and one FMA computes it without rounding, and `q0 + rem * r` (one more FMA) is the correctly
rounded quotient (Markstein's theorem, Handbook of Floating-Point Arithmetic, 2nd ed., section 4.7): the same bits
as the division. The theorem needs the remainder to stay clear of the subnormal range, which holds for
|x| >= 2^-102; below that the quotient is under 2^-50 for any scale quantize_rows produces (scale >= 1e-12 /
qmax > 2^-48), and both it and the division round to 0. A test compares the two over millions of values.

LLVM's `llvm.fma` is a true fused multiply-add (a single rounding) on every target: an FMA instruction where the
CPU has one, a correctly rounded libm call where it does not.
"""

from __future__ import annotations

from typing import Any


def fma(a: Any, b: Any, c: Any) -> Any:
    """`a * b + c` with one rounding (a float32 TIR expression; vectorizes with its operands)."""
    import tvm

    return tvm.tirx.call_llvm_pure_intrin("float32", "llvm.fma", a, b, c)


def exact_quotient(x: Any, scale: Any, reciprocal: Any) -> Any:
    """`x / scale` rounded as IEEE division rounds it, from `reciprocal` = 1 / scale (IEEE): two FMAs and a
    multiply instead of a division (TIR expressions; `reciprocal` computed once per row)."""
    q0 = x * reciprocal
    return fma(fma(-q0, scale, x), reciprocal, q0)
