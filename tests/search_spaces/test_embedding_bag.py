"""The embedding-bag template against torch.nn.functional.embedding_bag, for random configs of its space.

GPU configs are checked as far as a machine without a GPU allows: they build for sm_80/sm_90 within the
device's limits, their CUDA has no LLVM intrinsics, and their numerics are checked on the CPU twin of the
GPU schedule (`cuda.lower_emulation`: same TVMScript and schedule, serial threads, shuffles as reads) and,
for the shuffles' masks and widths that the twin cannot check, by running the generated CUDA C on the
emulator of tests/cuda_emulator.py.
"""

import math
import random
import zlib
from dataclasses import replace

import pytest
from conftest import needs_gxx
import torch
import torch.nn.functional as F
import tvm

from autotune.build import compile_module
from autotune.targets import GPUS, gpu_device, resolve
from autotune.task import make_task
from cuda_emulator import cuda_source, emulate_cuda, launch_dims
from gpu_build import ARCHS, assert_built_within_limits, build_sample
from search_spaces import WorkloadError
from search_spaces import embedding_bag as eb
from search_spaces import _timed_inputs as timed
from search_spaces.embedding_bag import workload as eb_workload
from search_spaces.embedding_bag import cpu as eb_cpu, cuda as eb_cuda
from search_spaces.template import IndexOutOfRange, InvalidInput

CASES = {
    "sum": dict(),
    "mean": dict(mode="mean"),
    "max": dict(mode="max"),
    "weighted": dict(per_sample_weights=True),
    "weighted-pad": dict(per_sample_weights=True, padding_idx=3),
    "pad-sum": dict(padding_idx=3),
    "pad-mean": dict(padding_idx=3, mode="mean"),
    "pad-max": dict(padding_idx=-1, mode="max"),
    "last-offset-int32": dict(include_last_offset=True, index_dtype="int32"),
    "last-offset-mean": dict(include_last_offset=True, mode="mean"),
    "zipf-int32": dict(distribution="zipf", zipf_exponent=1.2, index_dtype="int32"),
}


def run(task, cfg, *tensors):
    func = compile_module(task, cfg)["main"]
    args, out = task.kernel_args(cfg, (), tensors)
    func(*args)
    return out


@pytest.mark.parametrize("case", CASES)
def test_matches_torch_for_default_and_random_configs(case):
    # pooling from 0 gives empty bags; dim 24 is not a multiple of the 16-lane option
    task = make_task("embedding_bag", "cpu", rows=50, dim=24, batch=13, pooling=(0, 7), **CASES[case])
    rng = random.Random(zlib.crc32(case.encode()))  # not hash(): salted per process, so irreproducible
    configs = {task.space.default()} | {task.space.sample(rng) for _ in range(2)}
    tensors = eb.inputs(task.workload, seed=3)
    ref = eb.reference(task.workload, *tensors)
    for cfg in configs:
        torch.testing.assert_close(run(task, cfg, *tensors), ref, rtol=1e-5, atol=1e-5, msg=str(cfg))


def test_every_knob_value_builds_and_matches():
    """Each value of each knob appears in at least one checked config: the default, then a greedy cover of the
    values not yet checked (of a few random configs, the one that takes most of them), as test_interaction's.
    About 8 compiles instead of one per knob value (35)."""
    task = make_task("embedding_bag", "cpu", rows=64, dim=32, batch=9, pooling=(0, 12))
    tensors = eb.inputs(task.workload, seed=1)
    ref = eb.reference(task.workload, *tensors)
    missing = {(k.name, v) for k in task.space.knobs for v in k.values}
    assert len(missing) == 35 and ("bags_per_task", 64) in missing and ("loop_order", "tiles_outer") in missing
    assert ("prefetch", 256) in missing
    rng = random.Random(0)
    cfg = task.space.default()
    for _ in range(16):
        covers = set(cfg.items) & missing
        assert covers, f"no sampled config has any of {sorted(missing)}"
        torch.testing.assert_close(run(task, cfg, *tensors), ref, rtol=1e-5, atol=1e-5, msg=str(cfg))
        missing -= covers
        if not missing:
            break
        cfg = max((task.space.sample(rng) for _ in range(300)), key=lambda c: len(set(c.items) & missing))
    assert not missing, f"unchecked knob values: {sorted(missing)}"


@pytest.mark.parametrize("unroll", [2, 4, 8])
def test_unrolled_pooling_never_reads_past_the_indices(unroll):
    """Unrolled, a bag's rows run in whole groups whose tail is predicated; the index check of a row beyond the
    last bag's end once read past the indices tensor: a crash where the indices end at a page boundary."""
    from conftest import ending_at_a_guard_page

    task = make_task("embedding_bag", "cpu", rows=1000, dim=64, batch=3, pooling=(1, 60))
    cfg = task.space.from_json({**task.space.default().as_dict(), "unroll": unroll})
    weight = torch.randn(1000, 64)
    idx, keep = ending_at_a_guard_page(torch.randint(0, 1000, (101,)).tolist())
    offsets = torch.tensor([0, 50, 98])  # the last bag: 3 rows (a tail for every unroll), the one before 48
    torch.testing.assert_close(run(task, cfg, weight, idx, offsets), F.embedding_bag(idx, weight, offsets, mode="sum"))
    del keep


