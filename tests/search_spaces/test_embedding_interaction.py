"""The fused embedding bags + dot interaction template against PyTorch (the batched embedding bag, then DLRM's
interaction), for its configs, table formats and edge cases; its bounds checks and its CPU-only device kinds."""

from __future__ import annotations

import random

import pytest
from conftest import cpu_flags
import torch

import search_spaces
from autotune.build import compile_module
from autotune.runtime import BoundKernel, expected, expected_call, judge
from autotune.task import make_task
from search_spaces import IndexOutOfRange, InvalidConfig, InvalidDtype, InvalidInput, WorkloadError
from search_spaces.batched_embedding_bag import workload as bags
from search_spaces.batched_embedding_bag.torch_op import layout
from search_spaces.embedding_interaction import Workload, cpu
from search_spaces.interaction.workload import dot_interaction

TPL = search_spaces.get("embedding_interaction")

CASES = {
    # D = 12: not a multiple of the 8- and 16-lane options (the staged features are zero padded); empty bags
    "multi-hot-dim12": dict(rows=(50, 7, 300), dim=12, batch=5, pooling=(0, 3)),
    "one-hot-self": dict(rows=(50, 7, 300, 20), dim=16, batch=7, pooling=(1, 1), self_interaction=True),
    "int8-int32-index": dict(rows=(50, 7), dim=8, batch=9, pooling=(2, 6), dtype="int8", index_dtype="int32"),
    "float16": dict(rows=(50, 7, 30), dim=20, batch=4, pooling=(0, 4), dtype="float16"),
    "bfloat16-9-tables": dict(rows=(40,) * 9, dim=32, batch=6, pooling=(1, 8), dtype="bfloat16"),
}


def _kernel(task, cfg):
    return BoundKernel(task.template, task.workload, cfg, compile_module(task, cfg)["main"], on_gpu=False)


def _unfused(x, weight, table_offsets, indices, offsets, w):
    """PyTorch's pair written out: one embedding_bag per table on its rows, stacked, then DLRM's interaction."""
    rows, ends = table_offsets.tolist(), offsets[::w.batch].tolist()
    table = bags.float32_table(weight, w.dtype)
    ly = torch.stack([torch.nn.functional.embedding_bag(
        indices[ends[t]:ends[t + 1]], table[rows[t]:rows[t + 1]], offsets[t * w.batch:(t + 1) * w.batch] - ends[t],
        mode="sum") for t in range(w.tables)], dim=1)
    return dot_interaction(x, ly, w.self_interaction)


@pytest.mark.parametrize("case", CASES)
def test_matches_pytorch_for_the_default_and_sampled_configs(case):
    task = make_task("embedding_interaction", "cpu", **CASES[case])
    w = task.workload
    inputs = TPL.inputs(w, 3)
    exp = expected(TPL, w, *inputs)
    torch.testing.assert_close(exp.pytorch, _unfused(*inputs, w), rtol=1e-5, atol=1e-5)
    assert exp.pytorch.shape == (w.batch, w.dim + w.dots.pairs)
    rng = random.Random(sum(map(ord, case)))
    for cfg in dict.fromkeys([task.space.default(), task.space.sample(rng)]):
        out = _kernel(task, cfg)(*inputs)
        assert judge(out, exp).why is None, f"{cfg}: {judge(out, exp).why}"


def test_both_accumulators_and_unrolled_rows_agree_with_pytorch():
    task = make_task("embedding_interaction", "cpu", **CASES["multi-hot-dim12"])
    w = task.workload
    inputs = TPL.inputs(w, 4)
    exp = expected(TPL, w, *inputs)
    base = task.space.default().as_dict()
    for change in ({"accumulator": "scratch", "unroll": 2}, {"accumulator": "local", "unroll": 2, "prefetch": 0},
                   {"hsum": "tree", "pairs_per_block": 2, "lanes": 4, "threading": "serial"}):
        cfg = task.space.from_json({**base, **change})
        out = _kernel(task, cfg)(*inputs)
        assert judge(out, exp).why is None, f"{change}: {judge(out, exp).why}"


