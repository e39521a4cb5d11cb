"""The table-batched embedding-bag template against PyTorch (one embedding_bag per table, then cat)."""

import json
import random
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from autotune.build import compile_module
from autotune.targets import resolve
from autotune.task import make_task
from gpu_build import ARCHS, assert_built_within_limits, build_sample
from search_spaces import WorkloadError
from search_spaces import batched_embedding_bag as tbe
from search_spaces import embedding_bag as eb
from search_spaces.batched_embedding_bag import cpu as tbe_cpu, cuda as tbe_cuda
from search_spaces.embedding_bag import cpu as eb_cpu, cuda as eb_cuda
from search_spaces.template import IndexOutOfRange, InvalidInput

# three tables of different sizes, pooling from 0 (empty bags), dim 16
SMALL = dict(rows=(50, 7, 300), dim=16, batch=9, pooling=(0, 6))
CASES = {
    "sum-int64": dict(),
    "sum-int32-zipf": dict(index_dtype="int32", distribution="zipf", zipf_exponent=1.2),
    "mean-int32": dict(mode="mean", index_dtype="int32"),
    "max-int64": dict(mode="max"),
}


def run(task, cfg, *tensors):
    func = compile_module(task, cfg)["main"]
    args, out = task.kernel_args(cfg, (), tensors)
    func(*args)
    return out


def per_table_loop(weight, table_offsets, indices, offsets, batch, mode):
    """The semantics written out bag by bag, independently of the template."""
    tables = table_offsets.numel() - 1
    out = torch.zeros(batch, tables * weight.shape[1])
    for t in range(tables):
        for b in range(batch):
            lo, hi = int(offsets[t * batch + b]), int(offsets[t * batch + b + 1])
            if hi == lo:
                continue
            rows = weight[int(table_offsets[t]) + indices[lo:hi].long()]
            pooled = {"sum": rows.sum(0), "mean": rows.mean(0), "max": rows.max(0).values}[mode]
            out[b, t * weight.shape[1]:(t + 1) * weight.shape[1]] = pooled
    return out


def covering_configs(space, rng):
    """A few configs that together take every value of every knob: the default, then a greedy cover (of a few
    random configs, the one that takes most of the values not yet taken; about 7 configs, not 12)."""
    missing = {(k.name, v) for k in space.knobs for v in k.values}
    configs = [space.default()]
    missing -= set(configs[0].items)
    for _ in range(30):
        if not missing:
            break
        cfg = max((space.sample(rng) for _ in range(300)), key=lambda c: len(set(c.items) & missing))
        assert missing & set(cfg.items), f"no sampled config has any of {sorted(missing)}"
        configs.append(cfg)
        missing -= set(cfg.items)
    assert not missing, missing
    return configs


# ---- CPU kernels -------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_cpu_matches_torch_for_default_and_random_configs(case):
    task = make_task("batched_embedding_bag", "cpu", **SMALL, **CASES[case])
    rng = random.Random(len(case))
    configs = {task.space.default()} | {task.space.sample(rng) for _ in range(2)}
    tensors = tbe.inputs(task.workload, seed=3)
    tbe.check_inputs(task.workload, *tensors)
    ref = tbe.reference(task.workload, *tensors)
    for cfg in configs:
        torch.testing.assert_close(run(task, cfg, *tensors), ref, rtol=1e-5, atol=1e-5, msg=str(cfg))


def test_cpu_every_knob_value_builds_and_matches():
    task = make_task("batched_embedding_bag", "cpu", rows=(40, 3, 90), dim=32, batch=7, pooling=(0, 12))
    tensors = tbe.inputs(task.workload, seed=1)
    ref = tbe.reference(task.workload, *tensors)
    for cfg in covering_configs(task.space, random.Random(0)):
        torch.testing.assert_close(run(task, cfg, *tensors), ref, rtol=1e-5, atol=1e-5, msg=str(cfg))


