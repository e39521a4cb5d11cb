"""qmatmul_cross: qmatmul's CPU kernels whose epilogue is DCNv2's cross tail, against x0 * qmatmul(...) + x."""

import random

import pytest
import torch

from autotune.build import compile_module
from autotune.runtime import expected, mismatch
from autotune.task import make_task
from search_spaces import InvalidDtype, WorkloadError
from search_spaces import qmatmul_cross as qc
from search_spaces.qmatmul_cross.torch_op import check


def run(task, cfg, tensors):
    return task.bind(cfg, compile_module(task, cfg)["main"])(*tensors)


SHAPES = [
    "m=13,k=37,n=19",               # nothing whole tiles: x0 and x padded, padded rows and channels dropped
    "m=20,k=64,n=48,bias=0,a_bits=7",  # no bias; 7-bit activations (AVX2's u8 path where offered)
    "m=9,k=64,n=40,mode=uint8",     # uint8 activations enter VNNI/AMX as they are
    "m=20,k=2050,n=40",             # AMX k blocks (K padded to 2112: blocks of 64, 192 or 704)
]


@pytest.mark.parametrize("shape", SHAPES)
def test_matches_the_reference_for_default_random_and_every_intrinsic(shape):
    task = make_task("qmatmul_cross", "cpu", shape=shape)
    tensors = qc.inputs(task.workload, seed=1)
    exp = expected(qc, task.workload, *tensors)
    rng = random.Random(len(shape))
    configs = [task.space.default(), task.space.sample(rng)]
    for intrin in ("vnni", "amx", "avx2", "none"):  # each inner kernel the CPU has
        configs += [c for c in task.space if c.as_dict()["intrinsic"] == intrin][:1]
    configs += [c for c in task.space if c.as_dict()["intrinsic"] == "amx" and c.as_dict()["k_block"]][:1]
    for cfg in dict.fromkeys(configs):
        y = run(task, cfg, tensors)
        assert y.shape == (task.workload.m, task.workload.n) and y.dtype == torch.float32
        assert mismatch(y, exp) is None, f"{cfg}: {mismatch(y, exp)}"


def test_the_tail_is_the_cross_layer_of_the_product():
    """The reference is x0 * (qmatmul + bias) + x: a zero x0 leaves x, a zero x and unit x0 leave the product."""
    w = qc.Workload(m=8, k=32, n=16)
    a, weight, a_scale, w_scale, bias, x0, x = qc.inputs(w, seed=2)
    from search_spaces.qmatmul.workload import qmatmul_reference

    y = qmatmul_reference(a, weight, a_scale, w_scale, bias)
    assert torch.equal(qc.reference(w, a, weight, a_scale, w_scale, bias, torch.zeros_like(x0), x), x)
    assert torch.equal(qc.reference(w, a, weight, a_scale, w_scale, bias, torch.ones_like(x0), torch.zeros_like(x)),
                       y)


def test_the_workload_refuses_what_the_cross_layer_never_is():
    with pytest.raises(WorkloadError, match="no ReLU"):
        qc.Workload(m=4, k=16, n=8, relu=True)
    with pytest.raises(WorkloadError, match="not weight_only"):
        qc.Workload(m=4, k=16, n=8, mode="weight_only")


def test_the_op_refuses_bad_tails_clearly():
    w = qc.Workload(m=4, k=16, n=8)
    a, weight, a_scale, w_scale, bias, x0, x = qc.inputs(w)
    check(a, weight, a_scale, w_scale, bias, x0, x)
    with pytest.raises(InvalidDtype, match="autotune.qmatmul_cross: x0 must be float32"):
        check(a, weight, a_scale, w_scale, bias, x0.double(), x)
    with pytest.raises(ValueError, match=r"autotune.qmatmul_cross: x must be \(4, 8\)"):
        check(a, weight, a_scale, w_scale, bias, x0, x[:3])
    with pytest.raises(ValueError, match="autotune.qmatmul_cross: weight must be"):
        check(a, weight[:, :8], a_scale, w_scale, bias, x0, x)
    with pytest.raises(ValueError, match="contiguous"):
        check(a, weight, a_scale, w_scale, bias, x0.t().contiguous().t(), x)


def test_the_torch_op_serves_other_batch_sizes_through_the_tuned_kernel(tmp_path, cpu_builder):
    """A kernel exported for m=16 serves calls of 16 rows, 5 (padded, x0 and x with them) and 40 (split), as
    PyTorch computes them; the op falls back to PyTorch's result without a package."""
    from conftest import load_counting

    import autotune.torch as at
    from autotune.package import export

    task = make_task("qmatmul_cross", "cpu", shape="m=16,k=64,n=32")
    export([task.record(task.space.default(), costs=(1e-5,))], tmp_path / "pkg", builder=cpu_builder)
    pkg = load_counting(tmp_path / "pkg")
    try:
        for m in (16, 5, 40):
            w = qc.Workload(m=m, k=64, n=32)
            tensors = qc.inputs(w, seed=m)
            got = torch.ops.autotune.qmatmul_cross(*tensors)
            torch.testing.assert_close(got, qc.reference(w, *tensors), rtol=1e-5, atol=1e-4)
        assert pkg.kernels[0].calls == 3  # one call each: the kernel runs any whole number of tasks
    finally:
        at.unload_all()
