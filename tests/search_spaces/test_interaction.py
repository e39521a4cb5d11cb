"""The interaction template against DLRM's interact_features (torch bmm + tril gather + cat), for its configs."""

import random
import re
from types import SimpleNamespace

import pytest
from conftest import needs_gxx
import torch

from autotune.build import compile_module
from autotune.runtime import BoundKernel, Expected, expected_call, mismatch
from autotune.task import make_task
from cuda_emulator import cuda_source, emulate_cuda, launch_dims
from gpu_build import ARCHS, assert_built_within_limits, build_sample
from search_spaces import InvalidConfig, InvalidDtype, InvalidInput, WorkloadError
from search_spaces import interaction as it
from search_spaces.interaction import cpu, cuda
from search_spaces.interaction.workload import dot_interaction

CASES = {
    # dim 12 and 20 are not multiples of the 8- and 16-lane options (the staged copy is zero-padded)
    "strict-dim12": dict(batch=5, tables=3, dim=12),
    "self-dim20": dict(batch=4, tables=4, dim=20, self_interaction=True),
    "F=2": dict(batch=3, tables=1, dim=8),  # a single pair: every pair block is partial
    "F=2-self-dim5": dict(batch=3, tables=1, dim=5, self_interaction=True),
    "many-pairs": dict(batch=6, tables=9, dim=32),  # 45 pairs: full blocks and a partial last one
}


def run(task, cfg, x, ly):
    func = compile_module(task, cfg)["main"]
    args, out = it.kernel_args(task.workload, cfg, (), x, ly)
    func(*args)
    return out


def dlrm(x, ly, self_interaction=False):
    """facebookresearch/dlrm's interact_features (dot), written out independently of the template."""
    batch_size, d = x.shape
    t = torch.cat([x] + list(ly), dim=1).view((batch_size, -1, d))
    z = torch.bmm(t, torch.transpose(t, 1, 2))
    _, ni, nj = z.shape
    offset = 1 if self_interaction else 0
    li = torch.tensor([i for i in range(ni) for j in range(i + offset)])
    lj = torch.tensor([j for i in range(nj) for j in range(i + offset)])
    return torch.cat([x] + [z[:, li, lj]], dim=1)



@pytest.mark.parametrize("self_interaction", [False, True])
def test_workload_free_reference_serves_any_dtype_and_batch(self_interaction):
    """`dot_interaction` is the torch op's PyTorch path: other dtypes, lists or stacks, and empty batches."""
    gen = torch.Generator().manual_seed(4)
    x, ly = torch.randn(5, 6, generator=gen, dtype=torch.float64), torch.randn(5, 3, 6, generator=gen, dtype=torch.float64)
    ref = dlrm(x, ly.unbind(1), self_interaction)
    torch.testing.assert_close(dot_interaction(x, ly, self_interaction), ref, rtol=0, atol=0)
    torch.testing.assert_close(dot_interaction(x, list(ly.unbind(1)), self_interaction), ref, rtol=0, atol=0)
    pairs = 10 if self_interaction else 6
    assert dot_interaction(x[:0], ly[:0], self_interaction).shape == (0, 6 + pairs)
    assert dot_interaction(x[:0], list(ly[:0].unbind(1)), self_interaction).shape == (0, 6 + pairs)

def close(out, ref, w, msg=""):
    rtol, atol = it.tolerance(w)
    torch.testing.assert_close(out, ref, rtol=rtol, atol=atol, msg=msg)


@pytest.mark.parametrize("case", CASES)
def test_matches_dlrm_for_default_and_random_configs(case):
    task = make_task("interaction", "cpu", **CASES[case])
    w = task.workload
    x, ly = it.inputs(w, seed=3)
    ref = it.reference(w, x, ly)
    assert ref.shape == (w.batch, w.out_dim)
    torch.testing.assert_close(ref, dlrm(x, ly.unbind(1), w.self_interaction))
    rng = random.Random(sum(map(ord, case)))
    configs = {task.space.default()} | {task.space.sample(rng) for _ in range(2)}
    for cfg in configs:
        close(run(task, cfg, x, ly), ref, w, msg=str(cfg))