def test_cpu_tables_of_their_own_pooling_in_either_order_of_the_pairs():
    """Tables pooling differently (one heavy, as MLPerf's 100-id feature): both orders of the (table, bag) pairs,
    over tasks of one bag and of many, compute the reference; uniform tables get no order to choose."""
    task = make_task("batched_embedding_bag", "cpu", rows=(40, 3, 90, 500), dim=16, batch=11, pooling=(0, 30),
                     table_pooling=((1, 1), (0, 2), (30, 30), (3, 5)))
    orders = {c.as_dict()["order"] for c in task.space}
    assert orders == {"tables", "bags", "even"} and task.space.default().as_dict()["order"] == "tables"
    tensors = tbe.inputs(task.workload, seed=2)
    sizes = (tensors[3][1:] - tensors[3][:-1]).view(4, 11)
    assert sizes[0].tolist() == [1] * 11 and sizes[2].tolist() == [30] * 11 and sizes[1].max() <= 2
    ref = tbe.reference(task.workload, *tensors)
    for order in ("tables", "bags", "even"):
        for cfg in [c for c in task.space if c.as_dict()["order"] == order][::97][:3]:
            torch.testing.assert_close(run(task, cfg, *tensors), ref, rtol=1e-5, atol=1e-5, msg=str(cfg))
    uniform = make_task("batched_embedding_bag", "cpu", **SMALL)
    assert {c.as_dict()["order"] for c in uniform.space} == {"tables"}


@pytest.mark.parametrize("dtype, dim", [("float32", 16), ("int8", 128)])
def test_cpu_even_runs_pool_every_bag_once_whatever_the_batch_and_bags(dtype, dim):
    """The 'even' order finds its runs' bounds from the offsets at run time: batches of fewer pairs than runs
    (most runs empty), runs ending inside a table or on a table's edge, empty bags (the first, the last, whole
    tables), one bag holding most of the indices: each bag pooled once, as the reference (an int8 row of dim 128
    prefetched whole: 3 lines). (A call of no index at all never reaches a kernel: the op's route.)"""
    task = make_task("batched_embedding_bag", "cpu", rows=(40, 3, 90), dim=dim, batch=11, pooling=(0, 30),
                     table_pooling=((1, 1), (0, 2), (30, 30)), dtype=dtype)
    rng = np.random.default_rng(0)
    weight = tbe.inputs(task.workload, seed=1)[0]
    table_offsets = torch.tensor([0, 40, 43, 133])
    layouts = {"batch 1": np.array([[1], [0], [30]]), "batch 2": np.array([[1, 0], [2, 2], [0, 30]]),
               "batch 200": rng.integers(0, 31, size=(3, 200))}
    empty = rng.integers(0, 4, size=(3, 90))
    empty[:, 0], empty[:, -1], empty[1] = 0, 0, 0
    layouts["empty bags and a table of them"] = empty
    heavy = np.ones((3, 70), dtype=np.int64)
    heavy[2, 35] = 3000
    layouts["one bag of most indices"] = heavy
    tables = task.space.default()
    configs = [task.space.from_json({**tables.as_dict(), "order": "even", "prefetch": 16,
                                     "prefetch_lines": 1 if dtype == "float32" else 3})]
    assert tables.as_dict()["order"] == "tables"
    rtol, atol = tbe.tolerance(task.workload)
    for name, sizes in layouts.items():
        indices = torch.from_numpy(np.concatenate([rng.integers(0, r, size=int(n.sum()))
                                                   for r, n in zip((40, 3, 90), sizes)])).long()
        offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(sizes.reshape(-1))])).long()
        tensors = (weight, table_offsets, indices, offsets)
        want = run(task, tables, *tensors)
        longer = max(1.0, sizes.max() / task.workload.pooling[1])  # the tolerance is for bags of the workload's
        torch.testing.assert_close(want, tbe.reference(task.workload, *tensors), rtol=rtol, atol=atol * longer,
                                   msg=name)
        for cfg in configs:  # each bag's rows summed in the same order as table by table: the same bits
            assert torch.equal(run(task, cfg, *tensors), want), f"{name}: {cfg}"


def test_cpu_unrolled_pooling_never_reads_past_the_indices():
    """As embedding_bag's: the last table's last bag ends at a page boundary, unrolled by 4 (its tail predicated)."""
    from conftest import ending_at_a_guard_page

    task = make_task("batched_embedding_bag", "cpu", rows=(40, 90), dim=16, batch=2, pooling=(1, 9))
    cfg = task.space.from_json({**task.space.default().as_dict(), "unroll": 4})
    weight = torch.randn(130, 16)
    table_offsets = torch.tensor([0, 40, 130])
    local = [0, 1, 39, 7, 5] + [3, 89, 0, 17, 60, 61, 2]  # table 0: bags of 2 and 3; table 1: 4 and 3
    idx, keep = ending_at_a_guard_page(local)
    offs = torch.tensor([0, 2, 5, 9, 12])  # FBGEMM's layout: T*B+1 offsets, table 1's shifted by table 0's 5
    tensors = (weight, table_offsets, idx, offs)
    torch.testing.assert_close(run(task, cfg, *tensors), tbe.reference(task.workload, *tensors))
    del keep


