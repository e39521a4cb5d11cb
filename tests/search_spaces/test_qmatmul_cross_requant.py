"""qmatmul_cross_requant: qmatmul_cross's CPU kernels whose tasks also quantize their rows, against
quantize_rows(x0 * qmatmul(...) + x)."""

import random

import pytest
import torch

from autotune.build import compile_module
from autotune.runtime import expected, mismatch
from autotune.task import make_task
from search_spaces import InvalidDtype, WorkloadError
from search_spaces import qmatmul_cross_requant as qr
from search_spaces.quantize_rows.workload import quantize_rows
from search_spaces.qmatmul_cross_requant.torch_op import check
from search_spaces.qmatmul_cross_requant.workload import split


def run(task, cfg, tensors):
    return task.bind(cfg, compile_module(task, cfg)["main"])(*tensors)


SHAPES = [
    "m=13,k=37,n=19",                            # nothing whole tiles: padded rows and channels dropped
    "m=20,k=64,n=48,bias=0,a_bits=7,out_qmax=63",  # no bias; 7-bit activations in and out
    "m=9,k=64,n=40,mode=uint8,out_float=0",      # uint8 activations; y never written
    "m=20,k=2050,n=40",                          # AMX k blocks
    "m=11,k=64,n=40,smooth=1",                   # the next layer smoothed: y * factors quantized, y unscaled
    "m=16,k=96,n=48,smooth=1,out_float=0",
]


def configs(task, seed):
    """The default, a random config and the first of each intrinsic the CPU has (and of AMX k blocks)."""
    out = [task.space.default(), task.space.sample(random.Random(seed))]
    for intrin in ("vnni", "amx", "avx2", "none"):
        out += [c for c in task.space if c.as_dict()["intrinsic"] == intrin][:1]
    out += [c for c in task.space if c.as_dict()["intrinsic"] == "amx" and c.as_dict()["k_block"]][:1]
    return list(dict.fromkeys(out))


@pytest.mark.parametrize("shape", SHAPES)
def test_matches_the_reference_and_quantizes_its_own_rows_exactly(shape):
    """Every inner kernel agrees with the reference; and its q and scales are exactly quantize_rows' of the y it
    computed (y from qmatmul_cross's kernel of the same config where y is not written)."""
    task = make_task("qmatmul_cross_requant", "cpu", shape=shape)
    w = task.workload
    tensors = qr.inputs(w, seed=1)
    exp = expected(qr, w, *tensors)
    cross = make_task("qmatmul_cross", "cpu", m=w.m, k=w.k, n=w.n, mode=w.mode, bias=w.bias, a_bits=w.a_bits)
    for cfg in configs(task, len(shape)):
        out = run(task, cfg, tensors)
        assert len(out) == (3 if w.out_float else 2) and mismatch(out, exp) is None, f"{cfg}: {mismatch(out, exp)}"
        operands, smooth = split(w, tensors)
        y = out[0] if w.out_float else run(cross, cross.space.from_json(
            {**cfg.as_dict(), "n_block": cross.space.default().as_dict()["n_block"]}), operands)
        q, scale = quantize_rows(y, w.out_qmax, smooth)
        assert torch.equal(out[-2], q) and torch.equal(out[-1], scale), cfg


def test_the_workload_refuses_unsigned_rows_and_odd_flags():
    with pytest.raises(WorkloadError, match="out_qmax must be an integer in"):
        qr.Workload(m=4, k=16, n=8, out_qmax=255)
    with pytest.raises(WorkloadError, match="out_float must be a bool"):
        qr.Workload(m=4, k=16, n=8, out_float=1)
    with pytest.raises(WorkloadError, match="no ReLU"):
        qr.Workload(m=4, k=16, n=8, relu=True)


def test_the_op_refuses_bad_operands_clearly():
    w = qr.Workload(m=4, k=16, n=8)
    a, weight, a_scale, w_scale, bias, x0, x = qr.inputs(w)
    check(a, weight, a_scale, w_scale, bias, x0, x)
    with pytest.raises(ValueError, match="autotune.qmatmul_cross_requant: out_qmax must be"):
        check(a, weight, a_scale, w_scale, bias, x0, x, out_qmax=255)
    with pytest.raises(ValueError, match=r"autotune.qmatmul_cross_requant: x must be \(4, 8\)"):
        check(a, weight, a_scale, w_scale, bias, x0, x[:3])
    with pytest.raises(ValueError, match=r"autotune.qmatmul_cross_requant: smooth must be \(8,\)"):
        check(a, weight, a_scale, w_scale, bias, x0, x, torch.ones(7))
    with pytest.raises(InvalidDtype, match="autotune.qmatmul_cross_requant: smooth must be float32"):
        check(a, weight, a_scale, w_scale, bias, x0, x, torch.ones(8, dtype=torch.float64))


@pytest.mark.parametrize("out_float, smooth", [(True, False), (False, True)])
def test_the_torch_op_serves_other_batch_sizes_through_the_tuned_kernel(tmp_path, cpu_builder, out_float, smooth):
    """A kernel exported for m=16 serves calls of 16 rows, 5 (padded) and 40 (split) as PyTorch computes them;
    without out_float, y comes back empty."""
    from conftest import load_counting

    import autotune.torch as at
    from autotune.package import export

    task = make_task("qmatmul_cross_requant", "cpu", m=16, k=64, n=32, out_float=out_float, smooth=smooth)
    export([task.record(task.space.default(), costs=(1e-5,))], tmp_path / "pkg", builder=cpu_builder)
    pkg = load_counting(tmp_path / "pkg")
    try:
        for m in (16, 5, 40):
            w = qr.Workload(m=m, k=64, n=32, out_float=out_float, smooth=smooth)
            tensors = qr.inputs(w, seed=m)
            y, q, scale = torch.ops.autotune.qmatmul_cross_requant(*tensors, out_float=out_float)
            want = qr.reference(w, *tensors)
            assert y.shape == ((m, 32) if out_float else (0, 32))
            if out_float:
                torch.testing.assert_close(y, want[0], rtol=1e-5, atol=1e-4)
            assert (q.int() - want[-2].int()).abs().max() <= 1
            torch.testing.assert_close(scale, want[-1], rtol=1e-5, atol=1e-6)
        assert pkg.kernels[0].calls == 1 + 1 + 3  # 40 rows: two whole kernels and the rest padded
    finally:
        at.unload_all()
