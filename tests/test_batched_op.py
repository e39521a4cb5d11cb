"""torch.ops.autotune.batched_embedding_bag: per-table lists in, FBGEMM's layout built, one kernel call out.

One package (the TEST_SHAPE workload's default config, not tuned) is exported once for the module; each test
that needs the kernel loads it afresh and counts its calls, to tell a kernel run from a fallback.
"""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autotune.torch as at
import search_spaces
from autotune.package import export
from autotune.task import make_task
from search_spaces.batched_embedding_bag import torch_op as tbe

OP = torch.ops.autotune.batched_embedding_bag
TEMPLATE = search_spaces.get("batched_embedding_bag")
ROWS = (50, 7, 300)  # TEST_SHAPE's tables
DIM = 16


@pytest.fixture(scope="module")
def package(tmp_path_factory, cpu_builder):
    task = make_task("batched_embedding_bag", "cpu", shape=TEMPLATE.TEST_SHAPE)
    assert task.workload.rows == ROWS and task.workload.dim == DIM
    out = tmp_path_factory.mktemp("tbe_pkg")
    export([task.record(task.space.default(), costs=(0.0,))], out, builder=cpu_builder)
    return out


@pytest.fixture()
def kernel(package):
    """The package loaded; the kernel's `calls` counts its runs."""
    at.unload_all()
    (k,) = at.load(package, cpu="any").kernels
    k.calls, inner = 0, k.func

    def counting(*args):
        k.calls += 1
        return inner(*args)

    k.func = counting
    yield k
    at.unload_all()


def tables(batch, rows=ROWS, seed=0, last=False, dtype=torch.int64, max_bag=5, weight_dtype=torch.float32, dim=DIM):
    """(weight, table_offsets, indices, offsets): random ragged bags (empty ones included) for each table."""
    g = torch.Generator().manual_seed(seed)
    indices, offsets = [], []
    for r in rows:
        ends = torch.randint(0, max_bag + 1, (batch,), generator=g).cumsum(0)
        bounds = torch.cat([torch.zeros(1, dtype=torch.long), ends])
        indices.append(torch.randint(0, r, (int(bounds[-1]),), generator=g).to(dtype))
        offsets.append((bounds if last else bounds[:-1]).to(dtype))
    table_offsets = torch.tensor([0, *torch.tensor(rows).cumsum(0).tolist()])
    weight = torch.randn(sum(rows), dim, generator=g, dtype=weight_dtype)
    return weight, table_offsets, indices, offsets


def reference(weight, table_offsets, indices, offsets, mode="sum", last=False):
    """T F.embedding_bag calls on the tables' slices, then cat: the op's definition."""
    r = table_offsets.tolist()
    return torch.cat([F.embedding_bag(i, weight[r[t]:r[t + 1]], o, mode=mode, include_last_offset=last)
                      for t, (i, o) in enumerate(zip(indices, offsets))], dim=1)


class _no_fallback(warnings.catch_warnings):
    def __enter__(self):
        super().__enter__()
        warnings.simplefilter("error", at.NoTunedKernelWarning)


# ---- the layout ------------------------------------------------------------------------------------------
def test_layout_is_fbgemms_concatenated_indices_and_table_major_offsets():
    indices = [torch.tensor([4, 1, 2]), torch.tensor([0]), torch.tensor([6, 5])]
    offsets = [torch.tensor([0, 2]), torch.tensor([0, 1]), torch.tensor([0, 0])]
    idx, offs, shift, last = tbe.layout(indices, offsets)
    assert idx.tolist() == [4, 1, 2, 0, 6, 5] and shift.tolist() == [0, 3, 4, 6] and last is None
    assert offs.tolist() == [0, 2, 3, 4, 4, 4, 6]  # table t's bags shifted by the indices before it, then nnz
    with_last = [torch.cat([o, torch.tensor([len(i)])]) for i, o in zip(indices, offsets)]
    _, offs2, _, last2 = tbe.layout(indices, with_last, True)
    assert offs2.tolist() == offs.tolist() and last2.tolist() == [3, 1, 2]


def test_layout_of_one_table_is_its_own():
    idx, offs, _, _ = tbe.layout([torch.tensor([3, 1, 2])], [torch.tensor([0, 0, 2])])
    assert idx.tolist() == [3, 1, 2] and offs.tolist() == [0, 0, 2, 3]
    _, offs, _, last = tbe.layout([torch.tensor([3, 1, 2])], [torch.tensor([0, 0, 2, 3])], True)
    assert offs.tolist() == [0, 0, 2, 3] and last.tolist() == [3]


def test_layout_takes_the_indices_dtype_for_the_offsets():
    idx, offs, _, _ = tbe.layout([torch.tensor([1, 2], dtype=torch.int32)] * 2, [torch.tensor([0, 1])] * 2)
    assert idx.dtype == offs.dtype == torch.int32 and offs.tolist() == [0, 1, 2, 3, 4]


