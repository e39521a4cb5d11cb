"""split_linear_cross: split_linear's CPU kernels whose epilogue is DCNv2's cross tail, against x0 * (x W^T + b) + x_l
by the float64 rule; the torch op (every case, bad tensors, opcheck, its gradient) and split_linear's rule, which
offers it where the tail follows a float32 Linear."""

import warnings

import pytest
from conftest import cpu_flags, load_counting
import torch
from torch import nn

import autotune.torch as at
from autotune.build import load_compiled
from autotune.package import export
from autotune.runtime import BoundKernel, expected, mismatch
from autotune.task import make_task
from search_spaces import InvalidDtype, InvalidInput, WorkloadError
from search_spaces import split_linear_cross as slc
from search_spaces.split_linear import cpu
from search_spaces.split_linear_cross.torch_op import BINDING

SLC = torch.ops.autotune.split_linear_cross
HAS_AMX = "amx_bf16" in cpu_flags()


def kernel(task, cfg):
    return BoundKernel(task.template, task.workload, cfg, load_compiled(task, cfg), False)


@pytest.mark.parametrize("shape", [slc.TEST_SHAPE, "m=70,k=1090,n=300,bias=0"])
def test_every_path_and_blocking_computes_the_cross_layer(shape):
    """Each path this CPU has, whole rows and (AMX) blocked by columns and k, on shapes whose M, N and K are no
    whole tiles (x0 and x_l read where the outputs are written), with and without a bias."""
    task = make_task("split_linear_cross", "cpu", shape=shape)
    tensors = slc.inputs(task.workload, seed=1)
    exp = expected(slc, task.workload, *tensors)
    configs = [task.space.default(), *[c for c in task.space if c[cpu.ROWS_PER_TASK] == 32][:2]]
    configs += [c for c in task.space if c[cpu.COLS_PER_TASK] and c[cpu.K_BLOCK]][:1]
    configs += [c for c in task.space if c[cpu.INTRINSIC] == "simd"][:1]
    for cfg in dict.fromkeys(configs):
        y = kernel(task, cfg)(*tensors)
        assert y.shape == (task.workload.m, task.workload.n) and y.dtype == torch.float32
        assert mismatch(y, exp) is None, f"{cfg}: {mismatch(y, exp)}"


def test_the_tail_is_the_cross_layer_of_the_product():
    """The reference is x0 * (x W^T + b) + x_l: a zero x0 leaves x_l, a unit x0 and zero x_l leave the Linear."""
    w = slc.Workload(m=8, k=32, n=16)
    x, weight, bias, x0, residual = slc.inputs(w, seed=2)
    y = nn.functional.linear(x, weight, bias)
    assert torch.equal(slc.reference(w, x, weight, bias, torch.zeros_like(x0), residual), residual)
    assert torch.equal(slc.reference(w, x, weight, bias, torch.ones_like(x0), torch.zeros_like(residual)), y)
    with pytest.raises(WorkloadError, match="no ReLU"):
        slc.Workload(m=4, k=16, n=8, relu=True)


# ---- the torch op ---------------------------------------------------------------------------------------------
W = slc.Workload(m=40, k=45, n=24)
W_NO_BIAS = slc.Workload(m=40, k=45, n=24, bias=False)


@pytest.fixture(scope="module")
def package(tmp_path_factory, cpu_builder):
    out = tmp_path_factory.mktemp("slc-pkg")
    tasks = [make_task("split_linear_cross", "cpu", **vars(w)) for w in (W, W_NO_BIAS)]
    export([t.record(t.space.default(), costs=(1e-5,)) for t in tasks], out, builder=cpu_builder)
    return out


@pytest.fixture()
def pkg(package):
    yield load_counting(package)
    at.unload_all()


