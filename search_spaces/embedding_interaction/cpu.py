"""The fused embedding bags + dot interaction on the CPU (llvm): its knobs, space and schedule (the TVMScript is
kernel.py's). The dot products' knobs are the interaction kernel's (search_spaces.interaction.cpu), the
gather's the embedding bag's (search_spaces.embedding_bag.cpu), each with its meaning there; this kernel's own:
how far ahead rows and indices are prefetched across the samples, where a bag is pooled, in which order a
task's bags are pooled, and whether the dot products run in SIMD lanes or on AMX tiles.
"""

from __future__ import annotations

import copy
from typing import Any

from .. import intrinsics
from ..embedding_bag.cpu import PREFETCH_LINES, UNROLL, check_llvm, prefetch_lines, simd, vectorize_innermost
from ..interaction.cpu import DIM_UNROLL, HSUM, LANES, PAIRS_PER_BLOCK, SAMPLES_PER_TASK, THREADING
from ..space import Choice, Config, Constraint, InvalidConfig, Space
from .kernel import amx_fits, compute, feature_lanes, next_pow2, padded_dim
from .workload import Workload

__all__ = ["ACCUMULATOR", "DIM_UNROLL", "HSUM", "INDEX_PREFETCH", "INTRINSIC", "LANES", "PAIRS_PER_BLOCK",
           "ORDER", "PREFETCH", "PREFETCH_LINES", "SAMPLES_PER_TASK", "TABLE_BLOCK", "THREADING", "UNROLL",
           "lower", "schedule", "space"]

INTRINSIC = Choice("intrinsic", ("simd", "amx"), doc=(
    "How the dot products run: 'simd' in fp32 SIMD lanes along D, pairs reduced across lanes (the lanes, pair "
    "block, reduction and unroll knobs); 'amx' as the sample's Gram matrix on AMX tiles (`tdpbf16ps` on bf16 "
    "roundings of the features, fp32 sums: a dozen tile products where SIMD spends thousands of instructions), "
    "offered where the workload allows bf16 products (dot_dtype) and the CPU has AMX-BF16 and AVX512-BF16 "
    "(the rounding, `vcvtne2ps2bf16`). The registry loads an 'amx' kernel only where Linux grants the tiles."))
AMX_CPU_FEATURES = ("amx-tile", "amx-bf16", "avx512bf16")  # LLVM names
AMX_MIN_SAMPLES = 8  # per parallel task: a tile configuration per sample costs a third of the stage (WHOLE_MODEL.md)
INDEX_PREFETCH = Choice("index_prefetch", (8, 0, 16), doc=(
    "Samples ahead whose indices are prefetched (their offsets twice as far): the kernel reads the table-major "
    "offsets and indices sample by sample, one stream per table, more streams than the hardware prefetchers "
    "follow, so each new line of them is a miss that the row prefetch then waits on; 0 leaves them to the "
    "hardware."))

PREFETCH = Choice("prefetch", (1, 0, 2, 4, 8), doc=(
    "Software-prefetch distance in samples: before a bag is pooled, the rows of the same table's bag that many "
    "samples ahead are prefetched (its indices are in the stream the kernel reads anyway). Sample by sample, "
    "one sample ahead already keeps a bag per table in flight, and the next sample's rows arrive while this "
    "one computes its dot products; table by table (order), it is that many bags ahead in the stream "
    "being pooled. Small rows (int8) are pooled fast and want several samples ahead; 0 disables it."))
ORDER = Choice("order", ("sample", "table"), doc=(
    "The order a task pools its bags in: 'sample', each sample's bags (one per table) then its dot products "
    "(its features stay in L1); 'table', the bags of a block of samples (table_block) table by table, then each "
    "sample's dot products from the block's staged features. Sample by sample, consecutive bags jump between "
    "tables, their index streams and rows; table by table, a task walks one table's index stream and rows at a "
    "time, which the prefetch follows a few bags ahead (benchmarks/WHOLE_MODEL.md). One row per bag, the bags' "
    "misses already overlap sample by sample."))
