"""torch.ops.autotune.embedding_interaction: per-table lists in, one fused kernel call out; its checks, its
PyTorch fallback and its backward, against the unfused pair (T F.embedding_bag calls, then DLRM's interaction).

One package (default configs, not tuned: float32, int8 with self-interaction, float16 with int32 indices,
float32 allowing bf16 products) is exported once for the module; each test loads it afresh and counts kernel
calls, to tell a kernel run from a fallback.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import load_counting

import autotune.torch as at
import search_spaces
from autotune.package import export
from autotune.task import make_task
from search_spaces import IndexOutOfRange, InvalidDtype, InvalidInput
from search_spaces.embedding_bag.rows import dequantize, quantize
from search_spaces.interaction.workload import dot_interaction

OP = torch.ops.autotune.embedding_interaction
TEMPLATE = search_spaces.get("embedding_interaction")
ROWS, DIM = (50, 7, 300), 12  # TEST_SHAPE's tables
KERNELS = [dict(rows=ROWS, dim=DIM, batch=5, pooling=(0, 3)),
           dict(rows=ROWS, dim=DIM, batch=5, pooling=(1, 1), self_interaction=True, dtype="int8"),
           dict(rows=ROWS, dim=DIM, batch=5, pooling=(0, 3), dtype="float16", index_dtype="int32"),
           dict(rows=ROWS, dim=DIM, batch=5, pooling=(0, 3), dot_dtype="bfloat16")]


@pytest.fixture(scope="module")
def package(tmp_path_factory, cpu_builder):
    out = tmp_path_factory.mktemp("fused_pkg")
    tasks = [make_task("embedding_interaction", "cpu", **fields) for fields in KERNELS]
    export([t.record(t.space.default(), costs=(0.0,)) for t in tasks], out, builder=cpu_builder)
    return out


@pytest.fixture()
def pkg(package):
    yield load_counting(package)
    at.unload_all()


def calls(pkg) -> int:
    return sum(k.calls for k in pkg.kernels)


def inputs(batch, seed=0, max_bag=3, last=False, index=torch.int64, table="float32"):
    """(x, weight, table_offsets, indices, offsets): ragged bags (empty ones included) over each table."""
    g = torch.Generator().manual_seed(seed)
    indices, offsets = [], []
    for r in ROWS:
        bounds = torch.cat([torch.zeros(1, dtype=torch.long),
                            torch.randint(0 if max_bag > 1 else 1, max_bag + 1, (batch,), generator=g).cumsum(0)])
        indices.append(torch.randint(0, r, (int(bounds[-1]),), generator=g).to(index))
        offsets.append((bounds if last else bounds[:-1]).to(index))
    weight = torch.randn(sum(ROWS), DIM, generator=g)
    weight = weight if table == "float32" else quantize(weight, table)
    table_offsets = torch.tensor([0, *torch.tensor(ROWS).cumsum(0).tolist()])
    return torch.randn(batch, DIM, generator=g), weight, table_offsets, indices, offsets


def unfused(x, weight, table_offsets, indices, offsets, self_interaction=False, last=False):
    """The pair the op fuses, written out: one F.embedding_bag per table on its rows (float32 values), stacked,
    then DLRM's dot interaction."""
    r = table_offsets.tolist()
    values = weight if weight.dtype in (torch.float32, torch.float64) else dequantize(
        weight, "int8" if weight.dtype == torch.uint8 else str(weight.dtype).removeprefix("torch."))
    ly = torch.stack([F.embedding_bag(i, values[r[t]:r[t + 1]], o, mode="sum", include_last_offset=last)
                      for t, (i, o) in enumerate(zip(indices, offsets))], dim=1)
    return dot_interaction(x, ly, self_interaction)


class _no_fallback(warnings.catch_warnings):
    def __enter__(self):
        super().__enter__()
        warnings.simplefilter("error", at.NoTunedKernelWarning)


@pytest.mark.parametrize("batch", [1, 9, 23])
@pytest.mark.parametrize("last", [False, True])
def test_the_kernel_matches_the_unfused_pair(pkg, batch, last):
    args = inputs(batch, seed=batch, last=last)
    with _no_fallback():
        out = OP(*args, False, last)
    torch.testing.assert_close(out, unfused(*args, last=last), rtol=1e-5, atol=1e-5)
    assert out.shape == (batch, DIM + 6) and calls(pkg) == 1


@pytest.mark.parametrize("table, index, self_interaction, max_bag", [("int8", torch.int64, True, 1),
                                                                     ("float16", torch.int32, False, 3)])
def test_reduced_precision_tables_one_hot_and_multi_hot(pkg, table, index, self_interaction, max_bag):
    args = inputs(11, seed=2, max_bag=max_bag, index=index, table=table)
    with _no_fallback():
        out = OP(*args, self_interaction)
    torch.testing.assert_close(out, unfused(*args, self_interaction), rtol=1e-5, atol=1e-5)
    assert out.shape == (11, DIM + (10 if self_interaction else 6)) and calls(pkg) == 1


def test_bf16_products_are_asked_for_by_the_call_and_served_by_their_own_kernel(pkg):
    """dot_dtype picks the kernels: a call allowing bf16 products runs the kernel tuned so (its default config is
    fp32 SIMD here: within the allowance, exact), one asking for fp32 products never does."""
    args = inputs(8, seed=5)
    by_dots = {k.workload.dot_dtype: k for k in pkg.kernels if k.workload.dtype == "float32"}
    with _no_fallback():
        for dot_dtype in ("bfloat16", "float32"):
            out = OP(*args, False, False, dot_dtype)
            torch.testing.assert_close(out, unfused(*args), rtol=1e-5, atol=1e-5)
            assert by_dots[dot_dtype].calls == 1, dot_dtype
    with pytest.raises(InvalidInput, match="embedding_interaction: dot_dtype must be one of float32, bfloat16"):
        OP(*args, False, False, "float16")