def row_loops(sch, name):
    """(predicate, [(kind, extent text), ...] of the loops within the bag) of a row block of a CPU schedule."""
    block = sch.get_sblock(name)
    realize = tvm.get_global_func("s_tir.schedule.GetSBlockRealize")(sch, block)
    return realize.predicate, [(sch.get(loop).kind, str(sch.get(loop).extent)) for loop in sch.get_loops(block)]


def assert_whole_groups_and_a_remainder(sch, unroll, why):
    """The row blocks of a CPU schedule: groups of `unroll` rows (a loop over len // unroll, then an unrolled one
    of `unroll`) and a remainder (a loop over len % unroll), none predicated, the dimension in unrolled SIMD."""
    from tvm.s_tir.schedule.analysis import has_block
    from tvm.tirx import ForKind

    predicate, loops = row_loops(sch, "acc")
    assert bool(predicate), why
    assert [kind for kind, _ in loops[-2:]] == [ForKind.UNROLLED, ForKind.VECTORIZED], why
    if unroll == 1:
        assert not has_block(sch, "acc_tail"), why
        return
    groups = next(i for i, (_, extent) in enumerate(loops) if f"// T.int64({unroll})" in extent)
    assert loops[groups + 1] == (ForKind.UNROLLED, f"T.int64({unroll})"), why
    predicate, loops = row_loops(sch, "acc_tail")
    assert bool(predicate), why
    assert any(kind == ForKind.SERIAL and f"% T.int64({unroll})" in extent for kind, extent in loops), why


@pytest.mark.parametrize("unroll", [1, 2, 4, 8])
def test_unrolled_rows_carry_no_predicate_on_the_bags_length(unroll):
    """A split of the row loop by the schedule put `l < len` on every unrolled row, inside the SIMD loop (unroll 4
    ran 7x slower than 1): the kernel writes whole groups and a remainder instead."""
    from tvm.s_tir import Schedule

    target = tvm.target.Target("llvm")
    w = eb.Workload(rows=50, dim=32, batch=9, pooling=(0, 9), mode="mean")
    space = eb.space(w, target)
    for knobs in (dict(prefetch=8), dict(loop_order="tiles_outer", dim_tiles=2, prefetch=0)):
        cfg = space.make({**space.default().to_json(), "unroll": unroll, **knobs})
        assert_whole_groups_and_a_remainder(Schedule(eb.lower(w, cfg, target)), unroll, str(cfg))


UNROLLED = {  # workload fields, knobs: every mode and option through the group and the remainder blocks
    "sum-output": (dict(), dict(accumulator="output")),
    "mean-local-prefetch": (dict(mode="mean"), dict(accumulator="local", prefetch=4)),
    "max-pad": (dict(mode="max", padding_idx=3), dict(prefetch=8)),
    "weighted-pad-int32-last-offset": (dict(per_sample_weights=True, padding_idx=0, index_dtype="int32",
                                            include_last_offset=True), dict(vector=4, accumulator="local")),
    "tiles-outer": (dict(mode="mean"), dict(loop_order="tiles_outer", dim_tiles=2, prefetch=0)),
}


@pytest.mark.parametrize("unroll", [2, 4, 8])
@pytest.mark.parametrize("case", UNROLLED)
def test_unrolled_bags_of_every_length_pool_their_groups_and_the_rest(case, unroll):
    """Unrolled, a bag's rows run in whole groups of `unroll`, then the rest one at a time: bags of 0 to
    2*unroll+1 rows (no group, one, two, with and without a remainder) match PyTorch; a bad index in a group and
    in the remainder is flagged and adds nothing."""
    fields, knobs = UNROLLED[case]
    lengths = list(range(2 * unroll + 2))
    task = make_task("embedding_bag", "cpu", rows=50, dim=16, batch=len(lengths), pooling=(0, lengths[-1]),
                     **fields)
    cfg = task.space.make({**task.space.default().to_json(), "unroll": unroll, **knobs})
    w = task.workload
    gen = torch.Generator().manual_seed(unroll)
    bounds = torch.tensor([0] + lengths).cumsum(0)
    idx = torch.randint(0, 50, (int(bounds[-1]),), generator=gen)
    idx[::3] = 3 if w.padding_idx == 3 else idx[::3]  # padded rows in groups and remainders alike
    dtype = getattr(torch, w.index_dtype)
    offsets = (bounds if w.include_last_offset else bounds[:-1]).to(dtype)
    weight = torch.randn(50, 16, generator=gen)
    psw = (torch.rand(idx.numel(), generator=gen),) if w.per_sample_weights else ()
    kernel = (task, cfg, compile_module(task, cfg)["main"])
    out, flag = call_raw(kernel, weight, idx.to(dtype), offsets, *psw)
    assert flag == 0
    torch.testing.assert_close(out, eb.reference(w, weight, idx.to(dtype), offsets, *psw), rtol=1e-5, atol=1e-5)
    bad = idx.clone()
    last = int(bounds[-2])  # the last bag: two groups and one row
    bad[[last + 1, last + 2 * unroll]] = torch.tensor([50, -1])
    out, flag = call_raw(kernel, weight, bad.to(dtype), offsets, *psw)
    assert flag == FLAGS.INDEX_ERROR
    torch.testing.assert_close(out, with_absent_row(w, weight, bad.to(dtype), offsets, *psw), rtol=1e-5, atol=1e-5)


