"""The quantized-matmul template against exact PyTorch arithmetic, for random configs of its space."""

import random
import re

import pytest
from conftest import cpu_flags, needs_gxx
import torch

from autotune.build import compile_module
from autotune.kernel import Kernel
from autotune.task import make_task
from cuda_emulator import cuda_source, emulate_cuda
from gpu_build import ARCHS, assert_built_within_limits
from search_spaces import InvalidConfig, WorkloadError
from search_spaces import qmatmul as qm
from search_spaces.qmatmul import cuda
from search_spaces.qmatmul.workload import accumulate


def run(task, cfg, tensors):
    return task.bind(cfg, compile_module(task, cfg)["main"])(*tensors)


def configs(task, n, seed, **fixed):
    rng = random.Random(seed)
    pool = [c for c in (task.space.sample(rng) for _ in range(3000))
            if all(c.as_dict()[k] == v for k, v in fixed.items())]
    return list(dict.fromkeys(pool))[:n]


SHAPES = [
    "m=1,k=16,n=16",                      # a single row (M = 1)
    "m=13,k=37,n=19,relu=1",              # K and N not multiples of any tile, ReLU
    "m=20,k=64,n=48,bias=0",              # no bias
    "m=9,k=20,n=30,mode=weight_only,relu=1",
    "m=5,k=33,n=17,mode=weight_only,bias=0",
]


@pytest.mark.parametrize("shape", SHAPES)
def test_matches_reference_for_default_and_random_configs(shape):
    task = make_task("qmatmul", "cpu", shape=shape)
    tensors = qm.inputs(task.workload, seed=1)
    ref = qm.reference(task.workload, *tensors)
    rtol, atol = qm.tolerance(task.workload)
    for cfg in [task.space.default()] + configs(task, 3, seed=len(shape)):
        out = run(task, cfg, tensors)
        assert out.shape == ref.shape
        torch.testing.assert_close(out, ref, rtol=rtol, atol=atol, msg=str(cfg))


# /proc/cpuinfo's flags each intrinsic needs (the space asks LLVM: avx2, avx512vnni + avx512bw)
CPU_FLAGS_OF = {"none": set(), "avx2": {"avx2"}, "avx2_u7": {"avx2"}, "vnni": {"avx512_vnni", "avx512bw"},
                "amx": {"amx_tile", "amx_int8"}}


@pytest.mark.parametrize("intrinsic", ["none", "avx2", "vnni", "amx"])
def test_int32_accumulation_is_exact_for_every_available_intrinsic(intrinsic):
    if not CPU_FLAGS_OF[intrinsic] <= cpu_flags():  # the CPU's flags decide, not the space under test
        pytest.skip(f"this CPU has no {intrinsic} path")
    task = make_task("qmatmul", "cpu", shape="m=10,k=70,n=40,bias=0")
    assert intrinsic in [c.as_dict()["intrinsic"] for c in task.space], f"the space lacks {intrinsic} on this CPU"
    w = task.workload
    a, weight, _, _ = qm.inputs(w, seed=2)
    a[0, :] = -128  # extremes: -128 * -128 must not saturate anywhere
    weight[0, :] = -128
    ones_m, ones_n = torch.ones(w.m), torch.ones(w.n)  # unit scales: the output is the int32 sum itself
    exact = accumulate(a, weight)
    for cfg in configs(task, 3, seed=5, intrinsic=intrinsic):
        out = run(task, cfg, (a, weight, ones_m, ones_n))
        assert torch.equal(out.to(torch.int64), exact.to(torch.int64)), str(cfg)


@pytest.mark.parametrize("op, shape", [("qmatmul", "m=70,k=70,n=80,mode=uint8"),
                                       ("qmatmul_requant", "m=70,k=70,n=80,out_qmax=127")])