def test_torch_op_runs_the_kernel_on_every_case(pkg):
    """`autotune check`'s cases (split_linear's, each with its own x0 and x_l) on the loaded kernels, judged by
    the float64 rule, with and without a bias; the meta device gives the shape."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", at.NoTunedKernelWarning)
        for w in (W, W_NO_BIAS):
            for name, args, kwargs in BINDING.cases(w, 3, 2):
                tensors = [a for a in args if a is not None]
                assert mismatch(SLC(*args, **kwargs), expected(slc, w, *tensors)) is None, name
    assert sum(k.calls for k in pkg.kernels) == sum(len(list(BINDING.cases(w, 3, 2))) for w in (W, W_NO_BIAS))
    meta = [torch.empty(s, device="meta") for s in ((7, 45), (24, 45), (24,), (7, 24), (7, 24))]
    assert SLC(*meta).shape == (7, 24)


def test_torch_op_refuses_bad_tensors(pkg):
    x, weight, bias, x0, residual = slc.inputs(W, 1)
    with pytest.raises(InvalidDtype, match="autotune.split_linear_cross: x0 must be float32"):
        SLC(x, weight, bias, x0.double(), residual)
    with pytest.raises(InvalidInput, match=r"autotune.split_linear_cross: residual must be \(40, 24\)"):
        SLC(x, weight, bias, x0, residual[:3])
    with pytest.raises(InvalidInput, match="autotune.split_linear_cross: x has 44 features but weight takes 45"):
        SLC(x[:, :44].contiguous(), weight, bias, x0, residual)
    with pytest.raises(InvalidInput, match="contiguous"):
        SLC(x, weight, bias, x0.t().contiguous().t(), residual)
    with pytest.raises(InvalidInput, match="split_linear_cross: this kernel takes bias"):
        slc.check_inputs(W, x, weight, x0, residual)
    assert sum(k.calls for k in pkg.kernels) == 0


def test_torch_op_passes_opcheck_and_has_the_cross_layers_gradient(pkg):
    x, weight, bias, x0, residual = (t.clone().requires_grad_() for t in slc.inputs(W, 6))
    with warnings.catch_warnings():
        warnings.simplefilter("error", at.NoTunedKernelWarning)
        torch.library.opcheck(SLC.default, (x, weight, bias, x0, residual))
    leaves = (x, weight, bias, x0, residual)
    SLC(*leaves).square().sum().backward()
    grads = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    (x0 * nn.functional.linear(x, weight, bias) + residual).square().sum().backward()
    for g, t in zip(grads, leaves):
        torch.testing.assert_close(g, t.grad, rtol=1e-4, atol=1e-5)
    assert sum(k.calls for k in pkg.kernels) > 1


# ---- split_linear's rule ------------------------------------------------------------------------------------
class Cross(nn.Module):
    """TorchRec's LowRankCrossNet layer, x_l = x0 * (W (V x_l) + b) + x_l with V and W bias-free (`bias_add`), or
    written with the bias in W's Linear: x0 * W (V x_l) + x_l."""

    def __init__(self, bias_add, n=96, rank=32):
        super().__init__()
        self.v, self.w = nn.Linear(n, rank, bias=False), nn.Linear(rank, n, bias=not bias_add)
        self.bias = nn.Parameter(torch.randn(n) * 0.1) if bias_add else None

    def forward(self, x0):
        x = x0
        for _ in range(2):
            y = self.w(self.v(x))
            x = x0 * (y + self.bias if self.bias is not None else y) + x
        return x


@pytest.mark.skipif(not HAS_AMX, reason="the rule is offered on CPUs with AMX-BF16 only")
@pytest.mark.parametrize("bias_add", [True, False])
def test_the_rule_runs_a_cross_layers_w_product_and_tail_as_one_kernel(bias_add):
    """Each W product followed by the tail becomes split_linear_cross (its bias the tail's or the Linear's, the
    tail's ops claimed); each V product stays a plain split_linear; the rewritten graph computes the model."""
    from autotune.torch.graph import capture, example_values
    from search_spaces.split_linear.graph import find

    model, args = Cross(bias_add).eval(), (torch.randn(2048, 96),)
    gm = capture(model, args)
    matches = list(find(gm, example_values(gm, args), set()))
    assert [m.tasks[0][0] for m in matches] == ["split_linear", "split_linear_cross"] * 2
    cross = matches[1]
    assert cross.tasks[0][1] == {"m": 2048, "k": 32, "n": 96, "bias": True}
    tail = [torch.ops.aten.add.Tensor] * bias_add + [torch.ops.aten.mul.Tensor, torch.ops.aten.add.Tensor]
    assert [n.target for n in cross.nodes[1:]] == tail
    for m in matches:  # no kernels loaded: each op runs its PyTorch semantics
        for old, new in zip(m.outputs, m.replace(gm)):
            old.replace_all_uses_with(new)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    ops = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.mul.Tensor not in ops and torch.ops.autotune.split_linear_cross.default in ops
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", at.NoTunedKernelWarning)
        torch.testing.assert_close(gm(*args), model(*args), rtol=1e-5, atol=1e-5)