def test_edge_cases_single_bag_all_empty_and_all_padding():
    task = make_task("embedding_bag", "cpu", rows=10, dim=8, batch=1, pooling=(3, 3), mode="mean", padding_idx=0)
    cfg = task.space.default()
    weight = torch.randn(10, 8)
    for indices in (torch.tensor([1, 2, 3]), torch.tensor([0, 0, 0]), torch.tensor([0, 5, 0])):
        offsets = torch.tensor([0])
        ref = eb.reference(task.workload, weight, indices, offsets)
        torch.testing.assert_close(run(task, cfg, weight, indices, offsets), ref)
    # every bag empty (offsets all equal to 0 with no indices)
    task = make_task("embedding_bag", "cpu", rows=10, dim=8, batch=4, pooling=(0, 0), mode="max")
    empty = (weight, torch.zeros(0, dtype=torch.long), torch.zeros(4, dtype=torch.long))
    out = run(task, task.space.default(), *empty)
    assert out.shape == (4, 8) and torch.equal(out, torch.zeros(4, 8))
    torch.testing.assert_close(out, eb.reference(task.workload, *empty))


def test_kernel_serves_other_batch_sizes_than_tuned():
    task = make_task("embedding_bag", "cpu", rows=30, dim=16, batch=8, pooling=(1, 5))
    other = eb.Workload(rows=30, dim=16, batch=21, pooling=(1, 5))
    tensors = eb.inputs(other, seed=2)
    torch.testing.assert_close(run(task, task.space.default(), *tensors), eb.reference(other, *tensors))


def test_zipf_indices_are_skewed_and_in_range():
    w = eb.Workload(rows=10_000, dim=4, batch=512, pooling=(20, 20), distribution="zipf", zipf_exponent=1.1)
    _, idx, _ = eb.inputs(w, seed=0)
    assert 0 <= int(idx.min()) and int(idx.max()) < 10_000
    counts = torch.bincount(idx, minlength=10_000).sort(descending=True).values
    assert counts[:100].sum() > 0.3 * idx.numel()  # the hottest 1% of rows takes a large share
    _, uni, _ = eb.inputs(eb.Workload(rows=10_000, dim=4, batch=512, pooling=(20, 20)), seed=0)
    assert torch.bincount(uni, minlength=10_000).sort(descending=True).values[:100].sum() < 0.05 * uni.numel()


def test_timed_sets_gather_new_rows_of_the_same_hot_set_until_they_outgrow_the_cache():
    w = eb.Workload(rows=10_000, dim=16, batch=512, pooling=(20, 20), distribution="zipf", zipf_exponent=1.1)
    inputs = eb.inputs(w, seed=0)
    per_set = eb.traffic(w, *inputs).bytes  # 512 * 20 * 16 * 4 = 655 kB gathered a call
    sets = eb.timed_inputs(w, 0, inputs, cache_bytes=1 << 20)
    assert len(sets) == math.ceil(timed.CACHE_MULTIPLE * (1 << 20) / per_set) and len(sets) * per_set >= 4 << 20
    assert len(eb.timed_inputs(w, 0, inputs, cache_bytes=1 << 40)) == timed.MAX_TIMED_SETS
    assert not torch.equal(sets[0][1], sets[1][1])
    hot = [set(torch.bincount(s[1], minlength=10_000).argsort(descending=True)[:20].tolist()) for s in sets[:2]]
    assert len(hot[0] & hot[1]) >= 15  # a model's batches share their hot rows: the scatter is the seed's
    again = eb.timed_inputs(w, 0, inputs, cache_bytes=1 << 20)
    assert all(torch.equal(a[1], b[1]) and torch.equal(a[2], b[2]) for a, b in zip(sets, again))  # reproducible


def test_gathered_rows_are_the_pooled_indices_in_order():
    w = eb.Workload(rows=10, dim=4, batch=3, pooling=(0, 3), include_last_offset=True, padding_idx=2)
    table = torch.zeros(10, 4)
    indices, offsets = torch.tensor([5, 2, 7, 7, 9, 1]), torch.tensor([0, 2, 2, 5])  # the last index is past the end
    assert eb.gathered_rows(w, table, indices, offsets).tolist() == [5, 7, 7, 9]  # padding gathers nothing


