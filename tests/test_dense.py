"""autotune/torch/dense.py: float32 Linear (+ ReLU) on oneDNN, its op and its graph rule."""

from __future__ import annotations

import pytest
import torch
from conftest import requires_build
import torch.nn.functional as F
from torch import nn

import autotune.torch  # noqa: F401 -- registers torch.ops.autotune.*
from autotune.torch import dense
from autotune.torch.graph import capture, example_values
from autotune.torch.rules import collect_rules
from search_spaces.template import GraphMatch

pytestmark = requires_build(
    "onednn", lambda: dense.available(),
    "torch.ops.mkldnn._linear_pointwise (oneDNN's fused linear, in PyTorch's x86 and Arm CPU builds) is not "
    "there: without it dense_linear is only F.linear; if a PyTorch upgrade moved the op, follow it in dense.py")
op = torch.ops.autotune.dense_linear.default


def linear(x, w, b, relu):
    y = F.linear(x, w, b)
    return torch.relu(y) if relu else y


@pytest.mark.parametrize("shape", [(33, 20), (3, 5, 20)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("relu", [True, False])
def test_the_op_is_linear_and_relu(shape, bias, relu):
    torch.manual_seed(0)
    x, w = torch.randn(*shape), torch.randn(12, 20)
    b = torch.randn(12) if bias else None
    got = op(x, w, b, relu)
    assert got.shape == (*shape[:-1], 12)
    torch.testing.assert_close(got, linear(x, w, b, relu), rtol=1e-5, atol=1e-5)
    assert (got >= 0).all() or not relu


def test_a_weight_is_packed_once_and_again_after_an_in_place_update():
    torch.manual_seed(0)
    x, w, b = torch.randn(16, 20), torch.randn(12, 20), torch.randn(12)
    torch.testing.assert_close(op(x, w, b, True), linear(x, w, b, True), rtol=1e-5, atol=1e-5)
    packed = dense._PACKED[id(w)][4]
    op(x, w, b, True)
    assert dense._PACKED[id(w)][4] is packed  # reused: no reorder per call
    with torch.no_grad():
        w.mul_(-2)  # an optimizer's step: a new version of the same tensor
    torch.testing.assert_close(op(x, w, b, True), linear(x, w, b, True), rtol=1e-5, atol=1e-5)
    assert dense._PACKED[id(w)][4] is not packed
    w2 = w.clone()  # another weight: its own packing, the first one's kept
    torch.testing.assert_close(op(x, w2, None, False), linear(x, w2, None, False), rtol=1e-5, atol=1e-5)
    assert {id(w), id(w2)} <= set(dense._PACKED)


def test_other_dtypes_run_pytorchs_linear():
    x, w, b = torch.randn(4, 6, dtype=torch.float64), torch.randn(3, 6, dtype=torch.float64), None
    assert torch.equal(op(x, w, b, True), linear(x, w, b, True))


def test_gradients_are_linears_through_the_relu():
    torch.manual_seed(1)
    x = torch.randn(9, 7, requires_grad=True)
    w, b = torch.randn(5, 7, requires_grad=True), torch.randn(5, requires_grad=True)
    grad = torch.randn(9, 5)
    op(x, w, b, True).backward(grad)
    mine = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    linear(x, w, b, True).backward(grad)
    for got, want in zip(mine, (x.grad, w.grad, b.grad)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_it_compiles_as_one_opaque_node():
    x, w, b = torch.randn(16, 8), torch.randn(4, 8), torch.randn(4)
    fn = torch.compile(lambda x: op(x, w, b, True), fullgraph=True)
    torch.testing.assert_close(fn(x), linear(x, w, b, True), rtol=1e-5, atol=1e-5)


class MLP(nn.Module):
    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(13, 64), nn.Linear(64, 48), nn.Linear(48, 1)
        self.to(dtype)

    def forward(self, x):
        h = torch.relu(self.a(x))
        y = self.b(h)
        return self.c(torch.relu(y)) + y.sum(1, keepdim=True)  # b's output has two users: its ReLU is not fused


def replaced(model, x):
    gm = capture(model, (x,))
    found = list(dense.find(gm, example_values(gm, (x,)), set()))
    for m in found:
        (new,) = m.replace(gm)
        m.outputs[0].replace_all_uses_with(new, delete_user_cb=lambda user, n=new: user is not n)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm, found


def test_the_rule_takes_every_float32_layer_fusing_a_relu_it_alone_feeds():
    model, x = MLP(), torch.randn(32, 13)
    gm, found = replaced(model, x)
    assert all(isinstance(m, GraphMatch) and m.tasks == () for m in found)
    assert [m.what for m in found] == ["Linear(13, 64) + ReLU -> oneDNN linear (ReLU fused)",
                                       "Linear(64, 48) -> oneDNN linear", "Linear(48, 1) -> oneDNN linear"]
    calls = [n for n in gm.graph.nodes if n.target is op]
    assert [n.args[-1] for n in calls] == [True, False, False]
    assert sum(n.target is torch.ops.aten.relu.default for n in gm.graph.nodes) == 1  # b's stays
    for batch in (32, 5):
        xb = torch.randn(batch, 13)
        torch.testing.assert_close(gm(xb), model(xb), rtol=1e-5, atol=1e-5)


def test_layers_of_other_dtypes_are_not_its_own():
    model = MLP(torch.float64)
    x = torch.randn(8, 13, dtype=torch.float64)
    assert replaced(model, x)[1] == []


def test_its_tolerance_refuses_a_layer_without_its_relu():
    model, x = MLP(), torch.randn(32, 13)
    gm = capture(model, (x,))
    values = example_values(gm, (x,))
    first = next(iter(dense.find(gm, values, set())))
    rtol, atol = first.tolerance
    relu_out, linear_out = values[first.outputs[0].name], values[first.nodes[0].name]
    assert not torch.allclose(linear_out, relu_out, rtol=rtol, atol=atol)


def test_it_runs_after_the_int8_rule_and_without_quantize():
    names = [r.name for r in collect_rules(quantize=True)]
    assert names.index("qmatmul") < names.index("dense_linear_bf16") < names.index("dense_linear") == len(names) - 1
    quantizing = [r.name for r in collect_rules(quantize=False)]
    assert "dense_linear" in quantizing and "dense_linear_bf16" not in quantizing


# ---- the bf16 rung ------------------------------------------------------------------------------------------
bf16_op = torch.ops.autotune.dense_linear_bf16.default


@pytest.mark.parametrize("relu", [True, False])
def test_the_bf16_op_is_linear_with_bf16_inputs_and_result(relu):
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 33, 40), torch.randn(24, 40), torch.randn(24)
    got = bf16_op(x, w.to(torch.bfloat16), b, relu)
    assert got.dtype == torch.float32 and got.shape == (3, 33, 24)
    want = dense.simulated_bf16(x, w, b)
    want = torch.relu(want) if relu else want
    exact = linear(x, w, b, relu)
    scale = float(exact.abs().max())
    # bf16 numerics (not fp32's): within a bf16 step of the simulation, a few 1e-3 of the range from fp32
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2 * scale)
    err = float((got - exact).abs().max())
    assert 0 < err < dense.BF16_RANGE_ATOL * scale


def test_the_bf16_rule_converts_weights_once_and_reports_each_layer_reduced(monkeypatch):
    monkeypatch.setattr(dense, "native_bf16", lambda: True)  # the numerics anywhere; the speed needs the CPU's
    model, x = MLP(), torch.randn(32, 13)
    gm = capture(model, (x,))
    found = list(dense.find_bf16(gm, example_values(gm, (x,)), set()))
    assert [m.what for m in found] == ["Linear(13, 64) + ReLU -> oneDNN linear in bf16 (ReLU fused)",
                                       "Linear(64, 48) -> oneDNN linear in bf16", "Linear(48, 1) -> oneDNN linear in bf16"]
    assert all(len(m.reduced) == 1 and m.reduced[0].precision == "bf16" for m in found)
    assert [m.reduced[0].node for m in found] == [m.nodes[0].name for m in found]
    for m in found:
        new = m.replace(gm)
        m.outputs[0].replace_all_uses_with(new[0], delete_user_cb=lambda user, n=new[0]: user is not n)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    weights = [getattr(gm, n.args[1].target) for n in gm.graph.nodes if n.target is bf16_op]
    assert len(weights) == 3 and all(w.dtype == torch.bfloat16 for w in weights)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the model keeps its own
    for batch in (32, 5):
        xb = torch.randn(batch, 13)
        want = model(xb)
        torch.testing.assert_close(gm(xb), want, rtol=0, atol=dense.BF16_RANGE_ATOL * float(want.abs().max()))


def test_without_native_bf16_the_rung_is_absent(monkeypatch):
    monkeypatch.setattr(dense, "host_cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert not dense.native_bf16()
    model, x = MLP(), torch.randn(32, 13)
    gm = capture(model, (x,))
    assert list(dense.find_bf16(gm, example_values(gm, (x,)), set())) == []


def _wire(gm, found):
    for m in found:
        (new,) = m.replace(gm)
        m.outputs[0].replace_all_uses_with(new, delete_user_cb=lambda user, n=new: user is not n)
    gm.graph.eliminate_dead_code()
    gm.recompile()


def test_a_bf16_layer_that_only_feeds_another_passes_its_bf16_result_as_it_is(monkeypatch):
    """The chain rule: a's result (through its fused ReLU) feeds only b, so a returns bf16 and b takes it, with
    the same output bits; b's result has two users and stays float32 (c is not chained)."""
    monkeypatch.setattr(dense, "native_bf16", lambda: True)
    model, x = MLP(), torch.randn(32, 13)
    gm = capture(model, (x,))
    _wire(gm, list(dense.find_bf16(gm, example_values(gm, (x,)), set())))
    before = gm(x)
    found = list(dense.find_chains(gm, example_values(gm, (x,)), set()))
    assert len(found) == 1 and found[0].tolerance == (0.0, 0.0)
    _wire(gm, found)
    calls = [n for n in gm.graph.nodes if n.target is bf16_op]
    assert [n.kwargs.get("bf16_out", False) for n in calls] == [True, False, False]
    assert torch.equal(gm(x), before)
    assert list(dense.find_chains(gm, example_values(gm, (x,)), set())) == []  # chained once
    deep = nn.Sequential(*[m for _ in range(3) for m in (nn.Linear(13, 13), nn.ReLU())]).eval()  # a run of three
    gm = capture(deep, (x,))
    _wire(gm, list(dense.find_bf16(gm, example_values(gm, (x,)), set())))
    before = gm(x)
    (chain,) = dense.find_chains(gm, example_values(gm, (x,)), set())
    assert len(chain.nodes) == 3
    _wire(gm, [chain])
    assert [n.kwargs.get("bf16_out", False) for n in gm.graph.nodes if n.target is bf16_op] == [True, True, False]
    assert torch.equal(gm(x), before)
    y = bf16_op(x, model.a.weight.to(torch.bfloat16), model.a.bias, True, bf16_out=True)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), bf16_op(x, model.a.weight.to(torch.bfloat16), model.a.bias, True),
                               rtol=0, atol=0)