@pytest.mark.parametrize("case", ["multi-hot-dim12", "int8-int32-index", "bfloat16-9-tables"])
def test_table_blocks_agree_with_pytorch(case):
    """Bags pooled table by table in blocks of samples: a block larger than the batch, blocks whose last is
    partial (37 = 2 x 16 + 5), serial and parallel, with and without the row and index prefetches."""
    for batch in (CASES[case]["batch"], 37):
        task = make_task("embedding_interaction", "cpu", **{**CASES[case], "batch": batch})
        w = task.workload
        inputs = TPL.inputs(w, 6)
        exp = expected(TPL, w, *inputs)
        base = task.space.default().as_dict()
        for change in ({"table_block": 16, "prefetch": 2}, {"table_block": 16, "threading": "serial"},
                       {"table_block": 16, "prefetch": 0, "index_prefetch": 0, "accumulator": "scratch"}):
            change = {"order": "table", "samples_per_task": 8, **change}
            cfg = task.space.from_json({**base, **change})
            out = _kernel(task, cfg)(*inputs)
            assert judge(out, exp).why is None, f"batch {batch}, {change}: {judge(out, exp).why}"


AMX_FLAGS = {"amx_tile", "amx_bf16", "avx512_bf16"}
AMX_CASES = {
    # one row block of features (11: MT = 1), two (27, the DLRM's; 32, the most), the diagonal kept, 1-3 k-steps
    "11-features-self-dim32": dict(rows=(50,) * 10, dim=32, batch=33, pooling=(0, 3), self_interaction=True),
    "27-features-dim64": dict(rows=(30, 7, 300) * 8 + (20, 5), dim=64, batch=37, pooling=(1, 1), dtype="float16"),
    "32-features-dim96": dict(rows=(9,) * 31, dim=96, batch=18, pooling=(2, 2), index_dtype="int32"),
    # int8 rows: judged on the float values' magnitude (magnitude_args), not the rows' bytes
    "27-features-int8": dict(rows=(30, 7, 300) * 8 + (20, 5), dim=64, batch=21, pooling=(1, 3), dtype="int8"),
}


@pytest.mark.parametrize("case", AMX_CASES)
def test_amx_dot_products_are_the_gram_matrix_of_bf16_rounded_features(case):
    """The AMX path against the interaction of the features rounded to bf16, summed in float64: equal up to fp32
    sums (a tile or pair layout wrong anywhere moves entries by far more), the dense part copied exactly; and
    within the workload's tolerance of the exact result. Many tasks per thread and a serial loop: each task
    loads the tile configuration before its first tile. (int8 rows pool with one rounding per FMA where the
    reference dequantizes first: a feature a float32 ulp apart may round to the other bf16, so only the
    tolerance holds there.)"""
    if not AMX_FLAGS <= cpu_flags():
        pytest.skip("this CPU has no AMX-BF16")
    task = make_task("embedding_interaction", "cpu", **AMX_CASES[case], dot_dtype="bfloat16")
    w = task.workload
    x, weight, table_offsets, indices, offsets = inputs = TPL.inputs(w, 5)
    ly = bags.reference(w.bags, weight, table_offsets, indices, offsets).view(w.batch, w.tables, w.dim)
    rounded = dot_interaction(x.bfloat16().double(), ly.bfloat16().double(), w.self_interaction)[:, w.dim:]
    exp = expected(TPL, w, *inputs)
    amx = [c for c in task.space if c.as_dict()["intrinsic"] == "amx"]
    picks = {(d["threading"], d["samples_per_task"]): c for c in amx for d in [c.as_dict()] if d["order"] == "sample"}
    assert min(spt for threading, spt in picks if threading == "parallel") == 8  # ldtilecfg amortised
    blocked = next(c for c in amx if c.as_dict()["order"] == "table" and c.as_dict()["table_block"] == 16
                   and c.as_dict()["threading"] == "parallel")
    for cfg in (picks[("parallel", 8)], picks[("parallel", 64)], picks[("serial", 8)], blocked):
        out = _kernel(task, cfg)(*inputs)
        assert torch.equal(out[:, :w.dim], x), str(cfg)
        if w.dtype != "int8":
            torch.testing.assert_close(out[:, w.dim:].double(), rounded, rtol=1e-5, atol=1e-4, msg=str(cfg))
        assert judge(out, exp).why is None, f"{cfg}: {judge(out, exp).why}"


