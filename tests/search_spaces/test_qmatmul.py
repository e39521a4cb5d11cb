"""The quantized-matmul template against exact PyTorch arithmetic, for random configs of its space."""

import random

import pytest
import torch

from autotune.build import compile_module
from autotune.kernel import Kernel
from autotune.task import make_task
from search_spaces import WorkloadError
from search_spaces import qmatmul as qm


def run(task, cfg, tensors):
    func = compile_module(task, cfg)["main"]
    args, out = task.kernel_args(cfg, task.pack(cfg, tensors), tensors)
    func(*args)
    return out


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


@pytest.mark.parametrize("intrinsic", ["none", "avx2", "vnni"])
def test_int32_accumulation_is_exact_for_every_available_intrinsic(intrinsic):
    task = make_task("qmatmul", "cpu", shape="m=10,k=70,n=40,bias=0")
    if intrinsic not in [c.as_dict()["intrinsic"] for c in task.space]:
        pytest.skip(f"this CPU has no {intrinsic} path")
    w = task.workload
    a, weight, _, _ = qm.inputs(w, seed=2)
    a[0, :] = -128  # extremes: -128 * -128 must not saturate anywhere
    weight[0, :] = -128
    ones_m, ones_n = torch.ones(w.m), torch.ones(w.n)  # unit scales: the output is the int32 sum itself
    exact = qm.accumulate(w, a, weight)
    for cfg in configs(task, 3, seed=5, intrinsic=intrinsic):
        out = run(task, cfg, (a, weight, ones_m, ones_n))
        assert torch.equal(out.to(torch.int64), exact.to(torch.int64)), str(cfg)


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
    vnni = [c for c in task.space if c.as_dict()["intrinsic"] == "vnni"]
    if not vnni:
        pytest.skip("no VNNI on this CPU")
    weight = torch.randint(-128, 128, (16, 8), dtype=torch.int8)
    _, comp = qm.pack(task.workload, vnni[0], weight)
    assert torch.equal(comp[:16], 128 * weight.int().sum(1)) and not comp[16:].any()  # padded channels: 0


def test_kernel_repacks_only_when_the_weight_changes():
    task = make_task("qmatmul", "cpu", shape="m=8,k=32,n=16")
    k = Kernel(task, task.space.default())
    tensors = list(qm.inputs(task.workload, seed=0))
    torch.testing.assert_close(k(*tensors), qm.reference(task.workload, *tensors))
    packed = k._packed
    k(*tensors)
    assert k._packed is packed  # same weight: no repacking
    tensors[1].mul_(-1)  # an in-place update bumps the tensor version
    torch.testing.assert_close(k(*tensors), qm.reference(task.workload, *tensors))
    assert k._packed is not packed


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