# ---- through the kernel ------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [1, 9, 23])
@pytest.mark.parametrize("last", [False, True])
def test_kernel_matches_per_table_pytorch(kernel, batch, last):
    args = tables(batch, seed=batch, last=last)
    with _no_fallback():
        out = OP(*args, "sum", last)
    torch.testing.assert_close(out, reference(*args, last=last), rtol=1e-5, atol=1e-5)
    assert out.shape == (batch, len(ROWS) * DIM) and kernel.calls == 1


def test_int32_offsets_with_int64_indices_and_strided_tensors_reach_the_kernel(kernel):
    weight, to, indices, offsets = tables(9, seed=3)
    strided = [torch.stack([i, i], 1)[:, 0] for i in indices]  # not contiguous: the layout copies them anyway
    with _no_fallback():
        out = OP(weight, to, strided, [o.int() for o in offsets])
    torch.testing.assert_close(out, reference(weight, to, indices, offsets), rtol=1e-5, atol=1e-5)
    assert kernel.calls == 1


def test_every_check_case_is_served_by_the_kernel(kernel):
    w = TEMPLATE.Workload.from_shape(TEMPLATE.TEST_SHAPE)
    cases = list(tbe.BINDING.cases(w, 0, 3))
    with _no_fallback():
        for name, args, kwargs in cases:
            before = kernel.calls
            torch.testing.assert_close(OP(*args, **kwargs), tbe.batched_embedding_bag(*args, **kwargs),
                                       rtol=1e-5, atol=1e-5, msg=name)
            assert kernel.calls == before + 1, name
    assert len(cases) >= 10


def test_empty_batch_and_no_indices_run_pytorch_without_a_warning(kernel):
    weight, to, indices, offsets = tables(4)
    with _no_fallback():
        assert OP(weight, to, [i[:0] for i in indices], [o[:0] for o in offsets]).shape == (0, 3 * DIM)
        empty = OP(weight, to, [i[:0] for i in indices], [torch.zeros_like(o) for o in offsets])
    assert kernel.calls == 0 and not empty.any()


def test_compiled_fullgraph_training_step_and_inference_mode(kernel):
    """One opaque node under torch.compile(fullgraph=True), forward and backward traced (AOTAutograd); eager
    under inference_mode."""
    weight, to, indices, offsets = tables(9, seed=5)
    w1, w2 = weight.clone().requires_grad_(), weight.clone().requires_grad_()

    def f(w):
        return OP(w, to, indices, offsets) ** 2

    with _no_fallback():
        out = torch.compile(f, fullgraph=True, backend="aot_eager")(w1)  # inductor's codegen: 30 s more
        out.sum().backward()
        with torch.inference_mode():
            inference = f(weight)
    ref = reference(w2, to, indices, offsets) ** 2
    ref.sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(inference, ref.detach(), rtol=1e-5, atol=1e-5)
    assert kernel.calls == 2


# ---- without a kernel --------------------------------------------------------------------------------------
def test_fallback_without_a_kernel_warns_once_and_matches():
    at.unload_all()
    args = tables(6, rows=(11, 13), seed=1)
    with pytest.warns(at.NoTunedKernelWarning, match="no loaded kernel for tables=2 dim=16 mode=mean index=int64"):
        out = OP(*args, "mean")
    torch.testing.assert_close(out, reference(*args, mode="mean"))
    with _no_fallback():  # warned once per workload: a second call is silent
        OP(*args, "mean")


def test_float64_weight_runs_pytorch_even_with_a_kernel(kernel):
    args = tables(9, weight_dtype=torch.float64)
    with pytest.warns(at.NoTunedKernelWarning, match="float32"):
        out = OP(*args)
    assert out.dtype == torch.float64 and kernel.calls == 0
    torch.testing.assert_close(out, reference(*args))


# ---- bad inputs --------------------------------------------------------------------------------------------
def _bad(case):
    weight, to, indices, offsets = tables(9)
    if case == "offsets for fewer tables":
        return (weight, to, indices, offsets[:2]), at.InvalidInput, "indices lists 3 tables but offsets lists 2"
    if case == "table_offsets for fewer tables":
        return (weight, to[:3], indices, offsets), at.InvalidInput, "table_offsets must hold tables \\+ 1 = 4"
    if case == "batch differs between tables":
        return (weight, to, indices, [offsets[0], offsets[1][:-1], offsets[2]]), at.InvalidInput, \
            "offsets\\[1\\] has 8 entries but offsets\\[0\\] has 9"
    if case == "float indices":
        return (weight, to, [indices[0], indices[1].float(), indices[2]], offsets), at.InvalidDtype, \
            "indices\\[1\\] must be int32 or int64"
    if case == "int32 table_offsets":
        return (weight, to.int(), indices, offsets), at.InvalidDtype, "table_offsets must be int64"
    if case == "integer weight":
        return (weight.long(), to, indices, offsets), at.InvalidDtype, "weight must be float32, float64, float16, bfloat16 or uint8"
    if case == "2-D offsets":
        return (weight, to, indices, [o.view(3, 3) for o in offsets]), at.InvalidInput, "offsets\\[0\\] must be 1-D"
    if case == "a table's first offset is not 0":
        return (weight, to, indices, [offsets[0], offsets[1] + 1, offsets[2]]), at.InvalidInput, \
            "offsets\\[1\\]\\[0\\] must be 0"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["offsets for fewer tables", "table_offsets for fewer tables",
                                  "batch differs between tables", "float indices", "int32 table_offsets",
                                  "integer weight", "2-D offsets", "a table's first offset is not 0"])