def test_amx_dot_products_are_offered_only_where_bf16_products_are_allowed_and_the_cpu_has_them():
    def intrinsics(device, **fields):
        task = make_task("embedding_interaction", device, **{"rows": (9,) * 26, "dim": 64, "batch": 4,
                                                            "pooling": (1, 1), **fields})
        assert task.space.paths[0] == "intrinsic"
        return {path[0] for path in task.space.paths_present()}  # the intrinsics some valid config takes

    assert intrinsics("cpu:sapphirerapids", dot_dtype="bfloat16") == {"simd", "amx"}
    assert intrinsics("cpu:sapphirerapids") == {"simd"}  # fp32 products asked for
    assert intrinsics("cpu:znver4", dot_dtype="bfloat16") == {"simd"}
    assert intrinsics("cpu:sapphirerapids", dot_dtype="bfloat16", rows=(9,) * 32) == {"simd"}  # 33 features
    task = make_task("embedding_interaction", "cpu:sapphirerapids", rows=(9,) * 26, dim=64, batch=4, pooling=(1, 1),
                     dot_dtype="bfloat16")
    simd_only = ("lanes", "pairs_per_block", "hsum", "dim_unroll")  # pinned on the AMX path: no duplicate configs
    amx = {tuple(c.as_dict()[k] for k in simd_only) for path in task.space.paths_present() if path[0] == "amx"
           for c in task.space.configs_of_path(path)}
    assert len(amx) == 1
    with pytest.raises(WorkloadError, match="dot_dtype"):
        Workload(rows=(9,), dim=8, batch=2, pooling=(1, 1), dot_dtype="float16")
    exact, rounded = (TPL.tolerance(Workload(rows=(9,), dim=8, batch=2, pooling=(1, 1), dot_dtype=d))
                      for d in ("float32", "bfloat16"))
    assert rounded[0] > exact[0] + 2 ** -8 and rounded[1] == exact[1]


def test_a_bad_index_or_bag_is_flagged_and_named_for_the_operator():
    task = make_task("embedding_interaction", "cpu", **CASES["multi-hot-dim12"])
    w = task.workload
    kernel = _kernel(task, task.space.default())
    x, weight, table_offsets, indices, offsets = TPL.inputs(w, 5)
    bad = indices.clone()
    bad[-1] = 300  # table 2 has 300 rows
    with pytest.raises(IndexOutOfRange, match="embedding_interaction: index 300 .* out of range for table 2"):
        kernel(x, weight, table_offsets, bad, offsets)
    falling = offsets.clone()
    falling[3] = falling[2] - 1 if falling[2] > 0 else -1
    with pytest.raises(InvalidInput, match="embedding_interaction: offsets must be non-decreasing"):
        kernel(x, weight, table_offsets, indices, falling)
    args, out = TPL.kernel_args(w, task.space.default(), (), x, weight, table_offsets, indices, falling)
    out.fill_(7.0)
    kernel.func(*args)
    assert bool((out == 0).all())  # offsets flagged: nothing gathered, zeros written (not what memory held)