@pytest.mark.parametrize("unroll", [1, 2, 4, 8])
def test_cpu_unrolled_rows_carry_no_predicate_on_the_bags_length(unroll):
    from test_embedding_bag import assert_whole_groups_and_a_remainder
    from tvm.s_tir import Schedule

    target = resolve("cpu").target()
    w = tbe.Workload(**SMALL)
    space = tbe.space(w, target)
    for knobs in (dict(prefetch=8), dict(accumulator="output")):
        cfg = space.make({**space.default().to_json(), "unroll": unroll, **knobs})
        assert_whole_groups_and_a_remainder(Schedule(tbe.lower(w, cfg, target)), unroll, str(cfg))


UNROLLED = {  # workload fields, knobs: the modes and accumulators through the group and the remainder blocks
    "sum-output": (dict(), dict(accumulator="output")),
    "mean-int32-prefetch": (dict(mode="mean", index_dtype="int32"), dict(prefetch=4)),
    "max-vector4": (dict(mode="max"), dict(vector=4)),
}


@pytest.mark.parametrize("unroll", [2, 4, 8])
@pytest.mark.parametrize("case", UNROLLED)
def test_cpu_unrolled_bags_of_every_length_pool_their_groups_and_the_rest(case, unroll):
    """As embedding_bag's: each table's bags of 0 to 2*unroll+1 rows (table 1's in the other order) match the
    bag-by-bag loop; a bad index in a group and in a remainder is flagged and adds nothing."""
    fields, knobs = UNROLLED[case]
    lengths = list(range(2 * unroll + 2))
    batch = len(lengths)
    task = make_task("batched_embedding_bag", "cpu", rows=(40, 9), dim=16, batch=batch, pooling=(0, lengths[-1]),
                     **fields)
    cfg = task.space.make({**task.space.default().to_json(), "unroll": unroll, **knobs})
    w = task.workload
    gen = torch.Generator().manual_seed(unroll)
    weight, table_offsets = torch.randn(49, 16, generator=gen), torch.tensor([0, 40, 49])
    offsets = torch.tensor([0] + lengths + lengths[::-1]).cumsum(0)
    split = int(offsets[batch])
    local = torch.cat([torch.randint(0, 40, (split,), generator=gen),
                       torch.randint(0, 9, (int(offsets[-1]) - split,), generator=gen)])
    dtype = getattr(torch, w.index_dtype)
    k = (task, cfg, compile_module(task, cfg)["main"])
    out, flag = call_raw(k, weight, table_offsets, local.to(dtype), offsets.to(dtype))
    assert flag == 0
    torch.testing.assert_close(out, per_table_loop(weight, table_offsets, local, offsets, batch, w.mode))
    bad = local.clone()
    first = int(offsets[batch - 1])  # table 0's last bag, then table 1's first: two groups and one row each
    bad[[first + 1, first + 2 * unroll, split + 2 * unroll]] = torch.tensor([40, -1, 9])
    out, flag = call_raw(k, weight, table_offsets, bad.to(dtype), offsets.to(dtype))
    assert flag == FLAGS.INDEX_ERROR
    if w.mode == "mean":  # a bad index counts, as a row of zeros (embedding_bag's with_absent_row)
        padded = torch.cat([weight[:40], torch.zeros(1, 16), weight[40:], torch.zeros(1, 16)])
        absent = bad.clone()
        absent[:split] = torch.where((bad[:split] < 0) | (bad[:split] >= 40), 40, bad[:split])
        absent[split:] = torch.where((bad[split:] < 0) | (bad[split:] >= 9), 9, bad[split:])
        ref = per_table_loop(padded, torch.tensor([0, 41, 51]), absent, offsets, batch, "mean")
    else:
        ref = skipping_bad(weight, table_offsets, bad, offsets, batch, w.mode)
    torch.testing.assert_close(out, ref)