@pytest.mark.parametrize("shape, message", [
    ("rows=10,dim=8,batch=2", "missing pooling"),
    ("rows=10,dim=8,batch=2,pooling=5-3", "min <= max"),
    ("rows=10,dim=8,batch=2,pooling=x", "pooling"),
    ("rows=10,dim=8,batch=2,pooling=3,mode=avg", "mode"),
    ("rows=10,dim=8,batch=2,pooling=3,mode=mean,weighted=1", "per_sample_weights"),
    ("rows=10,dim=8,batch=2,pooling=3,padding_idx=10", "padding_idx"),
    ("rows=10,dim=0,batch=2,pooling=3", "dim"),
    ("rows=10,dim=8,batch=2,pooling=3,colour=red", "unknown shape key"),
    ("rows=10,dim=8,batch=2,pooling=3,dist=zipf:x", "zipf"),
    ("rows=10 dim=8", "expected int"),
    ("rows=10,,dim", "key=value"),
])
def test_bad_shapes_are_clear_errors(shape, message):
    with pytest.raises(WorkloadError, match=message):
        eb.Workload.from_shape(shape)


def test_shape_text_parses_aliases_and_ranges():
    w = eb.Workload.from_shape("rows=100,dim=8,batch=4,pooling=2-9,index=int32,dist=zipf:1.3,weighted=1")
    assert w.pooling == (2, 9) and w.index_dtype == "int32" and w.per_sample_weights
    assert w.distribution == "zipf" and w.zipf_exponent == 1.3
    assert eb.Workload.from_json(w.to_json()) == w


def test_check_inputs_rejects_bad_tensors():
    w = eb.Workload(rows=10, dim=4, batch=2, pooling=(1, 2))
    weight, idx, off = torch.randn(10, 4), torch.tensor([1, 2, 3]), torch.tensor([0, 2])
    eb.check_inputs(w, weight, idx, off)
    with pytest.raises(IndexError, match=r"\[0, 10\)"):
        eb.check_inputs(w, weight, torch.tensor([1, 10, 3]), off)
    with pytest.raises(IndexError):
        eb.check_inputs(w, weight, torch.tensor([-1, 2, 3]), off)
    with pytest.raises(TypeError, match="int64"):
        eb.check_inputs(w, weight, idx.int(), off.int())
    with pytest.raises(TypeError, match="float32"):
        eb.check_inputs(w, weight.double(), idx, off)
    with pytest.raises(ValueError, match=r"\(rows, 4\)"):
        eb.check_inputs(w, torch.randn(10, 5), idx, off)
    with pytest.raises(ValueError, match="non-decreasing"):
        eb.check_inputs(w, weight, idx, torch.tensor([0, 2, 1]))
    with pytest.raises(ValueError, match="exceeds"):
        eb.check_inputs(w, weight, idx, torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="offsets\\[0\\]"):
        eb.check_inputs(w, weight, idx, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="contiguous"):
        eb.check_inputs(w, torch.randn(4, 10).t(), idx, off)
    with pytest.raises(ValueError, match="without per_sample_weights"):
        eb.check_inputs(w, weight, idx, off, torch.ones(3))


def test_check_inputs_accepts_one_device_and_rejects_mixed_devices():
    w = eb.Workload(rows=10, dim=4, batch=2, pooling=(1, 2))
    weight, idx, off = torch.randn(10, 4), torch.tensor([1, 2, 3]), torch.tensor([0, 2])
    with pytest.raises(ValueError, match=r"one device.*weight on meta.*indices on cpu"):
        eb.check_inputs(w, weight.to("meta"), idx, off)
    weighted = eb.Workload(rows=10, dim=4, batch=2, pooling=(1, 2), per_sample_weights=True)
    with pytest.raises(ValueError, match=r"one device.*per_sample_weights on meta"):
        eb.check_inputs(weighted, weight, idx, off, torch.ones(3, device="meta"))


def test_kernel_args_allocate_the_output_on_the_inputs_device():
    w = eb.Workload(rows=10, dim=4, batch=2, pooling=(1, 2))
    tensors = (torch.empty(10, 4, device="meta"), torch.empty(3, dtype=torch.long, device="meta"),
               torch.empty(2, dtype=torch.long, device="meta"))
    args, out = eb.kernel_args(w, None, (), *tensors)
    assert out.device.type == "meta" and out.shape == (2, 4) and args[-2] is out
    flag = args[-1]  # the error flag: one int32 on the inputs' device
    assert flag.device.type == "meta" and flag.shape == (1,) and flag.dtype == torch.int32


# ---- GPU -------------------------------------------------------------------------------------------------
SM90 = resolve("cuda:sm_90")


def test_gpu_space_has_documented_cuda_knobs_and_a_fast_looking_default():
    w = eb.Workload(rows=1000, dim=128, batch=2048, pooling=(20, 80))
    space = eb.space(w, SM90.target())
    assert {k.name for k in space.knobs} == {"gpu_vector", "dim_threads", "threads", "gpu_unroll", "index_prefetch"}
    assert all(k.doc for k in space.knobs)
    cfg = space.default()
    # 16-byte loads, one bag per warp (512 contiguous bytes per row), several loads in flight, shared indices
    assert (cfg[eb_cuda.GPU_VECTOR], cfg[eb_cuda.DIM_THREADS], cfg[eb_cuda.INDEX_PREFETCH]) == (4, 32, "shuffle")
    assert cfg[eb_cuda.GPU_UNROLL] >= 4 and cfg[eb_cuda.THREADS] % 32 == 0


