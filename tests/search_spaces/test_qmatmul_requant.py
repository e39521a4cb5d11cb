"""qmatmul_requant: qmatmul's kernels with a row-quantizing epilogue, against quantize_rows(qmatmul(...))."""

import random
import re

import pytest
from conftest import needs_gxx
import torch

from autotune.build import compile_module
from autotune.runtime import expected, mismatch
from autotune.task import make_task
from cuda_emulator import cuda_source, emulate_cuda
from gpu_build import assert_built_within_limits
from search_spaces import WorkloadError
from search_spaces import qmatmul_requant as rq
from search_spaces.qmatmul import cpu as qcpu
from search_spaces.qmatmul_requant.torch_op import check


def run(task, cfg, tensors):
    return task.bind(cfg, compile_module(task, cfg)["main"])(*tensors)


def sampled(task, n, seed):
    rng = random.Random(seed)
    return list(dict.fromkeys([task.space.default()] + [task.space.sample(rng) for _ in range(n)]))


SHAPES = [
    "m=13,k=37,n=19,relu=1,out_qmax=63",            # nothing whole tiles: padded rows and channels dropped
    "m=20,k=64,n=48,bias=0,a_bits=7,out_qmax=127",  # 7-bit in, 8-bit out, no bias, no ReLU: negative outputs
    "m=9,k=13,n=30,mode=weight_only,relu=1,out_qmax=63",  # DLRM's narrow head: float32 in
    "m=4,k=16,n=8,out_qmax=2",                      # the smallest range
]


@pytest.mark.parametrize("shape", SHAPES)
def test_matches_quantize_rows_of_qmatmul_for_default_and_random_configs(shape):
    task = make_task("qmatmul_requant", "cpu", shape=shape)
    tensors = rq.inputs(task.workload, seed=1)
    exp = expected(rq, task.workload, *tensors)
    ref = exp.pytorch
    for cfg in sampled(task, 3, seed=len(shape)):
        q, scale = run(task, cfg, tensors)
        assert q.dtype == torch.int8 and q.shape == ref[0].shape and scale.shape == ref[1].shape
        assert mismatch((q, scale), exp) is None, f"{cfg}: {mismatch((q, scale), exp)}"
        assert int(q.abs().max()) == task.workload.out_qmax  # each row's max maps to the range's end


@pytest.mark.parametrize("shape", ["m=13,k=37,n=19,relu=1,out_qmax=255",  # int8 in, uint8 rows out
                                   "m=9,k=2050,n=40,mode=uint8,relu=1,out_qmax=255",  # uint8 in and out
                                   "m=9,k=13,n=30,mode=weight_only,relu=1,out_qmax=255"])
def test_uint8_rows_after_a_relu_use_all_256_levels(shape):
    """out_qmax 255: each row in [0, 255] (its max at 255), as uint8, against the reference; every config of the
    space, VNNI's and AMX's among them where the CPU has them (uint8 activations enter both without the +128
    offset), AMX's over the whole k and k block by k block."""
    task = make_task("qmatmul_requant", "cpu", shape=shape)
    tensors = rq.inputs(task.workload, seed=2)
    exp = expected(rq, task.workload, *tensors)
    configs = sampled(task, 3, seed=7) + [c for c in task.space if c.as_dict()["intrinsic"] == "vnni"][:2]
    amx = [c for c in task.space if c.as_dict()["intrinsic"] == "amx"]
    configs += amx[:2] + [c for c in amx if c.as_dict()["k_block"]][:2]  # AMX over the whole k, and k blocks
    for cfg in dict.fromkeys(configs):
        q, scale = run(task, cfg, tensors)
        assert q.dtype == torch.uint8 and mismatch((q, scale), exp) is None, f"{cfg}: {mismatch((q, scale), exp)}"
        assert int(q.max()) == 255 and int(q.min()) == 0


def test_uint8_needs_a_relu_and_a_cpu():
    with pytest.raises(WorkloadError, match="needs relu"):
        make_task("qmatmul_requant", "cpu", shape="m=4,k=16,n=8,out_qmax=255")
    with pytest.raises(WorkloadError, match="a_bits applies"):
        make_task("qmatmul_requant", "cpu", shape="m=4,k=16,n=8,mode=uint8,a_bits=7,relu=1")


@pytest.mark.parametrize("mode", ["int8", "weight_only"])
def test_exact_where_the_layer_output_is_exact(mode):
    """Power-of-two scales and integer biases make every float step of the epilogue exact, so the kernel's Y is
    PyTorch's bit for bit, and so must q and scale be: one step of tolerance hides no rounding mistake here
    (truncating instead of rounding half to even, a reciprocal instead of a division)."""
    task = make_task("qmatmul_requant", "cpu", m=24, k=40, n=32, mode=mode, relu=False, out_qmax=63)
    w = task.workload
    tensors = list(rq.inputs(w, seed=3))
    if mode == "int8":
        tensors[2] = 2.0 ** -torch.randint(0, 4, (w.m,)).float()  # a_scale
    else:
        tensors[0] = torch.randint(-8, 9, (w.m, w.k)).float()  # integer activations
    tensors[-2] = 2.0 ** -torch.randint(0, 4, (w.n,)).float()  # w_scale
    tensors[-1] = torch.randint(-50, 51, (w.n,)).float()  # bias
    ref_q, ref_scale = rq.reference(w, *tensors)
    for cfg in sampled(task, 4, seed=11):
        q, scale = run(task, cfg, tensors)
        assert torch.equal(q, ref_q) and torch.equal(scale, ref_scale), str(cfg)