TABLE_BLOCK = Choice("table_block", (256, 16, 64, 512, 1024), doc=(
    "Samples whose bags one task pools table by table (order 'table'): longer blocks stay longer in each "
    "table's stream (fewer restarts of the prefetch), shorter ones keep the staged features (block x features "
    "x D floats) nearer and give more tasks to spread over cores."))
ACCUMULATOR = Choice("accumulator", ("local", "scratch"), doc=(
    "Where a bag is pooled: 'local' sums its rows in a D-float accumulator on the stack (LLVM keeps it in "
    "registers) and copies it once into the sample's staged features; 'scratch' adds each row straight into "
    "the staged features (no copy, but a load and store of the sums per row where LLVM cannot prove the "
    "buffer apart from the tables)."))

_STACK_FLOATS = 256  # as the interaction kernel: a block's accumulators stay on the stack (registers) below 1 KiB


def _chunks(w: Workload, lanes: int) -> int:
    return padded_dim(w, lanes) // lanes


def space(w: Workload, target: Any) -> Space:
    """The CPU space: threading and samples per task; the dot products' lanes, pair block, reduction and D
    unroll (as the interaction's); the gather's prefetch distance and lines, row unroll and accumulator."""
    check_llvm("embedding_interaction", target)
    lanes = [v for v in LANES.options if v <= max(4, next_pow2(w.dim)) and (v > 1 or w.dim < 8)]  # as interaction
    unrolls = [u for u in DIM_UNROLL.options if any(_chunks(w, v) % u == 0 for v in lanes)]
    amx = amx_fits(w) and intrinsics.cpu_has(target, *AMX_CPU_FEATURES)
    whole_row = max(prefetch_lines(w.rows_format).options)
    blocks = TABLE_BLOCK.only(b for b in TABLE_BLOCK.options if b <= max(w.batch, min(TABLE_BLOCK.options)))

    def simd_knobs_for_simd(c: Config) -> bool:  # AMX's dot products have no lanes, pair block or reduction
        pinned = c[LANES] == lanes[0] and all(c[k] == k.options[0] for k in (PAIRS_PER_BLOCK, HSUM, DIM_UNROLL))
        return c[INTRINSIC] == "simd" or pinned

    return Space(
        [THREADING, SAMPLES_PER_TASK, LANES.only(lanes), PAIRS_PER_BLOCK, HSUM, DIM_UNROLL.only(unrolls),
         PREFETCH, prefetch_lines(w.rows_format), UNROLL.only(u for u in UNROLL.options if u <= w.pooling[1] or u == 1),
         ACCUMULATOR, INTRINSIC.only(INTRINSIC.options if amx else ("simd",)), INDEX_PREFETCH, ORDER,
         blocks],
        [
            Constraint("the SIMD dot products' knobs only matter for intrinsic simd", simd_knobs_for_simd),
            Constraint(f"AMX loads its tile configuration once per task (about a thousand cycles): tasks of "
                       f"{AMX_MIN_SAMPLES} samples or more", lambda c: c[INTRINSIC] == "simd" or c[ORDER] == "table"
                       or c[THREADING] == "serial" or c[SAMPLES_PER_TASK] >= AMX_MIN_SAMPLES),
            Constraint("AMX's dot products are short, so the gather's latency shows: rows prefetched whole",
                       lambda c: c[INTRINSIC] == "simd" or c[PREFETCH] == 0 or c[PREFETCH_LINES] == whole_row),
            Constraint("samples_per_task only matters for parallel threading sample by sample (table by table "
                       "a task is a table block)", lambda c: (c[THREADING] == "parallel" and c[ORDER] == "sample")
                       or c[SAMPLES_PER_TASK] == SAMPLES_PER_TASK.options[0]),
            Constraint(f"pairs_per_block x lanes accumulators must stay under {_STACK_FLOATS} floats (1 KiB)",
                       lambda c: c[PAIRS_PER_BLOCK] * c[LANES] < _STACK_FLOATS),
            Constraint("dim_unroll must divide the number of D chunks (D padded to the lanes, / lanes)",
                       lambda c: _chunks(w, c[LANES]) % c[DIM_UNROLL] == 0),
            Constraint("table_block only matters table by table",
                       lambda c: c[ORDER] == "table" or c[TABLE_BLOCK] == blocks.options[0]),
            Constraint("prefetch_lines only matters with prefetch on",
                       lambda c: c[PREFETCH] > 0 or c[PREFETCH_LINES] == PREFETCH_LINES.options[0]),
        ],
        paths=[INTRINSIC.name, ORDER.name])  # AMX's few configs sampled as often as SIMD's many