@pytest.mark.parametrize("dim", [8, 24, 64, 128, 256, 1024])
def test_gpu_space_constraints_keep_blocks_within_the_device_limits(dim):
    small = gpu_device(replace(GPUS["sm_80"], max_threads_per_block=256))  # a device with smaller blocks
    for device in (SM90, small):
        limit = int(device.target().attrs["max_threads_per_block"])
        space = eb.space(eb.Workload(rows=100, dim=dim, batch=64, pooling=(0, 9)), device.target())
        rng = random.Random(dim)
        for cfg in [space.default()] + [space.sample(rng) for _ in range(300)]:
            threads, lanes, vec = cfg[eb_cuda.THREADS], cfg[eb_cuda.DIM_THREADS], cfg[eb_cuda.GPU_VECTOR]
            assert threads <= limit and threads % 32 == 0 and threads % lanes == 0, cfg
            assert dim % (lanes * vec) == 0, cfg
            assert dim // lanes <= eb_cuda.GPU_MAX_ACCUMULATORS, cfg  # accumulators stay in registers
        assert any(c[eb_cuda.THREADS] == limit for c in space), "the largest block the device allows is in the space"


def test_gpu_configs_lower_to_cuda_without_llvm_intrinsics():
    """The CPU kernel's prefetch is an LLVM intrinsic; CUDA source must not carry it (nor any LLVM call)."""
    w = eb.Workload(rows=100, dim=64, batch=32, pooling=(0, 9), mode="mean", padding_idx=2)
    space = eb.space(w, SM90.target())
    for prefetch in eb_cuda.INDEX_PREFETCH.options:
        cfg = next(c for c in space if c[eb_cuda.INDEX_PREFETCH] == prefetch)
        mod = eb.lower(w, cfg, SM90.target())
        assert "call_llvm" not in mod.script()
        # in this process TVM keeps the CUDA source (there is no CUDA runtime to compile it to a cubin)
        (cuda,) = tvm.compile(mod, target=SM90.target()).mod.imports
        source = cuda.inspect_source()
        assert "__global__" in source and "llvm" not in source
        assert ("__shfl_sync" in source) == (prefetch == "shuffle"), cfg
        assert "float4" in source, "16-byte vector loads"


GPU_BUILDS = {  # workload options -> configs to build: the default and random ones (numerics: the CPU twin)
    "sum": (dict(), 3),
    "mean-pad": (dict(mode="mean", padding_idx=3), 2),
    "weighted-int32-last-offset": (dict(per_sample_weights=True, index_dtype="int32", include_last_offset=True), 1),
}


@pytest.mark.parametrize("arch", ARCHS)
def test_gpu_configs_build_within_the_device_limits(gpu_builder, arch):
    for case, (fields, n) in GPU_BUILDS.items():
        task, built = build_sample(gpu_builder, "embedding_bag", arch, n, seed=len(case), rows=100, dim=64,
                                   batch=32, pooling=(0, 9), **fields)
        assert_built_within_limits(task, built)
        assert all(b.error_kind is None for b in built), [(str(b.config), b.error) for b in built if b.error]


GPU_NUMERICS = {
    "sum": dict(),
    "mean-pad": dict(mode="mean", padding_idx=3),
    "max-pad-last-offset": dict(mode="max", padding_idx=-1, include_last_offset=True),
    "weighted-pad-int32": dict(per_sample_weights=True, padding_idx=0, index_dtype="int32"),
    "dim24-mean-int32": dict(dim=24, mode="mean", index_dtype="int32"),
}


@pytest.mark.parametrize("case", GPU_NUMERICS)
def test_gpu_schedule_numerics_on_its_cpu_twin(case):
    """Empty bags, batches other than the tuned one (more than the grid holds, and fewer), every option."""
    fields = {"rows": 50, "dim": 64, "pooling": (0, 40), **GPU_NUMERICS[case]}
    w = eb.Workload(batch=13, **fields)
    space = eb.space(w, SM90.target())
    rng = random.Random(len(case))  # the default shuffles indices; a random config that does not
    configs = [space.default(), next(c for c in (space.sample(rng) for _ in range(1000))
                                     if c[eb_cuda.INDEX_PREFETCH] == "none")]
    for cfg in configs:
        kernel = tvm.compile(eb_cuda.lower_emulation(w, cfg, SM90.target()), target="llvm")["main"]
        for batch in (13, 40, 3):
            other = eb.Workload(batch=batch, **fields)
            tensors = eb.inputs(other, seed=batch)
            args, out = eb.kernel_args(other, cfg, (), *tensors)
            kernel(*args)
            torch.testing.assert_close(out, eb.reference(other, *tensors), rtol=1e-5, atol=1e-5,
                                       msg=lambda m: f"{cfg} batch {batch}: {m}")