@pytest.mark.parametrize("kw", [dict(tables=5, dim=16), dict(tables=3, dim=5, self_interaction=True)])
def test_every_knob_value_builds_and_matches(kw):
    """Each value of each knob appears in at least one checked config (a greedy cover of all values)."""
    task = make_task("interaction", "cpu", batch=6, **kw)
    w = task.workload
    x, ly = it.inputs(w, seed=1)
    ref = it.reference(w, x, ly)
    missing = {(k.name, v) for k in task.space.knobs for v in k.values}
    assert ("pairs_per_block", 32) in missing and ("hsum", "tree") in missing
    assert ("lanes", 16) in missing if w.dim == 16 else ("lanes", 1) in missing  # scalar only for D < 8
    rng = random.Random(0)
    checked = 0
    while missing and checked < 16:
        # of a few random configs, check the one that covers most of the values not yet seen
        cfg = max((task.space.sample(rng) for _ in range(300)),
                  key=lambda c: len(set(c.items) & missing))
        covers = set(cfg.items) & missing
        assert covers, f"no sampled config has any of {sorted(missing)}"
        close(run(task, cfg, x, ly), ref, w, msg=str(cfg))
        missing -= covers
        checked += 1
    assert not missing, f"unchecked knob values: {sorted(missing)}"


@pytest.mark.parametrize("self_interaction", [False, True])
def test_list_and_stacked_embeddings_give_the_same_output(self_interaction):
    task = make_task("interaction", "cpu", batch=4, tables=3, dim=8, self_interaction=self_interaction)
    w = task.workload
    x, ly = it.inputs(w, seed=5)
    as_list = list(ly.unbind(1))  # DLRM passes a list of (B, D) tensors, views with a stride here
    ref = dlrm(x, as_list, self_interaction)
    torch.testing.assert_close(it.reference(w, x, as_list), ref)
    torch.testing.assert_close(it.reference(w, x, ly), ref)
    func = compile_module(task, task.space.default())["main"]
    for form in (ly, as_list, tuple(as_list)):
        it.check_inputs(w, x, form)
        args, out = it.kernel_args(w, task.space.default(), (), x, form)
        assert args[1].shape == (4, 3, 8) and args[1].is_contiguous()
        func(*args)
        close(out, ref, w)


def test_self_interaction_keeps_the_diagonal():
    strict = make_task("interaction", "cpu", batch=2, tables=2, dim=4)
    diag = make_task("interaction", "cpu", batch=2, tables=2, dim=4, self_interaction=True)
    assert strict.workload.out_dim == 4 + 3 and diag.workload.out_dim == 4 + 6
    x = torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0]])
    ly = torch.tensor([[[2.0, 0, 0, 0], [0, 0, 3.0, 0]], [[0, 2.0, 0, 0], [1.0, 1.0, 0, 0]]])
    # features of sample 0: e0, 2 e0, 3 e2 -> tril(-1) = (1,0) (2,0) (2,1); tril(0) adds (0,0) (1,1) (2,2)
    out_s = run(strict, strict.space.default(), x, ly)
    out_d = run(diag, diag.space.default(), x, ly)
    torch.testing.assert_close(out_s[0, 4:], torch.tensor([2.0, 0, 0]))
    torch.testing.assert_close(out_d[0, 4:], torch.tensor([1.0, 2, 4, 0, 0, 9]))
    torch.testing.assert_close(out_d[1, 4:], torch.tensor([1.0, 2, 4, 1, 2, 2]))
    torch.testing.assert_close(out_s[:, :4], x)


def test_cat_mode_every_config():
    task = make_task("interaction", "cpu", batch=5, tables=3, dim=12, mode="cat")
    w = task.workload
    x, ly = it.inputs(w, seed=2)
    ref = it.reference(w, x, ly)
    torch.testing.assert_close(ref, torch.cat([x] + list(ly.unbind(1)), dim=1))
    assert {c[cpu.COPY_LANES] for c in task.space} == {4, 1}  # 8 and 16 do not divide 12
    rng = random.Random(1)
    configs = list(task.space)
    for cfg in [task.space.default()] + rng.sample(configs, 3):
        torch.testing.assert_close(run(task, cfg, x, list(ly.unbind(1))), ref, rtol=0, atol=0, msg=str(cfg))
    assert it.traffic(w, x, ly).unit == "GB/s"