def test_cpu_kernel_serves_other_batches_and_table_sizes_than_tuned():
    task = make_task("batched_embedding_bag", "cpu", **SMALL)
    other = tbe.Workload(rows=(5, 60, 11), dim=16, batch=21, pooling=(1, 5))
    tensors = tbe.inputs(other, seed=2)
    torch.testing.assert_close(run(task, task.space.default(), *tensors), tbe.reference(other, *tensors))


def test_cpu_all_bags_empty_give_zeros():
    task = make_task("batched_embedding_bag", "cpu", rows=(4, 6), dim=8, batch=3, pooling=(0, 0), mode="max")
    tensors = (torch.randn(10, 8), torch.tensor([0, 4, 10]), torch.zeros(0, dtype=torch.long),
               torch.zeros(7, dtype=torch.long))
    tbe.check_inputs(task.workload, *tensors)
    out = run(task, task.space.default(), *tensors)
    assert torch.equal(out, torch.zeros(3, 16))
    torch.testing.assert_close(out, tbe.reference(task.workload, *tensors))


# ---- GPU kernels: the loop nest on the CPU, then builds for real architectures ---------------------------
@pytest.mark.parametrize("case", ["sum-int64", "mean-int32", "max-int64"])
def test_gpu_loop_nest_computes_the_reference(case):
    """A GPU config's exact loop nest (steps, padding, masks, lane splits) with its thread loops left serial,
    compiled for the CPU: what the GPU runs, checked without a GPU."""
    import tvm

    w = tbe.Workload(**{**SMALL, "rows": (50, 7, 300, 1)}, **CASES[case])
    target = resolve("cuda:sm_90").target()
    space = tbe.space(w, target)
    rng = random.Random(7)
    configs = {space.default()} | {space.sample(rng) for _ in range(2)}
    tensors = tbe.inputs(w, seed=5)
    ref = tbe.reference(w, *tensors)
    for cfg in configs:
        func = tvm.compile(tbe_cuda.lower_emulation(w, cfg, target), target="llvm")["main"]
        args, out = tbe.kernel_args(w, cfg, (), *tensors)
        func(*args)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5, msg=str(cfg))


@pytest.mark.parametrize("arch", ARCHS)
def test_gpu_default_and_sampled_configs_build_within_limits(gpu_builder, arch):
    task, built = build_sample(gpu_builder, "batched_embedding_bag", arch, n=3, seed=1, **SMALL)
    assert_built_within_limits(task, built)
    assert built[0].lib is not None, built[0].error  # the default config builds


def test_gpu_builds_for_a_dim_that_is_not_a_multiple_of_4(gpu_builder):
    task, built = build_sample(gpu_builder, "batched_embedding_bag", "sm_90", n=1, seed=2, rows=(20, 5), dim=10,
                               batch=5, pooling=(0, 4), mode="mean", index_dtype="int32")
    assert_built_within_limits(task, built)


def test_gpu_space_default_is_a_coalesced_float4_config():
    w = tbe.Workload(rows=(1000, 10), dim=128, batch=2048, pooling=(20, 80))
    target = resolve("cuda:sm_90").target()
    space = tbe.space(w, target)
    cfg = space.default()
    # a warp per 512 B row
    assert (cfg[tbe_cuda.GPU_VECTOR], cfg[tbe_cuda.DIM_ITERS], cfg[tbe_cuda.THREADS]) == (4, 1, 256)
    assert cfg[tbe_cuda.GPU_UNROLL] > 1
    limit = int(target.attrs["max_threads_per_block"])
    assert all(c[tbe_cuda.THREADS] <= limit for c in space)