@pytest.mark.parametrize("intrinsic", ["none", "vnni", "amx"])
def test_columns_order_computes_what_rows_order_computes(op, shape, intrinsic):
    """block_order only reorders a task's register tiles: each output is the same sum, bit for bit (a task of
    several tile rows and columns, tiles ragged at M and N)."""
    if not CPU_FLAGS_OF[intrinsic] <= cpu_flags():
        pytest.skip(f"this CPU has no {intrinsic} path")
    task = make_task(op, "cpu", shape=shape)
    tensors = task.template.inputs(task.workload, 3)
    base = {"intrinsic": intrinsic, "layout": "n16k4" if intrinsic != "none" else "n16k1", "m_tile": 2,
            "n_vectors": 1, "k_block": 0, "m_block": 64, "unroll": True, "threading": "parallel"}
    if op == "qmatmul":
        base["n_block"] = 64
    rows, cols = (task.space.from_json({**base, "block_order": order}) for order in ("rows", "columns"))
    out_rows, out_cols = run(task, rows, tensors), run(task, cols, tensors)
    for r, c in zip(*(o if isinstance(o, tuple) else (o,) for o in (out_rows, out_cols))):
        assert torch.equal(r, c)


def test_amx_k_blocks_keep_their_own_order():
    task = make_task("qmatmul", "cpu", shape="m=64,k=2048,n=64")
    if "amx" not in {c.as_dict()["intrinsic"] for c in task.space}:
        pytest.skip("this CPU has no AMX path")
    assert {c.as_dict()["block_order"] for c in task.space if c.as_dict()["intrinsic"] == "amx"
            and c.as_dict()["k_block"]} == {"rows"}


def test_7bit_activations_get_the_u8_avx2_path_and_it_is_exact_at_the_range_ends():
    full = make_task("qmatmul", "cpu", shape="m=10,k=70,n=40,bias=0")
    task = make_task("qmatmul", "cpu", shape="m=10,k=70,n=40,bias=0,a_bits=7")
    assert "avx2_u7" not in {c.as_dict()["intrinsic"] for c in full.space}  # it would saturate on 8 bits
    if not CPU_FLAGS_OF["avx2_u7"] <= cpu_flags():
        pytest.skip("this CPU has no AVX2")
    assert "avx2_u7" in {c.as_dict()["intrinsic"] for c in task.space}, "the space lacks avx2_u7 on an AVX2 CPU"
    w = task.workload
    a, weight, _, _ = qm.inputs(w, seed=2)
    assert a.min() >= -64 and a.max() <= 63 and a.min() < -50  # inputs of the workload use its range
    a[0, :], a[1, :] = -64, 63  # the ends: (63 + 64) * -128 pairs are the largest int16 sums
    weight[0, :], weight[1, :] = -128, 127
    ones_m, ones_n = torch.ones(w.m), torch.ones(w.n)
    exact = accumulate(a, weight)
    for cfg in configs(task, 3, seed=5, intrinsic="avx2_u7"):
        out = run(task, cfg, (a, weight, ones_m, ones_n))
        assert torch.equal(out.to(torch.int64), exact.to(torch.int64)), str(cfg)


def test_a_bits_is_validated():
    with pytest.raises(WorkloadError, match="a_bits"):
        qm.Workload(m=4, k=8, n=8, a_bits=6)
    with pytest.raises(WorkloadError, match="int8"):
        qm.Workload(m=4, k=8, n=8, mode="weight_only", a_bits=7)


@pytest.mark.parametrize("mode", ["int8", "uint8"])
def test_amx_blocks_load_the_tile_configuration_in_every_task(mode):
    """AMX kernels of many parallel tasks (several per thread, and one serial loop of them), tiles of 1 or 2 x
    1 or 2, K and N not whole tiles, over the whole K or k block by k block (the accumulators through C): a
    task whose first block did not load the tile configuration, a block reading another's tiles, or a k block
    lost or added twice would fault or differ from the exact sum."""
    if not CPU_FLAGS_OF["amx"] <= cpu_flags():
        pytest.skip("this CPU has no AMX")
    task = make_task("qmatmul", "cpu", shape=f"m=150,k=2050,n=90,bias=0,mode={mode},relu={int(mode == 'uint8')}")
    w = task.workload
    a, weight, _, _ = qm.inputs(w, seed=4)
    low, high = (0, 255) if mode == "uint8" else (-128, 127)
    a[0, :], a[1, :] = low, high  # the range's ends against -128 and 127 weights
    weight[0, :], weight[1, :] = -128, 127
    ones_m, ones_n = torch.ones(w.m), torch.ones(w.n)
    exact = accumulate(a, weight).to(torch.int64)
    exact = exact.clamp_min(0) if w.relu else exact
    amx = [c for c in task.space if c.as_dict()["intrinsic"] == "amx"]
    small_tasks = {(d["m_tile"], d["n_vectors"], d["k_block"]): c for c in amx for d in [c.as_dict()]
                   if d["m_block"] == 16 and d["n_block"] == 32 and d["threading"] == "parallel"}
    assert set(small_tasks) == {(m, n, k) for m in (1, 2) for n in (1, 2) for k in (0, 64, 128, 256, 512)}
    picks = [*small_tasks.values(), *(next(c for c in amx if c.as_dict()["threading"] == "serial"
                                           and c.as_dict()["k_block"] == k) for k in (0, 64))]
    for cfg in picks:  # int32 sums beyond 2**24 at this K: the float32 output is the exact sum's rounding
        out = run(task, cfg, (a, weight, ones_m, ones_n))
        assert torch.equal(out, exact.to(torch.float32)), str(cfg)