def test_kernel_serves_other_batch_sizes_than_tuned():
    task = make_task("interaction", "cpu", batch=8, tables=4, dim=16)
    func = compile_module(task, task.space.default())["main"]
    for batch in (1, 13):
        w = it.Workload(batch=batch, tables=4, dim=16)
        x, ly = it.inputs(w, seed=batch)
        args, out = it.kernel_args(w, task.space.default(), (), x, ly)
        func(*args)
        close(out, it.reference(w, x, ly), w)


def test_check_cases_of_large_terms_pass_a_correct_kernel_and_fail_one_off_by_a_little_of_the_terms():
    """`autotune check`'s cases of large values and of dot products that cancel, judged as every check judges a
    kernel (`runtime.judge`: against float64, within a bound scaled by the terms): the default kernel passes
    both, a kernel off by 3e-4 of the terms fails. Relative to the output, even PyTorch's fp32 fails the
    cancelling case: the case is one that a bound of that kind gets wrong."""
    task = make_task("interaction", "cpu", batch=16, tables=8, dim=64)
    w, cfg = task.workload, task.space.default()
    kernel = BoundKernel(it, w, cfg, compile_module(task, cfg)["main"], on_gpu=False)
    binding = it.torch_binding()
    cases = {name: (args, kwargs) for name, args, kwargs in binding.cases(w, 0, 0)}
    for name in ("values of magnitude 1e3", "cancelling dot products of magnitude 1e3"):
        args, kwargs = cases[name]
        exp = expected_call(it, w, binding.op, *args, **kwargs)
        out = kernel(*args)
        assert mismatch(out, exp) is None, name
        why = mismatch(out + 3e-4 * exp.float64.magnitude.float(), exp)
        assert why is not None and "float64" in why and "magnitude" in why, name
    relative_to_output = Expected(exp.float64.value.float(), exp.rtol, exp.atol)  # the native rule's bound
    assert mismatch(exp.pytorch, relative_to_output) is not None


def test_kernel_is_fused_without_batch_sized_intermediates():
    """Only small per-call or per-sample buffers: no (B, F, F) Z, no concatenated copy of the inputs."""
    task = make_task("interaction", "cpu", batch=16, tables=26, dim=64)
    cfg = task.space.default()
    text = task.lower(cfg).script()
    shapes = re.findall(r"sblock_alloc_buffer\(\(([^)]*)\)", text)
    assert shapes, "expected the staged features and accumulators as block buffers"
    for shape in shapes:
        dims = [s.strip() for s in shape.split(",") if s.strip()]
        assert all(d.isdigit() for d in dims), f"a batch-dependent intermediate: {shape}"
        assert int(dims[0]) <= 27 * 64 * 2, shape  # at most the staged features of one sample (or the table)


def test_space_rejects_other_targets_and_lower_rejects_bad_configs(host):
    w = it.Workload(batch=4, tables=3, dim=16)
    rocm = SimpleNamespace(kind=SimpleNamespace(name="rocm"))
    with pytest.raises(InvalidConfig, match="rocm"):
        it.space(w, rocm)
    with pytest.raises(InvalidConfig, match="rocm"):
        it.lower(w, it.space(w, host.target()).default(), rocm)
    sp = it.space(w, host.target())
    good = sp.default().to_json()
    with pytest.raises(InvalidConfig, match="1 KiB"):
        sp.make({**good, "lanes": 16, "pairs_per_block": 16})
    with pytest.raises(InvalidConfig, match="divide"):
        sp.make({**good, "lanes": 16, "dim_unroll": 2})  # 16 / 16 = 1 chunk
    # a config that skipped the space's constraints is refused by lower(), not built into a crash
    from search_spaces import Config

    raw = Config(tuple((k, v) for k, v in {**good, "lanes": 16, "dim_unroll": 2}.items()))
    with pytest.raises(InvalidConfig, match="dim_unroll"):
        it.lower(w, raw, host.target())
    # lanes beyond the next power of two of D only pad, and scalar code is only offered for small D
    knobs = {k.name: set(k.values) for k in it.space(it.Workload(batch=2, tables=2, dim=3), host.target()).knobs}
    assert knobs["lanes"] == {4, 1} and knobs["dim_unroll"] == {1}  # 1 chunk of 4 lanes, or 3 of 1
    knobs = {k.name: set(k.values) for k in sp.knobs}
    assert knobs["lanes"] == {8, 16, 4} and knobs["dim_unroll"] == {1, 2, 4}


