"""split_linear on CPUs (llvm): its knobs, space, lowering and weight packing (the TVMScript is kernel.py's)."""

from __future__ import annotations

from typing import Any

from .. import intrinsics
from ..space import Choice, Config, Constraint, InvalidConfig, Space
from .kernel import TILE, compute, padded
from .workload import PIECES, Workload

__all__ = ["INTRINSIC", "M_TILES", "N_TILES", "ROWS_PER_TASK", "lower", "pack", "space"]

AMX_CPU_FEATURES = ("amx-tile", "amx-bf16")  # LLVM names
INTRINSIC = Choice("intrinsic", ("amx", "simd"), doc=(
    "How the products run: 'amx', on bf16 pieces of X and W in AMX tiles (`tdpbf16ps`: 16 x 16 x 32 products "
    "a tile instruction, 16 times AVX-512's float32 FMAs a cycle, so six products of pieces still cost less "
    "than one float32 product), offered where the CPU has AMX-BF16; 'simd', float32 FMAs (any CPU)."))
M_TILES = Choice("m_tiles", (2, 1), doc=(
    "Rows of the register block in 16-row tiles: each B tile loaded is used by this many A tiles ('simd': "
    "rows of 16 per block)."))
N_TILES = Choice("n_tiles", (2, 1, 3, 4), doc=(
    "Columns of the register block in 16-column tiles: each A tile loaded is used by this many B tiles; AMX's "
    "8 tile registers hold m_tiles x n_tiles accumulators and the m_tiles + n_tiles tiles they multiply."))
ROWS_PER_TASK = Choice("rows_per_task", (64, 32, 128, 256), doc=(
    "Rows of X one parallel task computes (whole register blocks): its three pieces (rows x K x 6 bytes) stay "
    "in L1/L2 while every column block reads them; fewer rows give more tasks to spread over the cores."))


def space(w: Workload, target: Any) -> Space:
    """'amx' where the CPU has AMX-BF16, else 'simd'; register blocks that fit AMX's 8 tile registers."""
    if target.kind.name != "llvm":
        raise InvalidConfig(f"split_linear has no CPU schedule for target kind {target.kind.name!r}")
    intrins = ["amx"] if intrinsics.cpu_has(target, *AMX_CPU_FEATURES) else []
    intrins.append("simd")
    return Space([INTRINSIC.only(intrins), M_TILES, N_TILES, ROWS_PER_TASK],
                 [Constraint("an AMX block fits the 8 tile registers",
                             lambda c: c[INTRINSIC] != "amx" or intrinsics.amx_fits(c[M_TILES], c[N_TILES])),
                  Constraint("a task is whole register blocks",
                             lambda c: c[ROWS_PER_TASK] % (TILE * c[M_TILES]) == 0)],
                 paths=[INTRINSIC.name])


def lower(w: Workload, cfg: Config, target: Any) -> Any:
    """The IRModule of one config (kernel.py writes the loops itself: nothing is left to schedule)."""
    if target.kind.name != "llvm":
        raise InvalidConfig(f"split_linear has no CPU schedule for target kind {target.kind.name!r}")
    if cfg[INTRINSIC] == "amx" and not intrinsics.cpu_has(target, *AMX_CPU_FEATURES):
        raise InvalidConfig("split_linear: 'amx' needs a CPU with AMX-BF16")
    return compute(w, cfg[INTRINSIC], cfg[M_TILES], cfg[N_TILES], cfg[ROWS_PER_TASK])


def pieces(t: Any) -> list[Any]:
    """A float32 tensor as PIECES bf16 tensors that sum to it exactly: each the bf16 rounding (to nearest even)
    of what the ones before left."""
    import torch

    out, rest = [], t
    for _ in range(PIECES):
        piece = rest.to(torch.bfloat16)
        out.append(piece)
        rest = rest - piece.float()
    return out


def pack(w: Workload, cfg: Config, weight: Any) -> tuple[Any, ...]:
    """The weight (N, K) zero-padded to (Np, Kp) in the config's layout, flat, and a zero bias for kernels of a
    layer without one: 'amx', its three bf16 pieces, each as (Np/16, Kp/2, 16, 2), the pairs of k a B tile row
    holds per column, as int16 bits; 'simd', (Np/16, K, 16) float32 panels."""
    import torch

    kp, np_ = padded(w, cfg[N_TILES])
    zero_bias = torch.zeros(w.n, dtype=torch.float32, device=weight.device)
    if cfg[INTRINSIC] == "simd":
        full = torch.zeros(np_, w.k, dtype=torch.float32, device=weight.device)
        full[:w.n] = weight
        return full.view(np_ // TILE, TILE, w.k).permute(0, 2, 1).contiguous().view(-1), zero_bias
    full = torch.zeros(np_, kp, dtype=torch.float32, device=weight.device)
    full[:w.n, :w.k] = weight
    tiles = [p.view(np_ // TILE, TILE, kp // 2, 2).permute(0, 2, 1, 3) for p in pieces(full)]
    return torch.stack(tiles).contiguous().view(torch.int16).view(-1), zero_bias