def test_bad_inputs_raise_clear_errors(kernel, case):
    args, error, message = _bad(case)
    with pytest.raises(error, match="autotune.batched_embedding_bag: " + message):
        OP(*args)


def test_include_last_offset_must_end_at_each_tables_indices(kernel):
    weight, to, indices, offsets = tables(9, last=True)
    short = [offsets[0], offsets[1], torch.cat([offsets[2][:-1], offsets[2][-1:] - 1])]
    with pytest.raises(at.InvalidInput, match="offsets\\[2\\]\\[-1\\] = .* must equal len\\(indices\\[2\\]\\)"):
        OP(weight, to, indices, short, "sum", True)
    assert kernel.calls == 0


@pytest.mark.parametrize("case", ["index past its table", "negative index", "decreasing offsets",
                                  "table_offsets past the weight"])
def test_data_checks_of_gpu_calls_name_the_table(case):
    """check_data is what GPU calls run on the host (their kernels' flag is not read); it runs on any device."""
    weight, to, indices, offsets = tables(9, seed=2)
    indices = [i.clone() for i in indices]
    if case == "index past its table":
        indices[1][0], match, error = 7, "indices\\[1\\] must be in \\[0, 7\\).* got 7", at.IndexOutOfRange
    elif case == "negative index":
        indices[2][-1], match, error = -1, "indices\\[2\\] must be in \\[0, 300\\)", at.IndexOutOfRange
    elif case == "decreasing offsets":
        offsets = [offsets[0], offsets[1].flip(0), offsets[2]]
        offsets[1] = torch.cat([torch.zeros(1, dtype=torch.long), offsets[1][:-1]])
        match, error = "offsets\\[1\\] must be non-decreasing", at.InvalidInput
    else:
        to, match, error = torch.tensor([0, 50, 57, 358]), "table_offsets must rise from 0", at.InvalidInput
    idx, offs, shift, last = tbe.layout(indices, offsets)
    with pytest.raises(error, match=match):
        tbe.check_data(weight, to, idx, offs, shift, last, indices, offsets, False)


def test_data_checks_pass_good_input():
    weight, to, indices, offsets = tables(9, seed=2, last=True)
    tbe.check_data(weight, to, *tbe.layout(indices, offsets, True), indices, offsets, True)


# ---- gradients ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("last", [False, True])
def test_backward_passes_gradcheck(mode, last):
    """In float64 (PyTorch's implementation runs forward, the op's own backward runs backward)."""
    at.unload_all()
    weight, to, indices, offsets = tables(4, rows=(3, 5), seed=4, last=last, max_bag=3, weight_dtype=torch.float64,
                                          dim=2)
    weight.requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", at.NoTunedKernelWarning)
        assert torch.autograd.gradcheck(lambda w: OP(w, to, indices, offsets, mode, last), (weight,))


def test_backward_through_the_kernel_matches_pytorchs(kernel):
    weight, to, indices, offsets = tables(9, seed=6)
    grad = torch.randn(9, 3 * DIM)
    w1, w2 = weight.clone().requires_grad_(), weight.clone().requires_grad_()
    with _no_fallback():
        OP(w1, to, indices, offsets).backward(grad)
    reference(w2, to, indices, offsets).backward(grad)
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-5, atol=1e-5)
    assert kernel.calls == 1


# ---- the module ------------------------------------------------------------------------------------------
def test_batched_embedding_bag_module_matches_its_tables_and_trains(kernel):
    bags = [nn.EmbeddingBag(r, DIM, mode="sum") for r in ROWS]
    module = at.BatchedEmbeddingBag.from_modules(bags)
    _, _, indices, offsets = tables(9, seed=8)
    with _no_fallback():
        out = module(indices, offsets)
    torch.testing.assert_close(out, torch.cat([b(i, o) for b, i, o in zip(bags, indices, offsets)], 1),
                               rtol=1e-5, atol=1e-5)
    out.sum().backward()
    assert module.weight.grad.shape == (sum(ROWS), DIM) and kernel.calls == 1
    torch.testing.assert_close(module.table(1), bags[1].weight.detach())
    with pytest.raises(at.InvalidInput, match="one embedding_dim"):
        at.BatchedEmbeddingBag.from_modules([nn.EmbeddingBag(5, 8), nn.EmbeddingBag(5, 4)])