@pytest.mark.parametrize("shape, message", [
    ("batch=0,tables=3,dim=8", "batch"),
    ("batch=2,tables=0,dim=8", "tables"),
    ("batch=2,tables=3,dim=0", "dim"),
    ("batch=2,tables=3,dim=-4", "dim"),
    ("batch=2,tables=3,dim=8,mode=sum", "mode"),
    ("batch=2,tables=3,dim=8,dtype=float16", "dtype"),
    ("batch=2,tables=3,dim=8,mode=cat,self=1", "self_interaction"),
    ("batch=2,tables=3", "missing dim"),
    ("batch=2,tables=x,dim=8", "expected int"),
    ("batch=2,tables=3,dim=8,self=maybe", "expected bool"),
    ("batch=2,tables=3,dim=8,rows=10", "unknown shape key"),
])
def test_bad_shapes_are_clear_errors(shape, message):
    with pytest.raises(WorkloadError, match=message):
        it.Workload.from_shape(shape)


def test_shape_text_parses_aliases_and_round_trips():
    w = it.Workload.from_shape("batch=2048,tables=26,dim=64,self=1")
    assert (w.batch, w.tables, w.dim, w.self_interaction, w.mode) == (2048, 26, 64, True, "dot")
    assert w.features == 27 and w.pairs == 27 * 28 // 2 and w.out_dim == 64 + 378
    assert it.Workload.from_json(w.to_json()) == w
    example = it.Workload.from_shape(it.EXAMPLE_SHAPE)
    assert example.pairs == 351 and example.out_dim == 415


@pytest.mark.parametrize("kw", [dict(), dict(self_interaction=True), dict(mode="cat")])
def test_baselines_compute_the_same_op(kw):
    w = it.Workload(batch=3, tables=4, dim=8, **kw)
    x, ly = it.inputs(w, 0)
    ref = it.reference(w, x, ly)
    paths = it.baselines(w, x, list(ly.unbind(1)))
    assert len(paths) == 2
    for name, fn in paths.items():
        torch.testing.assert_close(fn(), ref, msg=name)


def test_traffic_counts_useful_flops():
    w = it.Workload(batch=4, tables=3, dim=8)
    x, ly = it.inputs(w, 0)
    tr = it.traffic(w, x, ly)
    assert tr.unit == "GFLOPS" and tr.ops == 2 * 4 * 6 * 8
    assert tr.bytes == 4 * 4 * (4 * 8 + 8 + 6)


def test_check_inputs_rejects_bad_tensors():
    w = it.Workload(batch=3, tables=2, dim=4)
    x, ly = it.inputs(w, 0)
    it.check_inputs(w, x, ly)
    it.check_inputs(w, x, list(ly.unbind(1)))
    it.check_inputs(w, x[:2].contiguous(), ly[:2].contiguous())  # any batch size
    with pytest.raises(TypeError, match="x must be float32"):
        it.check_inputs(w, x.double(), ly)
    with pytest.raises(TypeError, match="ly must be float32"):
        it.check_inputs(w, x, ly.half())
    with pytest.raises(TypeError, match="ly\\[1\\] must be float32"):
        it.check_inputs(w, x, [ly[:, 0], ly[:, 1].double()])
    with pytest.raises(TypeError, match="torch.Tensor"):
        it.check_inputs(w, x.numpy(), ly)
    with pytest.raises(TypeError, match="list of 2"):
        it.check_inputs(w, x, ly.numpy())
    with pytest.raises(ValueError, match=r"x must be \(batch, 4\)"):
        it.check_inputs(w, torch.randn(3, 5), ly)
    with pytest.raises(ValueError, match=r"\(batch, 2, 4\)"):
        it.check_inputs(w, x, torch.randn(3, 3, 4))
    with pytest.raises(ValueError, match="batch 2 but x has 3"):
        it.check_inputs(w, x, ly[:2].contiguous())
    with pytest.raises(ValueError, match="hold 2 tensors"):
        it.check_inputs(w, x, [ly[:, 0]])
    with pytest.raises(ValueError, match=r"ly\[0\] must be \(3, 4\)"):
        it.check_inputs(w, x, [torch.randn(2, 4), ly[:, 1]])
    with pytest.raises(ValueError, match="x must be contiguous"):
        it.check_inputs(w, torch.randn(4, 3).t(), ly)
    with pytest.raises(ValueError, match="ly must be contiguous"):
        it.check_inputs(w, x, torch.randn(3, 4, 2).transpose(1, 2))
    with pytest.raises(ValueError, match="is on meta"):
        it.check_inputs(w, x.to("meta"), ly)
    with pytest.raises(ValueError, match=r"ly\[0\] is on meta"):
        it.check_inputs(w, x, [ly[:, 0].to("meta"), ly[:, 1]])
    with pytest.raises(InvalidDtype, match="x must be float32"):  # PyTorch's RuntimeError too
        it.check_inputs(w, x.double(), ly)
    with pytest.raises(InvalidInput, match="x must be contiguous"):
        it.check_inputs(w, torch.randn(4, 3).t(), ly)


