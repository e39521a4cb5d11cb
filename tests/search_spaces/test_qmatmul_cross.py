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
    "m=13,k=64,n=19,state=bfloat16",  # 16-bit cross state: x0, x and y bfloat16, padded too
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
        assert y.shape == (task.workload.m, task.workload.n) and y.dtype == getattr(torch, task.workload.state)
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


def test_bfloat16_state_is_the_float32_tail_of_the_widened_state_rounded_once():
    """With state=bfloat16 the reference widens x0 and x, computes the tail in float32 and rounds y once: within
    one bfloat16 rounding of the float32 layer on the same (bfloat16-representable) state; the key of a
    float32-state workload is what it was before the field."""
    w = qc.Workload(m=8, k=32, n=16, state="bfloat16")
    *operands, x0, x = qc.inputs(w, seed=2)
    assert x0.dtype == x.dtype == torch.bfloat16
    y = qc.reference(w, *operands, x0, x)
    want = qc.reference(qc.Workload(m=8, k=32, n=16), *operands, x0.float(), x.float())
    assert y.dtype == torch.bfloat16 and torch.equal(y, want.bfloat16())
    assert "state" not in qc.Workload(m=8, k=32, n=16).key() and '"state":"bfloat16"' in w.key()
    with pytest.raises(WorkloadError, match="state must be one of float32, bfloat16"):
        qc.Workload(m=4, k=16, n=8, state="float16")


def test_the_workload_refuses_what_the_cross_layer_never_is():
    with pytest.raises(WorkloadError, match="no ReLU"):
        qc.Workload(m=4, k=16, n=8, relu=True)
    with pytest.raises(WorkloadError, match="not weight_only"):
        qc.Workload(m=4, k=16, n=8, mode="weight_only")


def test_the_op_refuses_bad_tails_clearly():
    w = qc.Workload(m=4, k=16, n=8)
    a, weight, a_scale, w_scale, bias, x0, x = qc.inputs(w)
    check(a, weight, a_scale, w_scale, bias, x0, x)
    with pytest.raises(InvalidDtype, match="autotune.qmatmul_cross: x0 must be float32 or bfloat16"):
        check(a, weight, a_scale, w_scale, bias, x0.double(), x)
    with pytest.raises(InvalidDtype, match="x0 and x must be of one dtype"):
        check(a, weight, a_scale, w_scale, bias, x0.bfloat16(), x)
    check(a, weight, a_scale, w_scale, bias, x0.bfloat16(), x.bfloat16())
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

    tasks = [make_task("qmatmul_cross", "cpu", shape=f"m=16,k=64,n=32,state={s}") for s in ("float32", "bfloat16")]
    export([t.record(t.space.default(), costs=(1e-5,)) for t in tasks], tmp_path / "pkg", builder=cpu_builder)
    pkg = load_counting(tmp_path / "pkg")
    try:
        for state in ("float32", "bfloat16"):  # each state's calls reach its own kernel
            for m in (16, 5, 40):
                w = qc.Workload(m=m, k=64, n=32, state=state)
                tensors = qc.inputs(w, seed=m)
                got = torch.ops.autotune.qmatmul_cross(*tensors)
                assert got.dtype == tensors[-1].dtype
                torch.testing.assert_close(got, qc.reference(w, *tensors), rtol=qc.tolerance(w)[0], atol=1e-4)
        # one call each: the kernel runs any whole number of tasks
        assert sorted(k.calls for k in pkg.kernels) == [3, 3]
    finally:
        at.unload_all()