def schedule(sch: Any, w: Workload, cfg: Config) -> None:
    """Samples (or table blocks) over cores; SIMD over the staging copies and the accumulator's setting; the dot
    products as the interaction's (D chunks split by dim_unroll, the pair block's accumulators unrolled, lanes
    vectorised)."""
    vec, unroll = cfg[LANES], cfg[DIM_UNROLL]
    if _chunks(w, vec) % unroll:
        raise InvalidConfig(f"dim_unroll {unroll} does not divide the {_chunks(w, vec)} chunks of {vec} lanes")
    if cfg[PAIRS_PER_BLOCK] * vec >= _STACK_FLOATS:
        raise InvalidConfig(f"pairs_per_block {cfg[PAIRS_PER_BLOCK]} x lanes {vec} accumulators exceed the stack")
    if cfg[ORDER] == "table":
        (task_loop,) = sch.get_loops(sch.get_sblock("task"))
        if cfg[THREADING] == "parallel":
            sch.parallel(task_loop)
    else:
        (b,) = sch.get_loops(sch.get_sblock("sample"))
        if cfg[THREADING] == "parallel":
            tasks, _ = sch.split(b, [None, cfg[SAMPLES_PER_TASK]])
            sch.parallel(tasks)
    lanes = feature_lanes(w)
    simd(sch, sch.get_sblock("acc_init"), lanes)
    for name in ("stage_x",) + (("stage_bag",) if cfg[ACCUMULATOR] == "local" else ()):
        vectorize_innermost(sch, sch.get_sblock(name), lanes)
    if padded_dim(w, vec) > w.dim:
        sch.vectorize(sch.get_loops(sch.get_sblock("stage_pad"))[-1])

    if cfg[INTRINSIC] == "amx":  # the Gram matrix's tiles: written whole in the TVMScript
        return
    dot = sch.get_sblock("dot")
    c, q, lane = sch.get_loops(dot)[-3:]
    _, ci = sch.split(c, [None, unroll])
    if vec > 1:
        sch.vectorize(lane)
    sch.unroll(q)  # the block's accumulators: unrolled, they are registers
    if unroll > 1:
        sch.unroll(ci)
    init = sch.decompose_reduction(dot, sch.get_loops(dot)[-4])
    iq, il = sch.get_loops(init)[-2:]
    sch.unroll(iq)
    if vec > 1:
        sch.vectorize(il)


def lower(w: Workload, cfg: Config, target: Any) -> Any:
    """The scheduled IRModule of one CPU config: what `tvm.compile` builds."""
    from tvm.s_tir import Schedule

    check_llvm("embedding_interaction", target)
    amx_every = 0
    if cfg[INTRINSIC] == "amx":  # the tile configuration at each task's first sample (serial: the first only)
        task = cfg[TABLE_BLOCK] if cfg[ORDER] == "table" else cfg[SAMPLES_PER_TASK]
        amx_every = task if cfg[THREADING] == "parallel" else 1 << 30
    # scheduled on a copy: TVM's schedule edits in place the nodes it finds referenced once, and below the
    # module the cache holds they are (the table order's row loop was split in the cached module itself)
    sch = Schedule(copy.deepcopy(compute(w, cfg[LANES], cfg[PAIRS_PER_BLOCK], cfg[HSUM], cfg[PREFETCH],
                                         cfg[PREFETCH_LINES], cfg[UNROLL], cfg[ACCUMULATOR] == "local", amx_every,
                                         cfg[INDEX_PREFETCH], cfg[TABLE_BLOCK] if cfg[ORDER] == "table" else 0)))
    schedule(sch, w, cfg)
    return sch.mod