def test_knobs_are_embedding_bags_declared_once_with_this_kernels_defaults():
    """Every CPU knob but the order of (table, bag) pairs (the batched kernel's own), and the shared CUDA ones,
    are embedding_bag's (one doc, a subset of its options); the batched kernel keeps its own defaults: a local
    accumulator, table by table, 256-thread blocks, 4 rows per step."""
    w = tbe.Workload(**SMALL)
    cpu, gpu = resolve("cpu").target(), resolve("cuda:sm_90").target()
    shared = [(k, eb_cpu) for k in tbe.space(w, cpu).knobs if k.name != tbe_cpu.ORDER.name]
    shared += [(k, eb_cuda) for k in tbe.space(w, gpu).knobs if k.name not in ("dim_iters", "bag_rounds")]
    for knob, home in shared:
        original = getattr(home, knob.name.upper())
        assert knob.doc == original.doc and set(knob.values) <= set(original.options), knob.name
    assert tbe.space(w, cpu).default()[tbe_cpu.ACCUMULATOR] == "local"
    assert tbe.space(w, cpu).default()[tbe_cpu.ORDER] == "tables"
    single = eb.Workload(rows=50, dim=16, batch=9, pooling=(0, 6))
    assert eb.space(single, cpu).default()[eb_cpu.ACCUMULATOR] == "output"
    assert (tbe.space(w, gpu).default()[tbe_cuda.THREADS], tbe.space(w, gpu).default()[tbe_cuda.GPU_UNROLL]) == (256, 4)


# ---- workload, inputs, validation -----------------------------------------------------------------------
def test_shape_text_grouped_and_uniform_forms():
    w = tbe.Workload.from_shape("rows=1000000x4+100000x8+1000x14,dim=128,batch=2048,pooling=20-80,index=int32,"
                                "dist=zipf:1.3,mode=mean")
    assert w.tables == 26 and w.rows[:5] == (1000000,) * 4 + (100000,) and w.rows[-1] == 1000
    assert w.pooling == (20, 80) and w.index_dtype == "int32" and w.mode == "mean"
    assert w.distribution == "zipf" and w.zipf_exponent == 1.3
    assert tbe.Workload.from_json(w.to_json()) == w and tbe.Workload.from_json(w.to_json()).key() == w.key()
    uniform = tbe.Workload.from_shape("tables=26,rows=100000,dim=64,batch=8,pooling=3")
    assert uniform.rows == (100000,) * 26 and uniform.pooling == (3, 3)
    assert tbe.Workload.from_shape("rows=50+7+300,dim=16,batch=9,pooling=0-6") == tbe.Workload(**SMALL)
    assert tbe.Workload.from_shape(tbe.EXAMPLE_SHAPE).tables == 26
    # the cost model sees the same features whatever the number of tables
    assert w.numeric_features().keys() == tbe.Workload(**SMALL).numeric_features().keys()


def test_table_pooling_text_key_and_envelope():
    w = tbe.Workload.from_shape("rows=10x4,dim=8,batch=2,pooling=1-100,table_pooling=3+1-4+100+1")
    assert w.table_pooling == ((3, 3), (1, 4), (100, 100), (1, 1))
    assert tbe.Workload.from_json(json.loads(w.key())) == w
    same = tbe.Workload.from_shape("rows=10x4,dim=8,batch=2,pooling=2,table_pooling=2x4")
    assert same.table_pooling == () and same == tbe.Workload(rows=(10,) * 4, dim=8, batch=2, pooling=(2, 2))
    assert "table_pooling" not in same.key()  # tables pooling alike keep the keys records were logged under


@pytest.mark.parametrize("shape, message", [
    ("rows=10+20,dim=8,batch=2", "missing pooling"),
    ("rows=10+20,dim=8,batch=2,pooling=1-5,table_pooling=1+4", "envelope \\(1, 4\\)"),
    ("rows=10+20,dim=8,batch=2,pooling=1-5,table_pooling=5", "names 1 tables, rows 2"),
    ("rows=10+20,dim=8,batch=2,pooling=1-5,table_pooling=1+x", "table_pooling='1\\+x'"),
    ("rows=10x,dim=8,batch=2,pooling=1", "ROWS"),
    ("rows=ten,dim=8,batch=2,pooling=1", "ROWS"),
    ("rows=10x0,dim=8,batch=2,pooling=1", "count"),
    ("rows=10+0,dim=8,batch=2,pooling=1", ">= 1 rows"),
    ("tables=3,rows=10+20,dim=8,batch=2,pooling=1", "tables=3 but rows lists 2"),
    ("rows=10,dim=8,batch=2,pooling=5-3", "min <= max"),
    ("rows=10,dim=8,batch=2,pooling=3,mode=avg", "mode"),
    ("rows=10,dim=0,batch=2,pooling=3", "dim"),
    ("rows=10,dim=8,batch=2,pooling=3,index=int16", "index dtype"),
    ("rows=10,dim=8,batch=2,pooling=3,dist=zipf:x", "zipf"),
    ("rows=10,dim=8,batch=2,pooling=3,colour=red", "unknown shape key"),
    ("rows=3000000000,dim=8,batch=2,pooling=3,index=int32", "2\\*\\*31"),
])
def test_bad_shapes_are_clear_errors(shape, message):
    with pytest.raises(WorkloadError, match=message):
        tbe.Workload.from_shape(shape)