@needs_gxx
def test_gpu_kernel_shuffling_among_the_bags_of_a_warp_matches_torch_when_emulated():
    """The generated CUDA C itself (what the CPU twin cannot check): groups of 8 lanes, so a warp holds 4 bags
    whose lengths differ, each group broadcasting its indices and weights by shuffles under its own mask
    while the others take other paths (empty bags, steps past a bag's end, idle bags past the batch)."""
    fields = dict(rows=50, dim=32, pooling=(0, 9), per_sample_weights=True, padding_idx=3)
    task = make_task("embedding_bag", "cuda:sm_90", batch=13, **fields)
    cfg = task.space.make({**task.space.default().to_json(), "gpu_vector": 4, "dim_threads": 8, "threads": 64,
                           "gpu_unroll": 4, "index_prefetch": "shuffle"})
    source = cuda_source(task, cfg)
    assert "__shfl_sync" in source
    grid, block = launch_dims(task.lower(cfg))
    assert (grid, block) == ((2, 1, 1), (8, 8, 1))  # 8 bags a block: 13 bags leave 3 slots idle
    for batch in (13, 21):  # the tuned batch, and more bags than the grid has slots (blocks loop over them)
        w = eb.Workload(batch=batch, **fields)
        weight, indices, offsets, psw = eb.inputs(w, seed=batch)
        assert (offsets.diff() == 0).any(), "an empty bag"
        out, flag = emulate(source, grid, block, weight, indices, offsets, psw)
        assert flag == 0
        torch.testing.assert_close(out, eb.reference(w, weight, indices, offsets, psw), rtol=1e-5, atol=1e-5,
                                   msg=lambda m: f"{cfg} batch {batch}: {m}")
    # the CUDA C's own bounds checks: an index past the table (in a shuffled chunk) is flagged and adds nothing
    bad = indices.clone()
    k = int(offsets[5])  # the first index of bag 5 (not empty at this seed)
    assert offsets[6] > k
    bad[k] = w.rows
    out, flag = emulate(source, grid, block, weight, bad, offsets, psw)
    assert flag == eb.workload.INDEX_ERROR
    torch.testing.assert_close(out, with_absent_row(w, weight, bad, offsets, psw), rtol=1e-5, atol=1e-5)
    # a bag past the indices pools nothing, and the flag says so
    short = offsets.clone()
    short[7] = indices.numel() + 3
    out, flag = emulate(source, grid, block, weight, indices, short, psw)
    assert flag == eb.workload.OFFSETS_ERROR and torch.equal(out[7], torch.zeros(w.dim))


def emulate(source, grid, block, weight, indices, offsets, psw):
    """(output, flag) of the generated CUDA C run on the CPU emulator."""
    out, flag = torch.full((offsets.numel(), weight.shape[1]), float("nan")), torch.zeros(1, dtype=torch.int32)
    emulate_cuda(source, grid, block, dict(W=weight, I=indices, Off=offsets, PSW=psw, O=out, Flag=flag,
                                           NB=offsets.numel(), NNZ=indices.numel(), R=weight.shape[0]))
    return out, int(flag)


def with_absent_row(w, weight, indices, offsets, psw=None):
    """The reference with every index outside the table replaced by a row that adds nothing (zeros; for max,
    -inf): what a kernel that skips bad indices computes."""
    rows = weight.shape[0]
    absent = torch.full((1, weight.shape[1]), -math.inf if w.mode == "max" else 0.0)
    safe = torch.where((indices < 0) | (indices >= rows), torch.full_like(indices, rows), indices)
    return eb.reference(replace(w, rows=rows + 1), torch.cat([weight, absent]), safe, offsets, psw)


# ---- bounds checked in the kernel: the error flag ------------------------------------------------------
FLAGS = eb.workload
CHECKS = {  # compute's ways to check an index (cpu.checks picks one per config), by the knobs that pick them
    "load": dict(accumulator="output"),
    "branch": dict(unroll=4, prefetch=8, accumulator="local"),
    "walk": dict(loop_order="tiles_outer", dim_tiles=2, prefetch=0),
}
_BUILT: dict = {}


def cpu_kernel(check="load", **fields):
    """A compiled CPU kernel (cached for the module) whose config checks indices the `check` way."""
    key = (check, tuple(sorted(fields.items())))
    if key not in _BUILT:
        task = make_task("embedding_bag", "cpu", **{"rows": 50, "dim": 16, "batch": 6, "pooling": (0, 5), **fields})
        cfg = task.space.make({**task.space.default().to_json(), **CHECKS[check]})
        assert eb_cpu.checks(cfg, task.workload) == check
        _BUILT[key] = (task, cfg, compile_module(task, cfg)["main"])
    return _BUILT[key]


def call_raw(kernel, *tensors):
    """(output, flag) of one call of the compiled function itself: no after_call."""
    task, cfg, func = kernel
    args, out = task.kernel_args(cfg, (), tensors)
    func(*args)
    return out, int(args[-1][0])


def bad_bags(seed=0):
    """Six bags of 50 rows, the last bag not empty, and where to put a bad index: a middle and the last bag."""
    weight, (idx, off) = torch.randn(50, 16), (torch.arange(14) * 7 % 50, torch.tensor([0, 3, 3, 6, 9, 12]))
    return weight, idx, off, (4, 13)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("value", [-1, 50, 2**40, -2**40])
