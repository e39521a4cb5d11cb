"""split_linear on CPUs (llvm): its knobs, space, lowering and weight packing (the TVMScript is kernel.py's)."""

from __future__ import annotations

from typing import Any

from .. import intrinsics
from ..space import Choice, Config, Constraint, InvalidConfig, Space
from .kernel import TILE, compute, k_block, padded
from .workload import PIECES, Workload

__all__ = ["COLS_PER_TASK", "INTRINSIC", "K_BLOCK", "M_TILES", "N_TILES", "ROWS_PER_TASK", "default_k_block",
           "default_rows", "lower", "pack", "space"]

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
    "Rows of X one parallel task computes (whole register blocks): its three pieces (rows x K x 6 bytes, a k "
    "block's blocked) stay in L1/L2 while every column block reads them; fewer rows give more tasks to spread over "
    "the cores, more rows fewer passes of the weight."))
COLS_PER_TASK = Choice("cols_per_task", (0, 128, 256, 512), doc=(
    "'amx': columns one parallel task computes (0: all). With all, the whole split weight (N x K x 6 bytes) streams "
    "past every register block of rows: 21 MB for a 3456 -> 1024 layer, from memory 64 times a batch of 2048. A "
    "group of columns (whole register blocks) with a k block keeps its weight in L2 while the task's rows pass."))
K_BLOCK = Choice("k_block", (0, 256, 512, 1024, 2048), doc=(
    "'amx': k per block (0: the whole K; else the most whole tile rows of 32 dividing K, up to this): the task runs "
    "block by block, its accumulators (rows x columns float32) kept between blocks, so that a block of the rows' "
    "pieces and of the group's weight stay in L2 together (a 3456-wide row's pieces are 20 KB). Offered where K's "
    "tile rows give a block of at least half this."))


DEFAULT_TASKS = 8  # the untuned default's rows per task leave the batch at least this many tasks where it can


def default_rows(w: Workload) -> int:
    """The untuned rows per task: the most that still split the batch into DEFAULT_TASKS tasks (more rows, fewer
    passes of the weight over them; benchmarks/WHOLE_MODEL.md, twenty-third session), else the fewest."""
    fit = [r for r in ROWS_PER_TASK.options if -(-w.m // r) >= DEFAULT_TASKS]
    return max(fit) if fit else min(ROWS_PER_TASK.options)


def default_k_block(w: Workload) -> int:
    """The untuned k block: the largest offered within half of K (0, the whole K, where none is): blocked, a
    task's epilogue streams whole rows of the output (and of a cross layer's x0 and x_l) instead of register
    blocks' 64-byte runs, and a k block of its rows' pieces stays in L2 (benchmarks/WHOLE_MODEL.md)."""
    kp = padded(w, 1)[0]
    fit = [b for b in K_BLOCK.options if b and 2 * b <= kp and 2 * k_block(kp, b) > b]
    return max(fit) if fit else 0


def space(w: Workload, target: Any) -> Space:
    """'amx' where the CPU has AMX-BF16, else 'simd'; register blocks that fit AMX's 8 tile registers. The default
    (the first valid config) is 'amx' with `default_rows` and `default_k_block`."""
    if target.kind.name != "llvm":
        raise InvalidConfig(f"split_linear has no CPU schedule for target kind {target.kind.name!r}")
    intrins = ["amx"] if intrinsics.cpu_has(target, *AMX_CPU_FEATURES) else []
    intrins.append("simd")
    kp = padded(w, 1)[0]

    def blocks_ok(c: Config) -> bool:  # blocks smaller than the layer only, and only AMX's
        np_ = padded(w, c[N_TILES])[1]
        if c[INTRINSIC] != "amx":
            return c[COLS_PER_TASK] == 0 and c[K_BLOCK] == 0
        k_ok = c[K_BLOCK] == 0 or (c[K_BLOCK] < kp and 2 * k_block(kp, c[K_BLOCK]) > c[K_BLOCK])  # not degenerate
        return c[COLS_PER_TASK] < np_ and k_ok and c[COLS_PER_TASK] % (TILE * c[N_TILES]) == 0

    return Space([INTRINSIC.only(intrins), M_TILES, N_TILES, ROWS_PER_TASK.leading(default_rows(w)), COLS_PER_TASK,
                  K_BLOCK.leading(default_k_block(w))],
                 [Constraint("an AMX block fits the 8 tile registers",
                             lambda c: c[INTRINSIC] != "amx" or intrinsics.amx_fits(c[M_TILES], c[N_TILES])),
                  Constraint("a task is whole register blocks",
                             lambda c: c[ROWS_PER_TASK] % (TILE * c[M_TILES]) == 0),
                  Constraint("AMX's column groups and k blocks below the layer's N and K, of whole register blocks",
                             blocks_ok)],
                 paths=[INTRINSIC.name])


def lower(w: Workload, cfg: Config, target: Any, cross: bool = False) -> Any:
    """The IRModule of one config (kernel.py writes the loops itself: nothing is left to schedule); `cross`: with
    DCNv2's cross tail as its epilogue (split_linear_cross)."""
    if target.kind.name != "llvm":
        raise InvalidConfig(f"split_linear has no CPU schedule for target kind {target.kind.name!r}")
    if cfg[INTRINSIC] == "amx" and not intrinsics.cpu_has(target, *AMX_CPU_FEATURES):
        raise InvalidConfig("split_linear: 'amx' needs a CPU with AMX-BF16")
    return compute(w, cfg[INTRINSIC], cfg[M_TILES], cfg[N_TILES], cfg[ROWS_PER_TASK], cfg[COLS_PER_TASK],
                   cfg[K_BLOCK], cross)


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