def test_every_check_case_is_served_by_the_kernel(pkg):
    w = TEMPLATE.Workload.from_shape(TEMPLATE.TEST_SHAPE)
    binding = at.ops.BINDINGS["embedding_interaction"]
    cases = list(binding.cases(w, 0, 2))
    with _no_fallback():
        for name, args, kwargs in cases:
            before = calls(pkg)
            torch.testing.assert_close(OP(*args, **kwargs), binding.op(*args, **kwargs), rtol=1e-4, atol=1e-2,
                                       msg=name)
            assert calls(pkg) == before + 1, name
    assert len(cases) >= 12


def test_backward_gives_pytorchs_gradients_of_x_and_the_tables(pkg):
    x, weight, table_offsets, indices, offsets = inputs(9, seed=4)
    x1, w1 = x.clone().requires_grad_(), weight.clone().requires_grad_()
    x2, w2 = x.clone().requires_grad_(), weight.clone().requires_grad_()
    with _no_fallback():
        out = OP(x1, w1, table_offsets, indices, offsets)
    ref = unfused(x2, w2, table_offsets, indices, offsets)
    grad = torch.randn_like(ref)
    (out * grad).sum().backward()
    (ref * grad).sum().backward()
    assert calls(pkg) == 1
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-5, atol=1e-5)
    assert w1.grad.layout == torch.strided  # a dense gradient of the whole weight, as the batched op gives


def test_gradcheck_and_a_compiled_training_step(pkg):
    x, weight, table_offsets, indices, offsets = inputs(5, seed=6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", at.NoTunedKernelWarning)  # float64: PyTorch's implementation, our backward
        assert torch.autograd.gradcheck(lambda a, b: OP(a, b, table_offsets, indices, offsets, True),
                                        (x.double().requires_grad_(), weight.double().requires_grad_()))
    w1, w2 = weight.clone().requires_grad_(), weight.clone().requires_grad_()

    def step(w):
        return OP(x, w, table_offsets, indices, offsets).pow(2).sum()

    with _no_fallback():
        torch.compile(step, fullgraph=True, backend="aot_eager")(w1).backward()
    unfused(x, w2, table_offsets, indices, offsets).pow(2).sum().backward()
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-4, atol=1e-4)
    assert calls(pkg) >= 1


def test_opcheck(pkg):
    x, weight, table_offsets, indices, offsets = inputs(7, seed=8)
    with _no_fallback():
        torch.library.opcheck(OP.default, (x.requires_grad_(), weight.requires_grad_(), table_offsets, indices,
                                           offsets))
    assert calls(pkg) > 0


@pytest.mark.parametrize("change, exc, match", [
    (lambda a: (a[0][:-1], *a[1:]), InvalidInput, "x has batch 8 but offsets"),
    (lambda a: (a[0][:, :8].contiguous(), *a[1:]), InvalidInput, r"x must be \(batch, 12\)"),
    (lambda a: (a[0].double(), *a[1:]), InvalidDtype, "x must be torch.float32 for torch.float32 tables"),
    (lambda a: (a[0], a[1], a[2], a[3], a[4][:2]), InvalidInput, "indices lists 3 tables but offsets lists 2"),
    (lambda a: (a[0], a[1], a[2], a[3][:2] + [a[3][2] + 300], a[4]), IndexOutOfRange,
     "out of range for table 2, which has 300 rows"),
    (lambda a: (a[0], a[1], a[2], a[3], [a[4][0] + 1, *a[4][1:]]), InvalidInput, r"offsets\[0\]\[0\] must be 0"),
    (lambda a: (*a[:4], [torch.cat([o, o.new_tensor([len(i) + (t == 2)])]) for t, (i, o) in enumerate(zip(*a[3:]))],
                False, True), InvalidInput, r"offsets\[2\]\[-1\] = .* must equal len\(indices\[2\]\)"),
])
def test_bad_inputs_raise_errors_that_name_the_op(pkg, change, exc, match):
    args = change(inputs(9, seed=1))
    with pytest.raises(exc, match=f"embedding_interaction: .*{match}"):
        OP(*args)


def test_what_no_kernel_serves_runs_pytorch_and_says_why(pkg):
    x, weight, table_offsets, indices, offsets = inputs(6, seed=3)
    with pytest.warns(at.NoTunedKernelWarning, match="no loaded kernel for tables=2 dim=12"):
        out = OP(x, weight[:57], table_offsets[:3], indices[:2], offsets[:2])
    torch.testing.assert_close(out, unfused(x, weight[:57], table_offsets[:3], indices[:2], offsets[:2]))
    with pytest.warns(at.NoTunedKernelWarning, match="kernels take float32 x"):
        OP(x.double(), weight.double(), table_offsets, indices, offsets)
    assert OP(x[:0], weight, table_offsets, [i[:0] for i in indices], [o[:0] for o in offsets]).shape == (0, 18)
    assert calls(pkg) == 0


def test_the_fake_gives_the_shape_on_the_meta_device():
    meta = dict(device="meta")
    out = OP(torch.empty(4, 8, **meta), torch.empty(100, 8, **meta), torch.empty(27, dtype=torch.long, **meta),
             [torch.empty(4, dtype=torch.long, **meta)] * 26, [torch.empty(4, dtype=torch.long, **meta)] * 26)
    assert out.shape == (4, 8 + 27 * 26 // 2)