def test_an_index_out_of_range_is_flagged_and_adds_nothing(check, value):
    kernel = cpu_kernel(check)
    weight, idx, off, places = bad_bags()
    out, flag = call_raw(kernel, weight, idx, off)
    assert flag == 0 and torch.equal(out, eb.reference(kernel[0].workload, weight, idx, off))
    for k in places:  # a middle bag, and the last (which ends at len(indices), not at an offset)
        bad = idx.clone()
        bad[k] = value
        out, flag = call_raw(kernel, weight, bad, off)
        assert flag == FLAGS.INDEX_ERROR, (k, value)
        torch.testing.assert_close(out, with_absent_row(kernel[0].workload, weight, bad, off))


@pytest.mark.parametrize("check, fields", [("branch", dict(mode="max", index_dtype="int32")),
                                           ("load", dict(per_sample_weights=True, padding_idx=2))])
def test_an_index_out_of_range_is_flagged_with_other_options(check, fields):
    kernel = cpu_kernel(check, **fields)
    weight, idx, off, _ = bad_bags()
    dtype = getattr(torch, kernel[0].workload.index_dtype)
    idx, off = idx.to(dtype), off.to(dtype)
    psw = (torch.rand(idx.numel()),) if kernel[0].workload.per_sample_weights else ()
    bad = idx.clone()
    bad[7] = 50
    out, flag = call_raw(kernel, weight, bad, off, *psw)
    assert flag == FLAGS.INDEX_ERROR
    torch.testing.assert_close(out, with_absent_row(kernel[0].workload, weight, bad, off, *psw))


@pytest.mark.parametrize("last", [False, True])
def test_bad_offsets_are_flagged_and_no_bag_is_read(last):
    kernel = cpu_kernel("load", include_last_offset=last)
    weight, idx, off, _ = bad_bags()
    if last:
        off = torch.cat([off, torch.tensor([idx.numel()])])
    assert call_raw(kernel, weight, idx, off)[1] == 0
    for name, change in [("first not 0", {0: 1}), ("negative", {0: -5}), ("decreasing", {2: 1}),
                         ("past the indices", {len(off) - 1: idx.numel() + 1}), ("far past", {3: 2**40})]:
        bad = off.clone()
        for i, v in change.items():
            bad[i] = v
        out, flag = call_raw(kernel, weight, idx, bad)
        assert flag == FLAGS.OFFSETS_ERROR, name
        assert torch.equal(out, torch.zeros_like(out)), name  # zeros, not the output's old memory


def test_an_empty_table_flags_every_index_and_reads_no_row():
    kernel = cpu_kernel("load")
    empty = torch.zeros(0, 16)
    out, flag = call_raw(kernel, empty, torch.tensor([0, 3]), torch.tensor([0, 1]))
    assert flag == FLAGS.INDEX_ERROR and torch.equal(out, torch.zeros(2, 16))
    out, flag = call_raw(kernel, empty, torch.zeros(0, dtype=torch.long), torch.tensor([0, 0]))
    assert flag == 0 and torch.equal(out, torch.zeros(2, 16))  # empty bags read nothing: nothing to flag


def test_the_flag_of_a_call_is_reset_before_the_next():
    task, cfg, func = kernel = cpu_kernel("load")
    weight, idx, off, _ = bad_bags()
    assert call_raw(kernel, weight, torch.full_like(idx, 50), off)[1] == FLAGS.INDEX_ERROR
    args, _ = task.kernel_args(cfg, (), (weight, idx, off))
    assert int(args[-1][0]) == 0  # the thread's flag, zero again
    assert call_raw(kernel, weight, idx, off)[1] == 0


@pytest.fixture()
def eb_log(tmp_path):
    from autotune import records

    task = make_task("embedding_bag", "cpu", rows=50, dim=16, batch=6, pooling=(0, 5))
    path = tmp_path / "eb.jsonl"
    records.append(path, [task.record(task.space.default(), costs=(1e-6,))])
    return path


def test_a_kernel_without_validation_raises_what_its_gather_met(eb_log):
    import autotune

    k = autotune.kernel("embedding_bag", "cpu", log=eb_log, rows=50, dim=16, batch=6, pooling=(0, 5), validate=False)
    weight, idx, off, _ = bad_bags()
    torch.testing.assert_close(k(weight, idx, off), eb.reference(k.task.workload, weight, idx, off))
    bad = idx.clone()
    bad[13] = 50
    with pytest.raises(IndexOutOfRange, match=r"indices must be in \[0, 50\), got values in \[0, 50\] \(index 50 at "
                                              r"position 13\)"):
        k(weight, bad, off)
    with pytest.raises(InvalidInput, match=r"non-decreasing, got offsets\[2\] = 1 after offsets\[1\] = 3"):
        k(weight, idx, torch.tensor([0, 3, 1, 6, 9, 12]))
    with pytest.raises(InvalidInput, match=r"offsets\[0\] must be 0"):
        k(weight, idx, torch.tensor([2, 3, 3, 6, 9, 12]))
    with pytest.raises(IndexOutOfRange, match=r"\[0, 0\)"):
        k(torch.zeros(0, 16), idx, off)
    torch.testing.assert_close(k(weight, idx, off), eb.reference(k.task.workload, weight, idx, off))