# ---- CUDA ------------------------------------------------------------------------------------------------
# No GPU here: kernels are built with nvcc through the build pool (limits checked by ptxas), and their
# generated CUDA C is run on the CPU by the emulator of tests/cuda_emulator.py to check what they compute.
GPU_SMALL = dict(batch=64, tables=5, dim=16)
DLRM = dict(batch=2048, tables=26, dim=128)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("fields, n", [(GPU_SMALL, 4), ({**GPU_SMALL, "self_interaction": True}, 1),
                                       ({**GPU_SMALL, "mode": "cat"}, 1)], ids=["dot", "self", "cat"])
def test_gpu_default_and_sampled_configs_build_within_limits(gpu_builder, arch, fields, n):
    task, built = build_sample(gpu_builder, "interaction", arch, n=n, seed=7, **fields)
    assert_built_within_limits(task, built)
    assert built[0].lib is not None, built[0].error  # the default config always builds


@pytest.mark.parametrize("arch", ARCHS)
def test_gpu_space_keeps_threads_and_shared_memory_within_limits(arch):
    task = make_task("interaction", f"cuda:{arch}", **DLRM)
    w, spec, space = task.workload, task.device.gpu, task.space
    rng = random.Random(arch)
    for cfg in [space.default()] + [space.sample(rng) for _ in range(500)]:
        assert cfg[cuda.THREADS] <= spec.max_threads_per_block, cfg
        assert cuda.cuda_shared_bytes(w, cfg) <= spec.shared_memory_per_block, cfg
    # the untuned default is a fast-looking config: 16-byte loads, at least 4 blocks per SM
    default = space.default()
    assert default[cuda.VECTOR] == 4 and -(-w.batch // default[cuda.SAMPLES_PER_BLOCK]) >= 4 * spec.sms
    # a config that skipped the space's constraints is refused by lower(), not built into a crash
    from search_spaces import Config

    raw = Config(tuple({**default.to_json(), "samples_per_block": 8}.items()))
    with pytest.raises(InvalidConfig, match="shared memory"):
        task.lower(raw)


def test_gpu_shared_memory_model_matches_the_generated_kernels():
    task = make_task("interaction", "cuda:sm_90", **DLRM)
    w, space = task.workload, task.space
    vectorised = space.make({**space.default().to_json(), "staging": "shared", "output": "direct"})
    for cfg in (space.default(), vectorised, space.sample(random.Random(3))):
        source = cuda_source(task, cfg)
        arrays = re.findall(r"__shared__ alignas\(\d+\) float(\d?) \w+\[(\d+)\];", source)  # float, float4...
        declared = sum(4 * int(lanes or 1) * int(n) for lanes, n in arrays)
        modelled = cuda.cuda_shared_bytes(w, cfg)
        assert modelled <= declared <= modelled + 8, (cfg, arrays)  # + unused 1-float arrays
        assert int(re.search(r"__launch_bounds__\((\d+)\)", source).group(1)) == cfg[cuda.THREADS]
        if cfg == space.default():
            assert "*(float4*)(ly_ptr" in source  # 16-byte loads of the embeddings
            assert "call_llvm" not in task.lower(cfg).script()  # no host intrinsics in the kernel


@pytest.mark.parametrize("self_interaction", [False, True])
def test_cuda_tiles_cover_every_kept_pair_once(self_interaction):
    for tables in range(1, 9):
        w = it.Workload(batch=1, tables=tables, dim=4, self_interaction=self_interaction)
        f = w.features
        for side in (1, 2, 3, 4):
            grid = cuda.tile_grid(w, side)
            written = []
            for t in range(grid.count):
                i0, j0 = grid.origin(t)
                written += [(i, j) for i in range(i0, i0 + side) for j in range(j0, j0 + side)
                            if i < f and j < i + self_interaction]
            kept = list(zip(*(v.tolist() for v in torch.tril_indices(f, f, 0 if self_interaction else -1))))
            assert sorted(written) == kept, (tables, side)


def test_gpu_space_follows_the_workload():
    small = make_task("interaction", "cuda:sm_90", batch=3, tables=1, dim=5).space  # F = 2, odd D
    knobs = {k.name: set(k.values) for k in small.knobs}
    assert knobs["vector"] == {1} and knobs["dot_lanes"] == {1} and knobs["pair_tile"] == {1, 2}
    assert knobs["samples_per_block"] == {1, 2} and len(small) > 0
    cat = make_task("interaction", "cuda:sm_80", batch=4, tables=3, dim=12, mode="cat").space
    assert [k.name for k in cat.knobs] == ["vector", "threads", "items_per_thread"]
    assert {c[cuda.VECTOR] for c in cat} == {4, 2, 1}
    for cfg in make_task("interaction", "cuda:sm_80", **DLRM).space:  # every config divides D evenly
        assert DLRM["dim"] % (cfg[cuda.DOT_LANES] * cfg[cuda.VECTOR]) == 0


def test_check_inputs_wants_one_device_and_outputs_follow_it():
    w = it.Workload(batch=3, tables=2, dim=4)
    x, ly = it.inputs(w, 0)
    with pytest.raises(ValueError, match="ly is on meta but x is on cpu: all inputs must be on one device"):
        it.check_inputs(w, x, ly.to("meta"))
    with pytest.raises(ValueError, match=r"ly\[1\] is on meta but x is on cpu: all inputs must be on one"):
        it.check_inputs(w, x, [ly[:, 0], ly[:, 1].to("meta")])
    x, ly = x.to("meta"), ly.to("meta")  # any one device is fine, and the output is allocated there
    it.check_inputs(w, x, ly)
    it.check_inputs(w, x, list(ly.unbind(1)))
    args, out = it.kernel_args(w, make_task("interaction", "cpu", workload=w).space.default(), (), x, ly)
    assert out.device == x.device and out.shape == (3, w.out_dim)


@needs_gxx
@pytest.mark.parametrize("fields, batch, changes", [
    (GPU_SMALL | {"batch": 6}, 6, [{}, dict(staging="none", output="direct", pair_tile=3, dot_lanes=1)]),
    # the DLRM shape's F and D, and a larger batch than tuned: the blocks loop over further groups of samples
    (dict(batch=2, tables=26, dim=128), 5, [{}, dict(samples_per_block=2, pair_tile=2, dot_lanes=8)]),
    (dict(batch=5, tables=3, dim=12, self_interaction=True), 5,
     [dict(samples_per_block=2, staging="shared", pair_tile=1, dot_lanes=2, output="direct")]),
    (dict(batch=3, tables=1, dim=5), 3, [{}]),  # F = 2, scalar loads
    (dict(batch=5, tables=4, dim=12, mode="cat"), 7, [dict(vector=4, items_per_thread=2)]),
], ids=["small", "dlrm-grid-stride", "self-dim12", "F2-dim5", "cat"])
def test_cuda_kernels_match_the_reference_when_emulated(fields, batch, changes):
    """The default config and configs that change the knobs with their own code paths."""
    task = make_task("interaction", "cuda:sm_90", **fields)
    w = it.Workload(**{**task.workload.to_json(), "batch": batch})
    x, ly = it.inputs(w, seed=batch)
    ref = it.reference(w, x, ly)
    for change in changes:
        cfg = task.space.make({**task.space.default().to_json(), **change})
        out = torch.full_like(ref, float("nan"))
        grid, block = launch_dims(task.lower(cfg))
        emulate_cuda(cuda_source(task, cfg), grid, block, dict(x=x, ly=ly, out=out, B=batch))
        close(out, ref, w, msg=str(cfg))