def test_the_kernel_reads_per_table_lists_where_they_are():
    """The op's per-table lists go to the kernel as they are (their addresses: no copy into one layout) and give
    the TBE layout's output bit for bit: tensors of their own, views into one buffer (a KeyedJaggedTensor's
    values), a strided index view and an int32 table among int64 ones (converted for the call)."""
    task = make_task("embedding_interaction", "cpu", **CASES["multi-hot-dim12"])
    w = task.workload
    kernel = _kernel(task, task.space.default())
    x, weight, table_offsets, indices, offsets = TPL.inputs(w, 6)
    want = kernel(x, weight, table_offsets, indices, offsets)
    ends = offsets[::w.batch].tolist()
    lists = [indices[ends[t]:ends[t + 1]] for t in range(w.tables)]  # views of one buffer
    offs = [offsets[t * w.batch:(t + 1) * w.batch] - ends[t] for t in range(w.tables)]
    assert torch.equal(kernel(x, weight, table_offsets, lists, offs), want)
    own = [i.clone() for i in lists]
    own[1] = torch.stack([own[1], own[1]], 1)[:, 0]  # strided
    own[2] = own[2].int()
    assert not own[1].is_contiguous()
    assert torch.equal(kernel(x, weight, table_offsets, own, [o.clone() for o in offs]), want)
    columns, (held, _) = TPL.workload.bag_columns(w, w.batch, lists, offs)
    assert columns[0].tolist() == [i.data_ptr() for i in lists]  # read in place
    assert columns[3].tolist() == [i.numel() for i in lists]


def test_offsets_past_the_indices_are_flagged_not_read():
    """TBE offsets that run past the indices (or a table whose bags start before its first index) are flagged by
    the kernel's check of each table's boundaries: nothing is gathered."""
    task = make_task("embedding_interaction", "cpu", **CASES["multi-hot-dim12"])
    w = task.workload
    kernel = _kernel(task, task.space.default())
    x, weight, table_offsets, indices, offsets = TPL.inputs(w, 7)
    for position, value in ((-1, indices.numel() + 1000), (w.batch, -1), (0, 1)):
        bad = offsets.clone()
        bad[position] = value
        with pytest.raises(InvalidInput, match="embedding_interaction: .*offsets"):
            kernel(x, weight, table_offsets, indices, bad)


def test_the_cancellation_case_passes_a_correct_kernel_and_fails_a_perturbed_one():
    """`autotune check`'s case of x nearly orthogonal to the first table's bags, at magnitude 1e3: judged against
    float64 with a bound scaled by the terms, the kernel passes; its output nudged by 1e-4 of the terms fails."""
    task = make_task("embedding_interaction", "cpu", shape=TPL.TEST_SHAPE)
    w = task.workload
    binding = TPL.torch_binding()
    name, args, kwargs = next(c for c in binding.cases(w, 0, 0) if c[0].startswith("cancelling"))
    x, weight, table_offsets, indices, offsets = args  # the op's per-table lists, passed in TBE's layout
    exp = expected_call(TPL, w, binding.op, *args, **kwargs)
    idx, offs, _, _ = layout(indices, offsets, kwargs["include_last_offset"])
    out = _kernel(task, task.space.default())(x, weight, table_offsets, idx, offs)
    assert judge(out, exp).why is None
    pair = w.dim  # (x, table 0): the cancelling dot product
    value, magnitude = exp.float64.value[:, pair], exp.float64.magnitude[:, pair]
    assert bool((magnitude > 100 * value.abs()).any())  # it does cancel
    nudged = out.clone()
    nudged[:, pair] += (1e-3 * magnitude).float()
    assert judge(nudged, exp).why is not None


def test_workload_fields_are_the_bags_and_the_interactions():
    w = Workload.from_shape("rows=100x3+7,dim=8,batch=4,pooling=1-3,dist=zipf:1.2,self=1,dtype=int8")
    assert w.tables == 4 and w.rows == (100, 100, 100, 7) and w.pooling == (1, 3) and w.zipf_exponent == 1.2
    assert w.bags.mode == "sum" and w.bags.rows == w.rows and w.bags.dtype == "int8"
    assert w.dots.features == 5 and w.dots.self_interaction and w.out_dim == 8 + 15
    assert Workload.from_json(w.to_json()) == w
    assert TPL.Workload.from_shape(TPL.EXAMPLE_SHAPE).tables == 26
    for bad in ("rows=10,dim=0,batch=4,pooling=1", "rows=10,dim=8,batch=4,pooling=1,dtype=int4",
                "rows=10,dim=6,batch=4,pooling=1,dtype=int8", "rows=10,dim=8,batch=0,pooling=1"):
        with pytest.raises(WorkloadError):
            Workload.from_shape(bad)