def test_inputs_follow_the_tbe_layout_and_zipf_is_skewed_per_table():
    w = tbe.Workload(rows=(20000, 30), dim=4, batch=256, pooling=(20, 20), distribution="zipf",
                     zipf_exponent=1.1)
    weight, table_offsets, indices, offsets = tbe.inputs(w, seed=0)
    assert weight.shape == (20030, 4) and table_offsets.tolist() == [0, 20000, 20030]
    assert offsets.shape == (2 * 256 + 1,) and int(offsets[-1]) == indices.numel() == 2 * 256 * 20
    tbe.check_inputs(w, weight, table_offsets, indices, offsets)  # every index within its own table
    first = indices[:256 * 20]
    counts = torch.bincount(first, minlength=20000).sort(descending=True).values
    assert counts[:200].sum() > 0.3 * first.numel()  # the hottest 1% of the big table's rows
    assert int(indices[256 * 20:].max()) < 30


def test_reference_and_baselines_agree_with_a_bag_by_bag_loop():
    for mode in ("sum", "mean", "max"):
        w = tbe.Workload(**SMALL, mode=mode)
        tensors = tbe.inputs(w, seed=4)
        ref = tbe.reference(w, *tensors)
        assert ref.shape == (9, 3 * 16)
        torch.testing.assert_close(ref, per_table_loop(*tensors, batch=9, mode=mode))
        for name, fn in tbe.baselines(w, *tensors).items():
            torch.testing.assert_close(fn(), ref, msg=name)


def test_traffic_counts_gathered_rows():
    w = tbe.Workload(**SMALL)
    tensors = tbe.inputs(w, seed=0)
    traffic = tbe.traffic(w, *tensors)
    assert traffic.bytes == tensors[2].numel() * 16 * 4 and traffic.unit == "GB/s"


def test_check_inputs_rejects_bad_tensors():
    w = tbe.Workload(rows=(3, 5), dim=4, batch=2, pooling=(1, 2))
    weight, toff = torch.randn(8, 4), torch.tensor([0, 3, 8])
    idx, off = torch.tensor([0, 2, 1, 4, 0]), torch.tensor([0, 1, 3, 4, 5])
    tbe.check_inputs(w, weight, toff, idx, off)
    bad = {
        r"index 3 at position 1 is out of range for table 0, which has 3 rows": (weight, toff, torch.tensor(
            [0, 3, 1, 4, 0]), off),  # a valid row of the concatenation, but not of table 0
        "table 1": (weight, toff, torch.tensor([0, 2, 1, 5, 0]), off),
        "out of range": (weight, toff, torch.tensor([0, -1, 1, 4, 0]), off),
        "float32": (weight.double(), toff, idx, off),
        r"\(sum of table rows, 4\)": (torch.randn(8, 5), toff, idx, off),
        "table_offsets must be int64": (weight, toff.int(), idx, off),
        "tables \\+ 1 = 3 entries": (weight, torch.tensor([0, 8]), idx, off),
        "must equal the weight's 8 rows": (weight, torch.tensor([0, 3, 7]), idx, off),
        "table_offsets must be non-decreasing": (weight, torch.tensor([0, 9, 8]), idx, off),
        "indices and offsets must be int64": (weight, toff, idx.int(), off.int()),
        "tables x batch \\+ 1": (weight, toff, idx, off[:-1]),
        "offsets must be non-decreasing": (weight, toff, idx, torch.tensor([0, 2, 1, 4, 5])),
        "offsets\\[0\\] must be 0": (weight, toff, idx, torch.tensor([1, 1, 3, 4, 5])),
        "exceeds the 5 indices": (weight, toff, idx, torch.tensor([0, 1, 3, 4, 6])),
        "contiguous": (torch.randn(4, 8).t(), toff, idx, off),
        "all tensors must be on one device": (weight, toff, idx.to("meta"), off),
    }
    for message, tensors in bad.items():
        with pytest.raises((ValueError, TypeError, IndexError), match=message):
            tbe.check_inputs(w, *tensors)
    with pytest.raises(TypeError, match="torch.Tensor"):
        tbe.check_inputs(w, weight, toff, np.asarray(idx), off)