def test_cpu_tasks_own_whole_rows_and_the_float_output_is_no_argument():
    task = make_task("qmatmul_requant", "cpu", shape=SHAPES[0])
    names = [k.name for k in task.space.knobs]
    assert qcpu.N_BLOCK.name not in names and qcpu.M_BLOCK.name in names
    params = [p.name for p in task.lower(task.space.default())["main"].params]
    assert params[-3:] == ["Q", "S", "tasks"] and "Y" not in params  # tasks: any whole number (call_dims)


def test_out_qmax_is_validated():
    with pytest.raises(WorkloadError, match="out_qmax"):
        rq.Workload(m=4, k=16, n=8, out_qmax=1)
    with pytest.raises(WorkloadError, match="out_qmax"):
        rq.Workload(m=4, k=16, n=8, out_qmax=128)
    w = rq.Workload(m=4, k=16, n=8)
    a, weight, a_scale, w_scale, bias = rq.inputs(w)
    with pytest.raises(ValueError, match="autotune.qmatmul_requant: out_qmax"):
        check(a, weight, a_scale, w_scale, bias, out_qmax=200)
    with pytest.raises(ValueError, match="autotune.qmatmul_requant: weight must be"):
        check(a, weight[:, :8], a_scale, w_scale, bias)


def test_gpu_kernels_build_within_limits(gpu_builder):
    """CUDA: qmatmul's kernel, then the row max and the quantizing pass as two more kernels of the module."""
    for mode in ("int8", "weight_only"):
        task = make_task("qmatmul_requant", "cuda:sm_90", m=64, k=128, n=64, mode=mode, relu=True, out_qmax=63)
        built = gpu_builder.build(task, sampled(task, 2, seed=5))
        assert [b.error_kind for b in built] == [None] * len(built), [(b.config, b.error) for b in built]
        assert_built_within_limits(task, built)
        assert all(len(b.usage) == 4 for b in built)  # GEMM, row max, scale, quantize


# ---- the generated CUDA C, run on the CPU (tests/cuda_emulator.py) ---------------------------------------------
def run_emulated(task, cfg, tensors):
    """(q, scale) of the module's four kernels emulated in launch order: the GEMM into the Y scratch, the row max
    into `amax`, the scales, the quantizing pass. The scratch buffers TVM's host code would allocate are made
    here, by the names the kernels give them."""
    from search_spaces.qmatmul import cuda

    w = task.workload
    args, out = task.bind(cfg).arguments(*tensors)
    names = ["A", "Wp", "a_scale", "w_scale", "bias"] if w.mode == "int8" else ["A", "Wp", "w_scale", "bias"]
    named = dict(zip(names[:len(args) - 2], args[:-2]), Q=args[-2], S=args[-1])
    mp, _, np_ = cuda.padded(w, cfg)
    named.update(Y=torch.empty(mp, np_), amax=torch.empty(mp))
    source = cuda_source(task, cfg)
    header = source[:source.index('extern "C" __global__')]  # TVM's helpers, before the kernels' prototypes
    starts = [m.start() for m in re.finditer(r'extern "C" __global__ [^;{]*\{', source)]  # the definitions
    kernels = [source[a:b] for a, b in zip(starts, starts[1:] + [len(source)])]
    assert len(kernels) == 4
    if cfg[cuda.COMPUTE] == "mma":
        block = (32, (cfg[cuda.BLOCK_M] // cfg[cuda.WARP_M]) * (cfg[cuda.BLOCK_N] // cfg[cuda.WARP_N]))
    else:
        block = (cfg[cuda.BLOCK_N] // cfg[cuda.THREAD_N], cfg[cuda.BLOCK_M] // cfg[cuda.THREAD_M])
    threads = cuda._ROW_THREADS
    # the GEMM, then a block per row (its max), a thread per row (its scale), a thread per element
    launches = [((mp // cfg[cuda.BLOCK_M]) * (np_ // cfg[cuda.BLOCK_N]), block), (mp, cuda._MAX_THREADS),
                (-(-mp // threads), threads), (-(-mp * np_ // threads), threads)]
    for text, (grid, blk) in zip(kernels, launches):
        params = re.search(r"\(([^)]*)\)\s*\{", text).group(1)
        used = [p.strip().rsplit(" ", 1)[1].removesuffix("_ptr") for p in params.split(",") if p.strip()]
        emulate_cuda(header + text, grid, blk, {n: named[n] for n in used})
    return out


@needs_gxx
@pytest.mark.parametrize("fields, change", [
    (dict(m=40, k=100, n=72, relu=True), dict(block_m=16, block_n=32, warp_m=16, warp_n=16, block_k=32,
                                             vector_bytes=8)),  # tensor cores, several blocks, ragged
    (dict(m=40, k=100, n=72, a_bits=7), dict(compute="dp4a", block_m=16, block_n=32, thread_m=2, thread_n=4,
                                             block_k=32, vector_bytes=4, warp_m=64, warp_n=64)),
    (dict(m=24, k=13, n=20, mode="weight_only", relu=True), dict(thread_m=4, thread_n=2, block_k=32,
                                                                  vector_bytes=8)),
], ids=["mma", "dp4a", "weight-only"])
def test_cuda_kernels_match_the_reference_when_emulated(fields, change):
    task = make_task("qmatmul_requant", "cuda:sm_90", out_qmax=63, **fields)
    w = task.workload
    tensors = rq.inputs(w, seed=4)
    cfg = task.space.make({**task.space.default().to_json(), **change})
    out = run_emulated(task, cfg, tensors)
    assert mismatch(out, expected(rq, w, *tensors)) is None, str(cfg)