def test_check_inputs_names_the_operator_for_the_bags_and_x():
    w = TPL.Workload.from_shape(TPL.TEST_SHAPE)
    x, weight, table_offsets, indices, offsets = TPL.inputs(w, 0)
    TPL.check_inputs(w, x, weight, table_offsets, indices, offsets)
    with pytest.raises(InvalidDtype, match="embedding_interaction: x must be float32"):
        TPL.check_inputs(w, x.double(), weight, table_offsets, indices, offsets)
    with pytest.raises(InvalidInput, match=r"embedding_interaction: offsets must hold tables x batch \+ 1"):
        TPL.check_inputs(w, x[:-1], weight, table_offsets, indices, offsets)
    with pytest.raises(InvalidDtype, match="embedding_interaction: indices and offsets must be int64"):
        TPL.check_inputs(w, x, weight, table_offsets, indices.int(), offsets)


def test_the_pooling_order_is_a_path_and_table_blocks_fit_the_batch():
    """Sample and table order are sampled as often as each other (a path each), whatever their shares of the
    space; a block only matters table by table, and blocks past the batch are one block (the smallest kept)."""
    space = make_task("embedding_interaction", "cpu", rows=(9,) * 4, dim=16, batch=300, pooling=(8, 8)).space
    assert space.paths == ("intrinsic", "order")
    configs = [c.as_dict() for c in space]
    assert {c["table_block"] for c in configs if c["order"] == "table"} == {16, 64, 256}
    assert {c["table_block"] for c in configs if c["order"] == "sample"} == {256}
    assert {c["samples_per_task"] for c in configs if c["order"] == "table"} == {8}  # the block is the task
    rng = random.Random(0)
    orders = [space.sample(rng).as_dict()["order"] for _ in range(400)]
    assert 150 < orders.count("table") < 250
    small = make_task("embedding_interaction", "cpu", rows=(9,) * 4, dim=16, batch=5, pooling=(8, 8)).space
    assert next(k for k in small.knobs if k.name == "table_block").values == (16,)


def test_it_runs_on_cpus_only():
    assert TPL.DEVICE_KINDS == ("cpu",)
    with pytest.raises(InvalidConfig, match="embedding_interaction runs on CPUs only"):
        make_task("embedding_interaction", "cuda:sm_90", shape=TPL.TEST_SHAPE).space
    space = make_task("embedding_interaction", "cpu", shape=TPL.TEST_SHAPE).space
    assert {k.name for k in space.knobs} >= {"prefetch", "accumulator", "lanes", "pairs_per_block", "samples_per_task"}
    one_hot = make_task("embedding_interaction", "cpu", rows=(9, 9), dim=8, batch=2, pooling=(1, 1)).space
    assert next(k for k in one_hot.knobs if k.name == "unroll").values == (1,)  # one row per bag: no unroll
    gpu = make_task("embedding_interaction", "cuda:sm_90", shape=TPL.TEST_SHAPE)
    with pytest.raises(InvalidConfig, match="no CPU schedule for target kind 'cuda'"):
        cpu.lower(gpu.workload, space.default(), gpu.device.target())


def test_check_cases_keep_their_tables_small_and_their_batches_matched():
    from search_spaces.embedding_interaction.torch_op import CASE_ROWS

    w = Workload(rows=(3 * CASE_ROWS, 5), dim=4, batch=3, pooling=(1, 2))
    for name, (x, weight, table_offsets, indices, offsets), kwargs in TPL.torch_binding().cases(w, 0, 1):
        rows = table_offsets.diff().tolist()
        assert rows[0] <= CASE_ROWS + 7 and rows[1] <= 5 + 7, name  # ("tables of 7 rows more")
        assert x.shape == (offsets[0].numel() - int(kwargs["include_last_offset"]), w.dim), name