# ---- bounds checked in the kernel: the error flag ------------------------------------------------------
FLAGS = eb.workload
TINY = dict(rows=(3, 5), dim=8, batch=2, pooling=(1, 2))
_BUILT: dict = {}


def tiny_inputs():
    """Two tables (3 and 5 rows) of dim 8, batch 2: table 0's bags [0, 1) and [1, 3), table 1's [3, 4), [4, 5)."""
    return (torch.randn(8, 8), torch.tensor([0, 3, 8]), torch.tensor([0, 2, 1, 4, 0]), torch.tensor([0, 1, 3, 4, 5]))


def kernel(kind, mode="sum"):
    """A compiled kernel (cached for the module): "cpu" (guarded loads: pooling in the output), "cpu-branch" (a
    branch per row: pooling in the local scratch, unrolled), or "gpu" (the CUDA schedule's CPU twin)."""
    import tvm

    if (kind, mode) not in _BUILT:
        task = make_task("batched_embedding_bag", "cpu", **TINY, mode=mode)
        if kind == "gpu":
            target = resolve("cuda:sm_90").target()
            cfg = tbe.space(task.workload, target).default()
            func = tvm.compile(tbe_cuda.lower_emulation(task.workload, cfg, target), target="llvm")["main"]
        else:
            knobs = {"unroll": 4, "accumulator": "local"} if kind == "cpu-branch" else {"accumulator": "output"}
            cfg = task.space.make({**task.space.default().to_json(), **knobs})
            assert tbe_cpu.in_scratch(task.workload, cfg) == (kind == "cpu-branch")
            func = compile_module(task, cfg)["main"]
        _BUILT[kind, mode] = (task, cfg, func)
    return _BUILT[kind, mode]


def call_raw(k, *tensors):
    """(output, flag) of one call of the compiled function itself: no after_call."""
    task, cfg, func = k
    args, out = task.kernel_args(cfg, (), tensors)
    func(*args)
    return out, int(args[-1][0])


def skipping_bad(weight, table_offsets, indices, offsets, batch, mode):
    """per_table_loop, with each index outside its table left out: what the kernels pool when they flag it."""
    keep = torch.ones(indices.numel(), dtype=torch.bool)
    for t in range(table_offsets.numel() - 1):
        lo, hi = int(offsets[t * batch]), int(offsets[(t + 1) * batch])
        rows = int(table_offsets[t + 1] - table_offsets[t])
        keep[lo:hi] = (indices[lo:hi] >= 0) & (indices[lo:hi] < rows)
    new_offsets = torch.tensor([int(keep[:int(o)].sum()) for o in offsets])
    return per_table_loop(weight, table_offsets, indices[keep], new_offsets, batch, mode)