@pytest.fixture()
def eb_package(tmp_path, cpu_builder):
    import autotune.torch as at
    from autotune.package import export

    task = make_task("embedding_bag", "cpu", rows=50, dim=16, batch=6, pooling=(0, 5))
    export([task.record(task.space.default(), costs=(1e-6,))], tmp_path, builder=cpu_builder)
    at.unload_all()
    pkg = at.load(tmp_path)
    (kernel,) = pkg.kernels
    calls = []
    func = kernel.func
    kernel.func = lambda *args: calls.append(1) or func(*args)
    yield calls
    at.unload_all()


def test_the_torch_op_checks_cpu_data_in_the_kernel_not_before_it(eb_package, monkeypatch):
    op = torch.ops.autotune.embedding_bag
    weight, idx, off, _ = bad_bags()
    monkeypatch.setattr(eb_workload, "_index_facts", lambda *a: pytest.fail("a pass over the data before the call"))
    torch.testing.assert_close(op(weight, idx, off), F.embedding_bag(idx, weight, off, mode="sum"))
    assert eb_package == [1]
    monkeypatch.undo()
    bad = idx.clone()
    bad[4] = -1
    with pytest.raises(IndexOutOfRange, match=r"index -1 at position 4") as err:
        op(weight, bad, off)
    assert isinstance(err.value, RuntimeError) and eb_package == [1, 1]  # the kernel ran, and its flag raised
    with pytest.raises(InvalidInput, match="exceeds the number of indices"):
        op(weight, idx, torch.tensor([0, 3, 3, 6, 9, 15]))
    with pytest.raises(IndexError, match="indices must be in"):
        op(weight, bad, off, validate=False)  # the kernel's checks are its memory safety: always on


def test_the_pytorch_path_rejects_what_pytorch_would_and_what_its_max_mode_misses():
    import autotune.torch as at

    at.unload_all()
    op = torch.ops.autotune.embedding_bag
    weight, idx, off, _ = bad_bags()
    bad = idx.clone()
    bad[4] = 50
    with pytest.warns(at.NoTunedKernelWarning):
        with pytest.raises(RuntimeError):  # PyTorch's own check
            op(weight, bad, off)
    decreasing = torch.tensor([0, 3, 1, 6, 9, 12])
    F.embedding_bag(idx, weight, decreasing, mode="max")  # PyTorch's max mode does not check them
    with pytest.warns(at.NoTunedKernelWarning):
        with pytest.raises(InvalidInput, match="non-decreasing"):
            op(weight, idx, decreasing, None, "max")


@pytest.mark.parametrize("prefetch", eb_cuda.INDEX_PREFETCH.options)
def test_gpu_kernel_checks_bounds_on_its_cpu_twin(prefetch):
    """The GPU kernels clamp instead of skipping a bag (they check per bag): a bad index loads row 0 and adds
    nothing, a bad bag pools nothing, an empty table reads no row; each sets the flag."""
    w = eb.Workload(rows=50, dim=16, batch=6, pooling=(0, 5), mode="max")
    space = eb.space(w, SM90.target())
    cfg = next(c for c in space if c[eb_cuda.INDEX_PREFETCH] == prefetch)
    func = tvm.compile(eb_cuda.lower_emulation(w, cfg, SM90.target()), target="llvm")["main"]
    kernel = (make_task("embedding_bag", "cpu", workload=w), cfg, func)
    weight, idx, off, _ = bad_bags()
    out, flag = call_raw(kernel, weight, idx, off)
    assert flag == 0 and torch.equal(out, eb.reference(w, weight, idx, off))
    bad = idx.clone()
    bad[[4, 13]] = torch.tensor([-3, 50])
    out, flag = call_raw(kernel, weight, bad, off)
    assert flag == FLAGS.INDEX_ERROR
    torch.testing.assert_close(out, with_absent_row(w, weight, bad, off))
    out, flag = call_raw(kernel, weight, idx, torch.tensor([0, 3, 1, 6, 9, 2**40]))
    assert flag == FLAGS.OFFSETS_ERROR
    assert torch.equal(out[[1, 5]], torch.zeros(2, 16))  # [3, 1) and past the indices: nothing pooled
    torch.testing.assert_close(out[[0, 3]], eb.reference(w, weight, idx, off)[[0, 3]])
    out, flag = call_raw(kernel, torch.zeros(0, 16), idx, off)
    assert flag == FLAGS.INDEX_ERROR and torch.equal(out, torch.zeros(6, 16))



def test_a_cpu_table_off_the_kernels_alignment_runs_pytorch_instead():
    """TVM's buffers assume 64-byte aligned data (aligned vector loads): a row view of a larger table, as a model's
    tables become when tune_model fuses them, must not reach a CPU kernel unless it is aligned."""
    from search_spaces.embedding_bag.torch_op import route

    big = torch.randn(40, 24)
    idx, off = torch.tensor([0, 1]), torch.tensor([0])
    assert not isinstance(route(big, idx, off), str)
    why = route(big[1:], idx, off)  # 96 bytes in
    assert isinstance(why, str) and "64-byte aligned" in why
    assert not isinstance(route(big[8:], idx, off), str)  # 768 bytes in: aligned again