def test_amx_k_blocks_are_offered_from_a_k_of_2048():
    def k_blocks(k):
        space = make_task("qmatmul", "cpu:sapphirerapids", shape=f"m=64,k={k},n=64").space
        return {c.as_dict()["k_block"] for c in space if c.as_dict()["intrinsic"] == "amx"}

    assert k_blocks(1024) == {0} and k_blocks(2048) == {0, 64, 128, 256, 512}


def test_amx_is_offered_only_where_the_cpu_has_it():
    def intrinsics(device):
        return {c.as_dict()["intrinsic"] for c in make_task("qmatmul", device, shape="m=8,k=64,n=16").space}

    assert "amx" in intrinsics("cpu:sapphirerapids") and "amx" not in intrinsics("cpu:znver4")
    assert "amx" not in {c.as_dict()["intrinsic"] for c in
                         make_task("qmatmul", "cpu:sapphirerapids", shape="m=8,k=64,n=16,mode=weight_only").space}


def test_pack_layout_puts_nb_channels_by_kb_reductions_side_by_side():
    task = make_task("qmatmul", "cpu", shape="m=4,k=8,n=16")
    cfg = next(c for c in task.space if c.as_dict()["layout"] == "n8k2" and c.as_dict()["n_vectors"] == 1)
    weight = torch.arange(16 * 8, dtype=torch.int32).reshape(16, 8).to(torch.int8)
    (packed, *_) = qm.pack(task.workload, cfg, weight)
    assert packed.shape == (2, 4, 8, 2)
    for n in range(16):
        for k in range(8):
            assert packed[n // 8, k // 2, n % 8, k % 2] == weight[n, k]


def test_vnni_compensation_restores_signed_activations():
    task = make_task("qmatmul", "cpu", shape="m=4,k=8,n=16")
    if not CPU_FLAGS_OF["vnni"] <= cpu_flags():
        pytest.skip("no VNNI on this CPU")
    vnni = [c for c in task.space if c.as_dict()["intrinsic"] == "vnni"]
    assert vnni, "the space lacks vnni on a CPU with AVX-512 VNNI"
    weight = torch.randint(-128, 128, (16, 8), dtype=torch.int8)
    _, comp = qm.pack(task.workload, vnni[0], weight)
    assert torch.equal(comp[:16], 128 * weight.int().sum(1)) and not comp[16:].any()  # padded channels: 0


def test_kernel_repacks_only_when_the_weight_changes():
    task = make_task("qmatmul", "cpu", shape="m=8,k=32,n=16")
    k = Kernel(task, task.space.default())
    tensors = list(qm.inputs(task.workload, seed=0))
    torch.testing.assert_close(k(*tensors), qm.reference(task.workload, *tensors))
    packed = k.bound.pack(tensors)
    k(*tensors)
    assert k.bound.pack(tensors) is packed  # same weight: no repacking
    tensors[1].mul_(-1)  # an in-place update bumps the tensor version
    torch.testing.assert_close(k(*tensors), qm.reference(task.workload, *tensors))
    assert k.bound.pack(tensors) is not packed


def test_baselines_compute_the_same_op():
    w = qm.Workload(m=32, k=64, n=32, relu=True)
    tensors = qm.inputs(w, seed=0)
    ref = qm.reference(w, *tensors)
    paths = qm.baselines(w, *tensors)
    torch.testing.assert_close(paths["torch._int_mm + epilogue"](), ref, rtol=1e-5, atol=1e-4)
    fbgemm = paths.get("quantized.linear (fbgemm)")
    if fbgemm is not None:  # 8-bit activations and output: close, not equal
        assert (fbgemm() - ref).abs().max() < 0.05 * ref.abs().max()


@pytest.mark.parametrize("shape, message", [
    ("m=0,k=4,n=4", "m must be"),
    ("m=4,k=4", "missing n"),
    ("m=4,k=4,n=4,mode=fp8", "mode"),
    ("m=4,k=4,n=4,relu=maybe", "expected bool"),
])
def test_bad_shapes_are_clear_errors(shape, message):
    with pytest.raises(WorkloadError, match=message):
        qm.Workload.from_shape(shape)


def test_check_inputs_rejects_bad_tensors():
    w = qm.Workload(m=4, k=8, n=6)
    a, weight, sa, sw, bias = qm.inputs(w)
    qm.check_inputs(w, a, weight, sa, sw, bias)
    with pytest.raises(TypeError, match="a must be torch.int8"):
        qm.check_inputs(w, a.float(), weight, sa, sw, bias)
    with pytest.raises(ValueError, match=r"weight must be \(6, 8\)"):
        qm.check_inputs(w, a, weight.t().contiguous(), sa, sw, bias)
    with pytest.raises(ValueError, match="contiguous"):
        qm.check_inputs(w, a, weight, sa, sw, torch.randn(12)[::2])
    with pytest.raises(TypeError, match="expected"):
        qm.check_inputs(w, a, weight, sa, sw)


def test_check_inputs_accepts_one_device_of_any_kind():
    w = qm.Workload(m=4, k=8, n=6)
    a, weight, sa, sw, bias = qm.inputs(w)
    qm.check_inputs(w, a.to("meta"), weight.to("meta"), sa.to("meta"), sw.to("meta"), bias.to("meta"))
    with pytest.raises(ValueError, match="one device"):
        qm.check_inputs(w, a, weight.to("meta"), sa, sw, bias)


def test_lower_refuses_a_config_of_the_other_device():
    cpu_task = make_task("qmatmul", "cpu", shape=qm.TEST_SHAPE)
    gpu_task = make_task("qmatmul", "cuda:sm_90", shape=qm.TEST_SHAPE)
    with pytest.raises(InvalidConfig, match="not one of the llvm space"):
        cpu_task.lower(gpu_task.space.default())
    with pytest.raises(InvalidConfig, match="not one of the cuda space"):
        gpu_task.lower(cpu_task.space.default())


# ---- GPU (CUDA): compiled with nvcc for each architecture, never run (no GPU here) --------------------------
SMALL = dict(m=64, k=128, n=64)
BIG = dict(m=4096, k=1024, n=1024)  # DLRM's MLP shape the GPU defaults are chosen for


def sample_of(task, path, rng):
    """A random config of the task's space that takes compute path `path`."""
    return next(c for c in (task.space.sample(rng) for _ in range(1000)) if c[cuda.COMPUTE] == path)


def one_per_path(task, seed):
    """The default config and one sampled config per compute path of the task's space."""
    rng = random.Random(seed)
    paths = [k for k in task.space.knobs if k.name == cuda.COMPUTE.name][0].values
    return list(dict.fromkeys([task.space.default()] + [sample_of(task, path, rng) for path in paths]))


def test_gpu_space_defaults_to_tensor_cores_with_a_large_tiling():
    for arch in ARCHS:
        task = make_task("qmatmul", f"cuda:{arch}", **BIG)
        cfg = task.space.default()
        assert cfg[cuda.COMPUTE] == "mma" and cfg[cuda.PREFETCH] and cfg[cuda.VECTOR_BYTES] == 16
        assert (cfg[cuda.BLOCK_M], cfg[cuda.BLOCK_N], cfg[cuda.WARP_M], cfg[cuda.WARP_N]) == (128, 128, 64, 64)
        assert cfg[cuda.BLOCK_K] in (32, 64)
    weight_only = make_task("qmatmul", "cuda:sm_90", mode="weight_only", **BIG).space
    (compute,) = [k for k in weight_only.knobs if k.name == cuda.COMPUTE.name]
    assert compute.values == ("plain",)  # fp32 activations: no int8 instruction applies


def test_gpu_space_offers_tensor_cores_from_sm_80_and_dp4a_from_sm_61():
    from autotune.targets import GpuSpec, gpu_device

    def paths(arch):
        target = gpu_device(GpuSpec(card="test", arch=arch, sms=1)).target()
        return {c[cuda.COMPUTE] for c in qm.space(qm.Workload(m=16, k=32, n=16), target)}

    assert paths("sm_60") == {"plain"}
    assert paths("sm_75") == {"dp4a", "plain"}
    assert paths("sm_80") == paths("sm_90") == {"mma", "dp4a", "plain"}


def test_gpu_sampled_configs_respect_threads_and_shared_memory_by_construction():
    """Threads, shared memory and accumulator registers recomputed here from the tile sizes, for configs
    sampled at DLRM's shape."""
    for arch in ARCHS:
        task = make_task("qmatmul", f"cuda:{arch}", **BIG)
        target = task.device.target()
        max_threads = int(target.attrs["max_threads_per_block"])
        max_shared = int(target.attrs["max_shared_memory_per_block"])
        rng = random.Random(3)
        for cfg in (task.space.sample(rng) for _ in range(300)):
            bm, bn, bk = cfg[cuda.BLOCK_M], cfg[cuda.BLOCK_N], cfg[cuda.BLOCK_K]
            if cfg[cuda.COMPUTE] == "mma":
                threads = 32 * (bm // cfg[cuda.WARP_M]) * (bn // cfg[cuda.WARP_N])
                shared = (bm + bn) * (bk + 16)
            else:
                threads = (bm // cfg[cuda.THREAD_M]) * (bn // cfg[cuda.THREAD_N])
                shared = bm * (bk + cfg[cuda.VECTOR_BYTES]) + bn * bk
            assert 32 <= threads <= max_threads, cfg
            assert shared <= max_shared, cfg
            assert bm * bn <= int(target.attrs["registers_per_block"]) // 2, cfg  # accumulators, one register each


def test_gpu_default_big_config_compiles_within_limits(gpu_builder):
    task = make_task("qmatmul", "cuda:sm_90", **BIG)
    (built,) = gpu_builder.build(task, [task.space.default()])
    assert built.error_kind is None, built.error
    assert_built_within_limits(task, [built])
    (kernel,) = built.usage
    assert kernel.threads == 128 and kernel.spill_bytes == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_gpu_every_compute_path_builds_within_limits(gpu_builder, arch):
    task = make_task("qmatmul", f"cuda:{arch}", **SMALL)
    configs = one_per_path(task, seed=len(arch))
    assert {c[cuda.COMPUTE] for c in configs} == {"mma", "dp4a", "plain"}
    weight_only = make_task("qmatmul", f"cuda:{arch}", mode="weight_only", relu=True, **SMALL)
    for t, cfgs in ((task, configs), (weight_only, one_per_path(weight_only, seed=1))):
        built = gpu_builder.build(t, cfgs)
        assert [b.error_kind for b in built] == [None] * len(built), [(b.config, b.error) for b in built]
        assert_built_within_limits(t, built)


@pytest.mark.parametrize("arch", ARCHS)
def test_gpu_int8_paths_use_their_instructions(arch):
    task = make_task("qmatmul", f"cuda:{arch}", **SMALL)
    mma = cuda_source(task, task.space.default(), header=False)
    assert "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32" in mma and "ldmatrix.sync.aligned" in mma
    dp4a = cuda_source(task, sample_of(task, "dp4a", random.Random(0)), header=False)
    assert re.search(r"__dp4a\(", dp4a) and "mma.sync" not in dp4a


def test_gpu_pack_and_kernel_args_follow_the_inputs_device():
    w = qm.Workload(m=5, k=40, n=24, relu=True)
    task = make_task("qmatmul", "cuda:sm_90", workload=w)
    tensors = qm.inputs(w, seed=0)
    for path in ("mma", "dp4a"):
        cfg = sample_of(task, path, random.Random(0))
        mp, kp, np_ = cuda.padded(w, cfg)
        meta = [t.to("meta") for t in tensors]
        (packed,) = qm.pack(w, cfg, meta[1])
        args, out = qm.kernel_args(w, cfg, (packed,), *meta)
        assert all(a.device.type == "meta" for a in args) and out.shape == (w.m, w.n)
        assert args[-1].shape == (mp, np_) and args[0].shape == (mp, kp)
        (cpu_packed,) = qm.pack(w, cfg, tensors[1])
        if path == "mma":  # (N, K) as stored, zero-padded
            assert cpu_packed.shape == (np_, kp)
            unpacked = cpu_packed
        else:  # (K/4, N*4): each channel's k..k+3 side by side
            assert cpu_packed.shape == (kp // 4, np_ * 4)
            unpacked = cpu_packed.view(kp // 4, np_, 4).permute(1, 0, 2).reshape(np_, kp)
        assert torch.equal(unpacked[: w.n, : w.k], tensors[1])
        assert not unpacked[w.n:].any() and not unpacked[:, w.k:].any()


# ---- the generated CUDA C, run on the CPU ----------------------------------------------------------------
# No GPU here, so what the kernels compute is checked by emulation (tests/cuda_emulator.py): warp-wide
# instructions (ldmatrix, mma.sync, shuffles) are computed lane by lane as the PTX ISA defines them, so the
# layouts the tensor-core path relies on are checked against the ISA, not against themselves.
def run_emulated(task, cfg, tensors):
    """The kernel's output for reference-order `tensors`, computed by emulating its CUDA C."""
    w = task.workload
    args, out = task.bind(cfg).arguments(*tensors)
    names = ["A", "Wp", "a_scale", "w_scale", "bias"] if w.mode == "int8" else ["A", "Wp", "w_scale", "bias"]
    named = dict(zip(names[:len(args) - 1], args[:-1]), Y=args[-1])
    mp, _, np_ = cuda.padded(w, cfg)
    if cfg[cuda.COMPUTE] == "mma":
        block = (32, (cfg[cuda.BLOCK_M] // cfg[cuda.WARP_M]) * (cfg[cuda.BLOCK_N] // cfg[cuda.WARP_N]))
    else:
        block = (cfg[cuda.BLOCK_N] // cfg[cuda.THREAD_N], cfg[cuda.BLOCK_M] // cfg[cuda.THREAD_M])
    emulate_cuda(cuda_source(task, cfg), (mp // cfg[cuda.BLOCK_M]) * (np_ // cfg[cuda.BLOCK_N]), block, named)
    return out


@needs_gxx
@pytest.mark.parametrize("fields, changes", [
    # tensor cores: the default (one 64x64 warp), four warps with prefetching off, one K slice of 128
    (dict(m=64, k=128, n=64, relu=True),
     [{}, dict(warp_m=32, warp_n=32, block_k=32, prefetch=False, vector_bytes=8),
      dict(warp_m=32, warp_n=32, block_k=128)]),
    # shapes that are not whole tiles, several blocks; dp4a and plain register tiles
    (dict(m=40, k=100, n=72), [dict(block_m=16, block_n=32, warp_m=16, warp_n=16, block_k=32, vector_bytes=8),
                               dict(compute="dp4a", block_m=16, block_n=32, thread_m=2, thread_n=4,
                                    block_k=32, vector_bytes=4, warp_m=64, warp_n=64),
                               dict(compute="plain", block_m=32, block_n=16, thread_m=4, thread_n=1,
                                    block_k=32, vector_bytes=4, prefetch=False, warp_m=64, warp_n=64)]),
    (dict(m=24, k=40, n=20, mode="weight_only", bias=False), [{}, dict(thread_m=4, thread_n=2, block_k=32, vector_bytes=8)]),
], ids=["mma", "ragged-all-paths", "weight-only"])
def test_cuda_kernels_match_the_reference_when_emulated(fields, changes):
    task = make_task("qmatmul", "cuda:sm_90", **fields)
    w = task.workload
    tensors = qm.inputs(w, seed=4)
    ref = qm.reference(w, *tensors)
    rtol, atol = qm.tolerance(w)
    for change in changes:
        cfg = task.space.make({**task.space.default().to_json(), **change})
        torch.testing.assert_close(run_emulated(task, cfg, tensors), ref, rtol=rtol, atol=atol, msg=str(cfg))


@pytest.mark.parametrize("shape, widths", [((5, 7), (0, 3, 0, 2)), ((5, 7), (0, 0, 0, 2)), ((5, 7), (0, 3)),
                                           ((5,), (0, 4)), ((5, 7), (0, 0, 0, 0))])
def test_zero_padded_is_f_pad_at_the_end_written_once(shape, widths):
    import torch.nn.functional as F

    from search_spaces.qmatmul.workload import zero_padded

    x = torch.randn(*shape)
    assert torch.equal(zero_padded(x, widths), F.pad(x, widths))
    assert zero_padded(x, (0, 0)) is x
    with pytest.raises(ValueError, match="at the end only"):
        zero_padded(x, (1, 0))