@pytest.mark.parametrize("kind, mode", [("cpu", "sum"), ("cpu-branch", "sum"), ("gpu", "sum"), ("gpu", "max")])
def test_an_index_out_of_its_table_is_flagged_and_adds_nothing(kind, mode):
    k = kernel(kind, mode)
    weight, toff, idx, off = tiny_inputs()
    out, flag = call_raw(k, weight, toff, idx, off)
    assert flag == 0
    torch.testing.assert_close(out, tbe.reference(k[0].workload, weight, toff, idx, off))
    # (2, 3): table 1's row 0, not table 0's; a bag of only a bad index pools as empty (sum) or -inf (max)
    for position, value in [(2, 3), (1, -1)] + ([(4, 5), (3, 2**40)] if mode == "sum" else []):
        bad = idx.clone()
        bad[position] = value
        out, flag = call_raw(k, weight, toff, bad, off)
        assert flag == FLAGS.INDEX_ERROR, (position, value)
        torch.testing.assert_close(out, skipping_bad(weight, toff, bad, off, 2, mode), msg=f"{position} {value}")


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_bad_offsets_and_table_offsets_are_flagged_and_read_nothing_outside(kind):
    k = kernel(kind)
    weight, toff, idx, off = tiny_inputs()
    for bad_off in ([1, 1, 3, 4, 5], [0, 3, 1, 4, 5], [0, 1, 3, 4, 9], [0, 1, 2**40, 4, 5]):
        out, flag = call_raw(k, weight, toff, idx, torch.tensor(bad_off))
        assert flag & FLAGS.OFFSETS_ERROR, bad_off
        assert torch.isfinite(out).all()
    for bad_toff in ([0, 9, 8], [0, 3, 9], [0, 3, 2**40], [1, 3, 8]):
        out, flag = call_raw(k, weight, torch.tensor(bad_toff), idx, off)
        assert flag & FLAGS.TABLE_OFFSETS_ERROR, bad_toff
        assert torch.isfinite(out).all()
    if kind == "cpu":  # the CPU kernel checks them before its gather, and pools nothing if they are bad
        assert torch.equal(call_raw(k, weight, toff, idx, torch.tensor([0, 3, 1, 4, 5]))[0], torch.zeros(2, 16))


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_an_empty_table_flags_its_indices_and_reads_no_row(kind):
    k = kernel(kind)
    weight, _, idx, off = tiny_inputs()
    toff = torch.tensor([0, 3, 3])  # table 1 has no rows, and the weight only table 0's
    out, flag = call_raw(k, weight[:3].clone(), toff, idx, off)
    assert flag == FLAGS.INDEX_ERROR
    table0 = F.embedding_bag(idx[:3], weight[:3], off[:3], mode="sum", include_last_offset=True)
    torch.testing.assert_close(out[:, :8], table0)
    assert torch.equal(out[:, 8:], torch.zeros(2, 8))


def test_a_kernel_without_validation_raises_what_its_gather_met(tmp_path):
    import autotune
    from autotune import records

    task = make_task("batched_embedding_bag", "cpu", **TINY)
    log = tmp_path / "tbe.jsonl"
    records.append(log, [task.record(task.space.default(), costs=(1e-6,))])
    k = autotune.kernel("batched_embedding_bag", "cpu", log=log, validate=False, **TINY)
    weight, toff, idx, off = tiny_inputs()
    torch.testing.assert_close(k(weight, toff, idx, off), tbe.reference(task.workload, weight, toff, idx, off))
    with pytest.raises(IndexOutOfRange, match="index 3 at position 2 is out of range for table 0, which has 3 rows"):
        k(weight, toff, torch.tensor([0, 2, 3, 4, 0]), off)
    with pytest.raises(InvalidInput, match="offsets must be non-decreasing"):
        k(weight, toff, idx, torch.tensor([0, 3, 1, 4, 5]))
    with pytest.raises(InvalidInput, match="table_offsets"):
        k(weight, torch.tensor([0, 9, 8]), idx, off)


def test_concat_tables_is_a_cat_into_one_buffer_aligned_for_huge_pages():
    from search_spaces.batched_embedding_bag.torch_op import concat_tables
    from search_spaces.embedding_bag.pages import HUGE_PAGE_BYTES as HUGE_PAGE

    tables = [torch.randn(rows, 16) for rows in (40000, 3, 100000)]  # 9 MB: above the huge-page threshold
    fused = concat_tables(tables)
    assert torch.equal(fused, torch.cat(tables)) and fused.is_contiguous() and fused.shape == (140003, 16)
    if sys.platform.startswith("linux"):
        assert fused.data_ptr() % HUGE_PAGE == 0  # its pages can be 2 MB ones where the kernel allows them
    small = concat_tables([torch.ones(3, 4), torch.zeros(2, 4)])  # below it: a plain cat
    assert torch.equal(small, torch.cat([torch.ones(3, 4), torch.zeros(2, 4)]))


def test_check_cases_are_made_one_at_a_time_over_tables_made_once():
    """`autotune check`'s cases of a batched kernel: a generator, every case of the workload's rows on one
    concatenated table (MLPerf's tables are 3.6 GB of float32: a table per case ran a 24 GB machine out of
    memory), the case of 7 more rows per table on a second one."""
    from search_spaces.batched_embedding_bag.torch_op import cases

    w = tbe.Workload(**SMALL)
    made = cases(w, seed=3, count=2)
    assert iter(made) is made  # lazy
    weights = {id(args[0]): args[0].shape[0] for _, args, _ in made}
    assert sorted(weights.values()) == [sum(w.rows), sum(w.rows) + 7 * w.tables]
