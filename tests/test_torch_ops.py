"""autotune.torch: custom operators, dispatch and fallback, validation, drop-in modules, optimize.

One small package (default configs, not tuned) is exported once for the module; each test loads it afresh.
"""

import importlib.util
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from conftest import load_counting, requires_build
import torch
import torch.nn.functional as F
from torch import nn

import autotune.torch as at
import search_spaces
from autotune.package import export, read_manifest
from autotune.task import make_task
from autotune.torch import callpath, registry
from search_spaces.embedding_bag import checks as eb_checks, workload as eb_workload
from search_spaces.interaction.workload import dot_interaction

EB, INTER, QMM = torch.ops.autotune.embedding_bag, torch.ops.autotune.interaction, torch.ops.autotune.qmatmul
KERNELS = [
    ("embedding_bag", dict(rows=50, dim=8, batch=8, pooling=(0, 5))),
    ("embedding_bag", dict(rows=50, dim=8, batch=8, pooling=(0, 5), per_sample_weights=True)),
    ("embedding_bag", dict(rows=50, dim=8, batch=8, pooling=(0, 5), mode="mean", index_dtype="int32",
                           padding_idx=0, include_last_offset=True)),
    ("embedding_bag", dict(rows=50, dim=8, batch=8, pooling=(0, 5), dtype="int8")),  # FBGEMM's fused int8 rows
    ("embedding_bag", dict(rows=50, dim=8, batch=8, pooling=(0, 5), mode="max", dtype="bfloat16")),
    ("interaction", dict(batch=8, tables=3, dim=8)),
    ("qmatmul", dict(m=8, k=32, n=16)),
    ("qmatmul", dict(m=32, k=32, n=16)),
    ("qmatmul", dict(m=8, k=32, n=16, relu=True)),
    ("qmatmul", dict(m=8, k=32, n=16, a_bits=7)),  # 7-bit activations: AVX2's u8 kernels where the CPU has them
    ("qmatmul", dict(m=8, k=32, n=32)),  # whole tiles of the default config: nothing padded per call (replayed)
    ("quantize_rows", dict(rows=8, cols=32)),  # QuantLinear quantizes its input with it
]


@pytest.fixture(scope="module")
def package(tmp_path_factory, cpu_builder):
    out = tmp_path_factory.mktemp("pkg")
    tasks = [make_task(op, "cpu", **fields) for op, fields in KERNELS]
    recs = [t.record(t.space.default(), costs=(1e-5,)) for t in tasks]
    manifest = export(recs, out, builder=cpu_builder, speedups={recs[0].task: 1.5})
    assert [e["speedup_vs_torch"] for e in manifest["kernels"]][:2] == [1.5, None]
    return out


@pytest.fixture()
def pkg(package):
    """The package loaded, with a call counter on each kernel (to tell a kernel run from a fallback)."""
    yield load_counting(package)
    at.unload_all()


def calls(pkg, op, **fields):
    return sum(k.calls for k in pkg.kernels if k.op == op and all(getattr(k.workload, f) == v
                                                                   for f, v in fields.items()))


def bags(batch, rows=50, dtype=torch.int64, seed=0, last=False):
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(0, 6, (batch,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
    indices = torch.randint(0, rows, (int(offsets[-1]),), generator=g)
    return indices.to(dtype), (offsets if last else offsets[:-1]).to(dtype)


def qmm_inputs(m, k=32, n=16, seed=0):
    w = search_spaces.get("qmatmul").Workload(m=m, k=k, n=n)
    return search_spaces.get("qmatmul").inputs(w, seed)


class _errors_on_fallback(warnings.catch_warnings):
    """A fallback inside is an error: the test means the kernel to run."""

    def __enter__(self):
        super().__enter__()
        warnings.simplefilter("error", at.NoTunedKernelWarning)


# ---- operators against their references ------------------------------------------------------------------
def test_each_op_matches_its_reference_in_eager_and_compiled_mode(pkg):
    weight = torch.randn(50, 8)
    idx, off = bags(13)
    x, ly = torch.randn(13, 8), torch.randn(13, 3, 8)
    a, wq, a_s, w_s, bias = qmm_inputs(8)

    def f(weight, idx, off, x, ly, a, wq, a_s, w_s, bias):
        return EB(weight, idx, off), INTER(x, ly), QMM(a, wq, a_s, w_s, bias)

    refs = (F.embedding_bag(idx, weight, off, mode="sum"),
            search_spaces.get("interaction").reference(
                search_spaces.get("interaction").Workload(batch=13, tables=3, dim=8), x, ly),
            search_spaces.get("qmatmul").reference(search_spaces.get("qmatmul").Workload(m=8, k=32, n=16),
                                                   a, wq, a_s, w_s, bias))
    args = (weight, idx, off, x, ly, a, wq, a_s, w_s, bias)
    with _errors_on_fallback():
        for out, ref in zip(f(*args), refs):
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        for out, ref in zip(torch.compile(f, fullgraph=True)(*args), refs):
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert calls(pkg, "embedding_bag") == calls(pkg, "interaction") == calls(pkg, "qmatmul") == 2


@pytest.mark.parametrize("op", ["embedding_bag", "embedding_bag_weighted", "interaction", "qmatmul"])
def test_opcheck(pkg, op):
    if op.startswith("embedding_bag"):
        idx, off = bags(9)
        psw = torch.rand(idx.shape, requires_grad=True) if op.endswith("weighted") else None
        args, kernel = (torch.randn(50, 8, requires_grad=True), idx, off, psw), EB.default
    elif op == "interaction":
        args, kernel = (torch.randn(7, 8, requires_grad=True), torch.randn(7, 3, 8, requires_grad=True)), INTER.default
    else:
        args, kernel = qmm_inputs(20), QMM.default
    with _errors_on_fallback():
        torch.library.opcheck(kernel, args)
    assert calls(pkg, op.removesuffix("_weighted")) > 0


def test_embedding_bag_options_run_their_kernels(pkg):
    weight = torch.randn(50, 8)
    idx, off = bags(11)
    psw = torch.rand(idx.shape)
    idx32, off32 = bags(11, dtype=torch.int32, last=True)
    idx32[::3] = 0  # padding rows: excluded from the sum and from the count of the mean
    with _errors_on_fallback():
        torch.testing.assert_close(EB(weight, idx, off, psw),
                                   F.embedding_bag(idx, weight, off, mode="sum", per_sample_weights=psw))
        torch.testing.assert_close(EB(weight, idx32, off32, None, "mean", True, 0),
                                   F.embedding_bag(idx32, weight, off32, mode="mean", include_last_offset=True,
                                                   padding_idx=0))
        torch.testing.assert_close(EB(weight, idx32, off32, None, "mean", True, -50),  # the same row, counted back
                                   F.embedding_bag(idx32, weight, off32, mode="mean", include_last_offset=True,
                                                   padding_idx=0))
    assert calls(pkg, "embedding_bag", per_sample_weights=True) == 1
    assert calls(pkg, "embedding_bag", mode="mean") == 2


# ---- dispatch: buckets and fallback --------------------------------------------------------------------------
def _qmatmul_op_matches_the_reference(m):
    """The op on m rows (k 32, n 16) through a kernel: contiguous, and as the reference computes it."""
    a, wq, a_s, w_s, bias = qmm_inputs(m, seed=m)
    with _errors_on_fallback():
        out = QMM(a, wq, a_s, w_s, bias)
    ref = search_spaces.get("qmatmul").reference(search_spaces.get("qmatmul").Workload(m=m, k=32, n=16),
                                                 a, wq, a_s, w_s, bias)
    assert out.is_contiguous()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("m, size", [(8, 8), (5, 8), (20, 32), (32, 32), (75, 32)])
def test_qmatmul_on_cpus_runs_the_nearest_bucket_for_the_whole_call(pkg, m, size):
    """A CPU kernel runs any whole number of its tasks (the rows padded up to one): one call, whatever M."""
    plan = at.REGISTRY.plan("qmatmul", "cpu", (32, 16, "int8", True, False, 8), m)
    assert [(c.kernel.size, c.start, c.stop) for c in plan] == [(size, 0, m)]
    _qmatmul_op_matches_the_reference(m)
    assert calls(pkg, "qmatmul") == 1


@pytest.fixture
def fixed_size(pkg, monkeypatch):
    """The package's qmatmul kernels taken as kernels of exactly their tuned size, as GPU kernels are."""
    for k in pkg.kernels:
        if k.op == "qmatmul":
            monkeypatch.setattr(k, "any_size", False)
    at.REGISTRY.plans.clear()
    callpath.invalidate()  # replayed calls were decided with the kernels as loaded
    yield pkg
    at.REGISTRY.plans.clear()
    callpath.invalidate()


@pytest.mark.parametrize("m, sizes", [(8, [8]), (5, [8]), (20, [32]), (32, [32]), (75, [32, 32, 32])])
def test_fixed_size_kernels_run_the_bucket_that_fits_padded_or_split(fixed_size, m, sizes):
    plan = at.REGISTRY.plan("qmatmul", "cpu", (32, 16, "int8", True, False, 8), m)
    assert [c.kernel.size for c in plan] == sizes and plan[-1].stop == m
    _qmatmul_op_matches_the_reference(m)
    assert calls(fixed_size, "qmatmul") == len(sizes)


def test_split_leaves_the_smallest_bucket_for_the_rest(fixed_size):
    plan = at.REGISTRY.plan("qmatmul", "cpu", (32, 16, "int8", True, False, 8), 70)
    assert [(c.kernel.size, c.start, c.stop) for c in plan] == [(32, 0, 32), (32, 32, 64), (8, 64, 70)]


def test_batch_between_buckets_runs_the_nearest_kernel_of_any_size_ops(pkg):
    weight = torch.randn(200, 8)  # rows, batch and bag sizes are runtime values of the embedding-bag kernel
    idx, off = bags(300, rows=200)
    with _errors_on_fallback():
        torch.testing.assert_close(EB(weight, idx, off), F.embedding_bag(idx, weight, off, mode="sum"))
    assert calls(pkg, "embedding_bag", per_sample_weights=False, mode="sum") == 1


def test_untuned_workloads_fall_back_to_pytorch_with_one_warning_each(pkg):
    weight, idx, off = torch.randn(50, 4), *bags(5)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            torch.testing.assert_close(EB(weight, idx, off), F.embedding_bag(idx, weight, off, mode="sum"))
        EB(weight, idx, off, None, "max")  # another workload: its own warning
        a, wq, a_s, w_s, bias = qmm_inputs(8, k=24)
        QMM(a, wq, a_s, w_s, bias)
        INTER(torch.randn(4, 8, dtype=torch.float64), torch.randn(4, 3, 8, dtype=torch.float64))
    msgs = [str(w.message) for w in seen if issubclass(w.category, at.NoTunedKernelWarning)]
    assert len(msgs) == 4, msgs
    assert "dim=4 mode=sum" in msgs[0] and "mode=max" in msgs[1] and "k=24" in msgs[2] and "float64" in msgs[3]
    assert sum(k.calls for k in pkg.kernels) == 0


def test_without_packages_the_ops_compute_pytorchs_result():
    at.unload_all()
    x, ly = torch.randn(3, 8), torch.randn(3, 3, 8)
    with pytest.warns(at.NoTunedKernelWarning):
        out = INTER(x, ly, True)
    ref = search_spaces.get("interaction").reference(
        search_spaces.get("interaction").Workload(batch=3, tables=3, dim=8, self_interaction=True), x, ly)
    torch.testing.assert_close(out, ref)


# ---- validation ---------------------------------------------------------------------------------------------
def _eb_case(case):
    weight, (idx, off) = torch.randn(50, 8), bags(6)
    if case == "index too large":
        idx[0] = 50
    elif case == "negative index":
        idx[-1] = -1
    elif case == "offsets[0]":
        off[0] = 1
    elif case == "decreasing offsets":
        off[2], off[3] = off[3] + 1, off[2]
    elif case == "offsets past the end":
        off[-1] = idx.numel() + 1
    elif case == "float indices":
        idx = idx.float()
    elif case == "non-contiguous weight":
        weight = torch.randn(8, 50).t()
    elif case == "2-D indices":
        idx = idx[:4].view(2, 2)
    return weight, idx, off


@pytest.mark.parametrize("case, exc, match", [
    ("index too large", IndexError, r"indices must be in \[0, 50\)"),
    ("negative index", IndexError, "indices must be in"),
    ("offsets[0]", ValueError, r"offsets\[0\] must be 0"),
    ("decreasing offsets", ValueError, "non-decreasing"),
    ("offsets past the end", ValueError, "exceeds the number of indices"),
    ("float indices", TypeError, "indices must be int32 or int64"),
    ("non-contiguous weight", ValueError, "weight must be contiguous"),
    ("2-D indices", ValueError, "indices must be 1-D"),
])
def test_embedding_bag_rejects_bad_inputs_as_pytorch_does(pkg, case, exc, match):
    args = _eb_case(case)
    with pytest.raises(exc, match=match) as err:
        EB(*args)
    assert isinstance(err.value, RuntimeError)  # what F.embedding_bag raises: callers' handlers keep working
    if case in ("index too large", "offsets[0]", "offsets past the end"):
        with pytest.raises(RuntimeError):
            F.embedding_bag(args[1], args[0], args[2], mode="sum")


def test_tensors_on_two_devices_are_rejected():
    # (a call with a meta tensor among its inputs dispatches to the fake implementation: check directly)
    weight, (idx, off) = torch.randn(50, 8), bags(6)
    with pytest.raises(ValueError, match="all tensors must be on one device, got weight on cpu, indices on cpu, "
                                         "offsets on meta"):
        eb_checks.check(weight, idx, off.to("meta"), None, "sum", False, None)


def test_7bit_qmatmul_runs_its_own_kernel_and_refuses_activations_out_of_its_range(pkg):
    a, wq, a_s, w_s, bias = qmm_inputs(8)
    a7 = a.clamp(-64, 63)
    ref = search_spaces.get("qmatmul").reference(search_spaces.get("qmatmul").Workload(m=8, k=32, n=16),
                                                 a7, wq, a_s, w_s, bias)
    with _errors_on_fallback():
        torch.testing.assert_close(QMM(a7, wq, a_s, w_s, bias, False, 7), ref, rtol=1e-5, atol=1e-4)
    assert calls(pkg, "qmatmul", a_bits=7) == 1
    with pytest.raises(ValueError, match=r"a_bits=7 activations must lie in \[-64, 63\], got values in \[-128"):
        QMM(a7.index_fill(1, torch.tensor([0]), -128), wq, a_s, w_s, bias, False, 7)
    with pytest.raises(ValueError, match="a_bits must be 7 or 8"):
        QMM(a7, wq, a_s, w_s, bias, False, 6)
    with pytest.raises(ValueError, match="got 1 .the argument after relu is a_bits now"):  # the call before a_bits
        QMM(a7, wq, a_s, w_s, bias, False, True)


def test_other_ops_reject_bad_inputs():
    a, wq, a_s, w_s, bias = qmm_inputs(8)
    with pytest.raises(ValueError, match="int8 activations need a_scale"):
        QMM(a, wq, None, w_s, bias)
    with pytest.raises(ValueError, match=r"weight must be \(n, 32\)"):
        QMM(a, wq[:, :16].contiguous(), a_s, w_s, bias)
    with pytest.raises(TypeError, match="w_scale must be float32"):
        QMM(a, wq, a_s, w_s.double(), bias)
    with pytest.raises(ValueError, match=r"ly must be \(4, tables, 8\)"):
        INTER(torch.randn(4, 8), torch.randn(5, 3, 8))
    with pytest.raises(TypeError, match="one dtype"):
        INTER(torch.randn(4, 8), torch.randn(4, 3, 8, dtype=torch.float64))


def test_validate_false_skips_the_checks(pkg):
    """x float64 and ly float32: the check refuses them; without it PyTorch's implementation runs (promoting)."""
    x, ly = torch.randn(4, 8, dtype=torch.float64), torch.randn(4, 3, 8)
    with pytest.raises(TypeError, match="one dtype"):
        INTER(x, ly)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", at.NoTunedKernelWarning)  # no float64 kernel: PyTorch's implementation
        out = INTER(x, ly, False, False)
    torch.testing.assert_close(out, dot_interaction(x, ly.double(), False))


def test_index_facts_on_device_match_the_cpu_path():
    for idx, off in [bags(7), bags(7, dtype=torch.int32, last=True), (torch.tensor([3, 1]), torch.tensor([0, 2, 1])),
                     (torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long))]:
        assert eb_workload._index_facts(idx, off) == eb_workload._index_facts_device(idx, off)


def test_fake_implementations_give_shapes_on_the_meta_device():
    meta = dict(device="meta")
    assert EB(torch.empty(50, 8, **meta), torch.empty(30, dtype=torch.long, **meta),
              torch.empty(6, dtype=torch.long, **meta), None, "sum", True).shape == (5, 8)
    assert INTER(torch.empty(4, 8, **meta), torch.empty(4, 26, 8, **meta), False).shape == (4, 8 + 27 * 26 // 2)
    assert QMM(torch.empty(4, 32, dtype=torch.int8, **meta), torch.empty(16, 32, dtype=torch.int8, **meta),
               torch.empty(4, **meta), torch.empty(16, **meta)).shape == (4, 16)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_tensors_fall_back_without_cuda_kernels(pkg):
    weight, (idx, off) = torch.randn(50, 8, device="cuda"), bags(6)
    idx, off = idx.cuda(), off.cuda()
    with pytest.warns(at.NoTunedKernelWarning, match="on cuda:sm_"):
        torch.testing.assert_close(EB(weight, idx, off), F.embedding_bag(idx, weight, off, mode="sum"))
    idx[0] = 50
    with pytest.raises(IndexError):
        EB(weight, idx, off)


# ---- autograd -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [dict(mode="sum"), dict(mode="sum", weighted=True),
                                    dict(mode="mean", padding_idx=0, include_last_offset=True, dtype=torch.int32)])
def test_embedding_bag_module_trains_like_nn_embedding_bag(pkg, kwargs):
    dtype, weighted = kwargs.pop("dtype", torch.int64), kwargs.pop("weighted", False)
    ref = nn.EmbeddingBag(50, 8, **kwargs)
    mine = at.EmbeddingBag.from_pretrained(ref.weight.detach().clone(), freeze=False, **kwargs)
    assert isinstance(mine.weight, nn.Parameter) and mine.state_dict().keys() == ref.state_dict().keys()
    idx, off = bags(9, dtype=dtype, last=kwargs.get("include_last_offset", False))
    psw = torch.rand(idx.shape, requires_grad=True) if weighted else None
    psw_ref = psw.detach().clone().requires_grad_() if weighted else None
    with _errors_on_fallback():
        out = mine(idx, off, psw)
    expected = ref(idx, off, psw_ref)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad)
    torch.testing.assert_close(mine.weight.grad, ref.weight.grad)
    if weighted:
        torch.testing.assert_close(psw.grad, psw_ref.grad)
    assert calls(pkg, "embedding_bag") == 1


def test_embedding_bag_module_takes_2d_input_and_keeps_pytorch_for_max_norm(pkg):
    mine = at.EmbeddingBag(50, 8, mode="sum")
    ref = nn.EmbeddingBag(50, 8, mode="sum", _weight=mine.weight.detach())
    idx = torch.randint(0, 50, (6, 3))
    torch.testing.assert_close(mine(idx), ref(idx))
    assert calls(pkg, "embedding_bag") == 1
    capped = at.EmbeddingBag(50, 8, mode="sum", max_norm=1.0)
    capped(idx)
    assert calls(pkg, "embedding_bag") == 1  # PyTorch's path: it renormalises the rows it read, in place
    assert capped.weight[idx.unique()].norm(dim=1).max() <= 1.0 + 1e-5


@pytest.mark.parametrize("self_interaction", [False, True])
def test_interaction_backward_matches_autograd_of_the_reference(pkg, self_interaction):
    x, ly = torch.randn(5, 8, requires_grad=True), torch.randn(5, 3, 8, requires_grad=True)
    out = at.DotInteraction(self_interaction)(x, list(ly.unbind(1)))
    ref = dot_interaction(x, ly, self_interaction)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (x, ly), grad)
    want = torch.autograd.grad(ref, (x, ly), grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


# ---- the dispatch: one crossing into Python, modes and gradients honoured --------------------------------
def test_a_call_needing_no_gradient_runs_the_kernel_in_grad_mode_without_an_autograd_node(pkg):
    x, ly = torch.randn(5, 8), torch.randn(5, 3, 8)
    with _errors_on_fallback():
        out = INTER(x, ly)
        with torch.no_grad():
            INTER(x.requires_grad_(), ly)
    assert out.grad_fn is None and not out.requires_grad and calls(pkg, "interaction") == 2
    grad = INTER(x, ly)  # x requires grad: the autograd way, still on the kernel
    assert grad.grad_fn is not None and calls(pkg, "interaction") == 3


def test_plain_cpu_tensors_in_grad_mode_take_the_direct_way(pkg):
    """The Autograd kernel runs the dispatch itself only for keysets it recognises as plain CPU/CUDA: a change
    in torch's key layout would send every grad-mode call the slow way (correct, ~5 us dearer) unnoticed. With the
    compiled call path that kernel is C++ and sends the rest to the Python one (its `autograd` counter)."""
    x, ly = torch.randn(5, 8), torch.randn(5, 3, 8)
    fake = torch._subclasses.fake_tensor.FakeTensorMode()
    if at.callpath.load() is not None:
        before = at.callpath.stats("interaction")["autograd"]
        with _errors_on_fallback():
            INTER(x, ly)
        assert at.callpath.stats("interaction")["autograd"] == before and calls(pkg, "interaction") == 1
        with fake as mode:
            INTER(mode.from_tensor(x), mode.from_tensor(ly))
        assert at.callpath.stats("interaction")["autograd"] == before + 1  # fake tensors: torch's way
        return
    decided = at.ops._AUTOGRAD["interaction"].plain
    decided.clear()
    with _errors_on_fallback():
        INTER(x, ly)
    assert len(decided) == 1 and next(iter(decided.values())) is not None and calls(pkg, "interaction") == 1
    with fake as mode:
        INTER(mode.from_tensor(x), mode.from_tensor(ly))
    assert len(decided) == 2 and list(decided.values())[1] is None  # fake tensors: torch's way


def test_dispatch_modes_and_fake_tensors_see_the_op_and_the_kernel_does_not_run(pkg):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func)
            return func(*args, **(kwargs or {}))

    x, ly = torch.randn(5, 8), torch.randn(5, 3, 8)
    with Record() as mode:
        torch.testing.assert_close(INTER(x, ly), dot_interaction(x, ly, False), rtol=1e-5, atol=1e-5)
    assert torch.ops.autotune.interaction.default in mode.ops and calls(pkg, "interaction") == 1
    with FakeTensorMode() as fake_mode:
        out = INTER(fake_mode.from_tensor(x), fake_mode.from_tensor(ly))
    assert out.shape == (5, 8 + 6) and calls(pkg, "interaction") == 1


def test_backward_through_an_op_without_a_backward_raises(pkg):
    a, wq, a_s, w_s, bias = qmm_inputs(8)
    out = QMM(a, wq, a_s, w_s, bias.requires_grad_())
    with pytest.raises(RuntimeError, match="no autograd formula"):
        out.sum().backward()


@pytest.mark.parametrize("inference", [False, True])
def test_the_fallback_warning_points_at_the_callers_line(inference):
    at.unload_all()
    x, ly = torch.randn(2, 8, dtype=torch.float64), torch.randn(2, 5, 8, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as seen, (torch.inference_mode() if inference else torch.enable_grad()):
        warnings.simplefilter("always")
        at.ops._WARNED.clear()
        INTER(x, ly, True)
    (w,) = [w for w in seen if issubclass(w.category, at.NoTunedKernelWarning)]
    assert w.filename == __file__, (w.filename, w.lineno)


def test_tuple_returning_ops_work_eager_compiled_and_under_opcheck():
    """quantize_rows returns (int8, scale): its schema, fake and autograd registration, without a kernel."""
    at.unload_all()
    x = torch.randn(6, 40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", at.NoTunedKernelWarning)
        q, scale = torch.ops.autotune.quantize_rows(x)
        cq, cscale = torch.compile(torch.ops.autotune.quantize_rows.default, fullgraph=True)(x)
        torch.library.opcheck(torch.ops.autotune.quantize_rows.default, (x,))
    assert q.dtype == torch.int8 and scale.shape == (6,)
    assert torch.equal(cq, q) and torch.equal(cscale, scale)


def test_two_weights_sharing_a_kernel_are_packed_once_each(pkg, monkeypatch):
    template = search_spaces.get("qmatmul")
    packed = []
    real = template.pack
    monkeypatch.setattr(template, "pack", lambda w, cfg, weight: packed.append(weight) or real(w, cfg, weight))
    layers = [at.QuantLinear.from_float(nn.Linear(32, 16)) for _ in range(2)]
    x = torch.randn(8, 32)
    with _errors_on_fallback(), warnings.catch_warnings():
        warnings.simplefilter("ignore", at.NoTunedKernelWarning)  # quantize_rows has no kernel here
        warnings.filterwarnings("error", "autotune.qmatmul", at.NoTunedKernelWarning)
        for _ in range(3):
            for layer in layers:
                layer(x)
    assert len(packed) == 2 and calls(pkg, "qmatmul", m=8) == 6
    layers[0].weight.add_(1)  # in place: packed again
    layers[0](x)
    assert len(packed) == 3


# ---- QuantLinear, loading, optimize ------------------------------------------------------------------------------
def test_quant_linear_from_float_quantizes_per_channel_and_per_row(pkg):
    linear = nn.Linear(32, 16)
    q = at.QuantLinear.from_float(linear)
    x = torch.randn(2, 4, 32)
    with _errors_on_fallback():
        y = q(x)
    assert y.shape == (2, 4, 16) and calls(pkg, "qmatmul", m=8, relu=False) == 1
    torch.testing.assert_close(y, linear(x), rtol=0, atol=0.05)  # int8 rounding of weights and activations
    a, s = at.quantize_rows(x.reshape(8, 32))
    exact = (a.double() @ q.weight.double().t()).float() * s[:, None] * q.w_scale + q.bias
    torch.testing.assert_close(y.reshape(8, 16), exact, rtol=1e-5, atol=1e-5)
    assert not list(q.parameters()) and set(q.state_dict()) == {"weight", "w_scale", "bias"}


def test_load_skips_kernels_of_another_cpu_and_says_why(package, tmp_path):
    manifest = read_manifest(package)
    for e in manifest["kernels"]:
        e["device"] = "cpu:znver3"
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.warns(UserWarning, match="tuned for cpu:znver3"):
        loaded = at.load(tmp_path, cpu="cpu:emeraldrapids")
    assert not loaded.kernels and len(loaded.skipped) == len(KERNELS)
    with pytest.raises(FileNotFoundError, match="no kernel package"):
        at.load(tmp_path / "missing")
    at.unload_all()


def _view_with_manifest(package: Path, into: Path, manifest: dict) -> Path:
    """`package` with another manifest: its files linked, not copied (so only the manifest differs)."""
    for item in package.iterdir():
        if item.name != "manifest.json":
            (into / item.name).symlink_to(item.resolve(), target_is_directory=item.is_dir())
    (into / "manifest.json").write_text(json.dumps(manifest))
    return into


@pytest.mark.parametrize("old", ["0ld0ld0ld0ld", None])
def test_load_refuses_kernels_built_by_other_template_code(package, tmp_path, old):
    from search_spaces.version import template_version

    manifest = read_manifest(package)
    entry = next(e for e in manifest["kernels"] if e["op"] == "interaction")
    current = template_version("interaction", "cpu")
    assert entry["template_version"] == current and "record_template_version" not in entry
    if old is None:
        del entry["template_version"]  # a package from before manifests recorded it
    else:
        entry["template_version"] = old
    loaded = len(at.REGISTRY.packages)
    with pytest.raises(at.StalePackage) as err:
        at.load(_view_with_manifest(package, tmp_path, manifest))
    shown = repr(old) if old else "none (exported before packages recorded it)"
    assert f"interaction on cpu: package template_version {shown}, this code's {current!r}" in str(err.value)
    assert "embedding_bag" not in str(err.value)  # only the stale op is named
    assert "Export the package again from records of the current code" in str(err.value)
    assert "tune again" in str(err.value) and str(tmp_path) in str(err.value)
    assert len(at.REGISTRY.packages) == loaded  # nothing of it was loaded


def test_export_records_the_code_that_built_a_kernel_from_a_stale_record(tmp_path, cpu_builder):
    """A record timed by older code (`autotune export --include-stale`) is rebuilt by today's code, which is
    what the manifest's template_version names; the record's own version is kept beside it, and it loads."""
    task = make_task("interaction", "cpu", batch=8, tables=3, dim=8)
    (entry,) = export([task.record(task.space.default(), costs=(1e-5,), template_version="0ld0ld0ld0ld")],
                      tmp_path, builder=cpu_builder)["kernels"]
    assert entry["template_version"] == task.template_version != "0ld0ld0ld0ld"
    assert entry["record_template_version"] == "0ld0ld0ld0ld"
    try:
        assert len(at.load(tmp_path).kernels) == 1
    finally:
        at.unload_all()


def test_a_package_runs_without_the_tvm_compiler(package, tmp_path):
    fake = tmp_path / "tvm"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('no TVM compiler here')\n")
    code = ("import sys, warnings, torch, autotune.torch as at\n"
            f"pkg = at.load({str(package)!r})\n"
            "warnings.simplefilter('error')\n"
            "w, i, o = torch.randn(50, 8), torch.tensor([1, 2, 3]), torch.tensor([0, 1])\n"
            "torch.testing.assert_close(torch.ops.autotune.embedding_bag(w, i, o),\n"
            "                           torch.nn.functional.embedding_bag(i, w, o, mode='sum'))\n"
            "print(len(pkg.kernels), 'tvm' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [str(len(KERNELS)), "False"]


def test_default_package_from_the_environment(package, monkeypatch):
    at.unload_all()
    monkeypatch.setenv("AUTOTUNE_KERNELS", str(package))
    monkeypatch.setattr(registry, "_DEFAULT_LOADED", False)
    weight, (idx, off) = torch.randn(50, 8), bags(4)
    with _errors_on_fallback():
        EB(weight, idx, off)  # the first call loads $AUTOTUNE_KERNELS
    assert len(at.REGISTRY.packages) == 1 and at.REGISTRY.packages[0].kernels[0].speedup_vs_torch == 1.5
    at.unload_all()


def test_export_bench_records_the_speedup_over_pytorch(tmp_path, capsys, monkeypatch, cpu_builder):
    from conftest import default_pools

    from autotune import bench as bench_module, records
    from autotune.cli import main
    from autotune.runtime import Timing

    real, benched = bench_module.bench, []

    def quick_bench(task, logs, **kw):
        """The real bench, on a smaller budget: 1 round of ~10 ms per contender (not 3 of ~0.5 s), no roofline
        (the speed-up does not use it); what export --bench records of it is what this test checks."""
        benched.append(task.op)
        return real(task, logs, rounds=1, timing=Timing(number=1, repeat=2, min_repeat_ms=5.0), roof=False, **kw)

    monkeypatch.setattr(bench_module, "bench", quick_bench)  # export --bench imports it when it runs
    task = make_task("embedding_bag", "cpu", rows=100, dim=8, batch=16, pooling=(1, 4))
    records.append(tmp_path / "eb.jsonl", [task.record(task.space.default(), costs=(2e-5,))])
    with default_pools(cpu_builder):  # export's own Builder() is the session's pool (its own: test_an_out_of_tree_...)
        assert main(["export", "--log", str(tmp_path / "eb.jsonl"), "--out", str(tmp_path / "pkg"), "--bench"]) == 0
    (entry,) = read_manifest(tmp_path / "pkg")["kernels"]
    assert benched == ["embedding_bag"]
    assert entry["speedup_vs_torch"] > 0 and "x PyTorch" in capsys.readouterr().out


def _example():
    path = Path(__file__).resolve().parent.parent / "examples" / "dlrm.py"
    spec = importlib.util.spec_from_file_location("dlrm_example", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["dlrm_example"] = module
    spec.loader.exec_module(module)
    return module


def test_optimize_swaps_the_example_models_modules_and_keeps_its_outputs(pkg):
    dlrm = _example()
    model = dlrm.DLRM(table_rows=(50, 40, 30), dim=8, bottom=(16,), top=(32, 16, 1)).eval()
    optimized = __import__("copy").deepcopy(model)
    report = at.optimize(optimized, pkg, extra={dlrm.Interaction: at.DotInteraction.from_module})
    swapped = {s.name for s in report.swapped}
    assert swapped == {"embeddings.0", "embeddings.1", "embeddings.2", "interaction", "top.2", "top.3"}, str(report)
    assert {name for name, _ in report.kept} == {"bottom.0", "bottom.2", "top.0", "top.4"}
    assert isinstance(optimized.top[2], at.QuantLinear) and optimized.top[2].relu
    assert optimized.embeddings[0].weight is not model.embeddings[0].weight  # deepcopy: its own Parameter
    dense, indices, offsets = dlrm.make_batch(model, 8, pooling=(0, 4))
    with torch.inference_mode(), _errors_on_fallback():
        torch.testing.assert_close(optimized(dense, indices, offsets), model(dense, indices, offsets),
                                   rtol=0, atol=1e-2)
    assert calls(pkg, "embedding_bag") == 3 and calls(pkg, "interaction") == 1 and calls(pkg, "qmatmul") == 1
    again = at.optimize(optimized, pkg, extra={dlrm.Interaction: at.DotInteraction.from_module})
    assert not again.swapped  # already optimized
    quantize_off = at.optimize(__import__("copy").deepcopy(model), pkg, quantize=False)
    assert {s.name for s in quantize_off.swapped} == {"embeddings.0", "embeddings.1", "embeddings.2"}


# ---- the torch layer holds no operator knowledge --------------------------------------------------------------
OUT_OF_TREE = '''
"""tests/templates/faulty.py (x + 1) with a torch binding: torch.ops.autotune.plus_one."""
from templates.faulty import (Workload, check_inputs, inputs, kernel_args, lower, reference, space, tolerance,
                              traffic, WEIGHTS)

NAME, DOC, EXAMPLE_SHAPE, TEST_SHAPE = "plus_one", "x + 1", "n=16", "n=16"


def torch_binding():
    import torch
    from search_spaces import InvalidInput, Route, TorchBinding

    def plus_one(x: torch.Tensor, validate: bool = True) -> torch.Tensor:
        return x + 1

    def check(x, validate=True):
        if x.dim() != 1:
            raise InvalidInput("plus_one: x must be 1-D")

    return TorchBinding(op=plus_one, fake=lambda x, validate=True: torch.empty_like(x), check=check,
                        route=lambda x, validate=True: Route((x.numel(),), 1),
                        run=lambda chunks, x, validate=True: chunks[0].kernel(x),
                        compiled=lambda w: (w.n,), size=lambda w: 1, any_size=True, describe=lambda s: f"n={s[0]}",
                        cases=lambda w, seed, count: [("x", (torch.randn(w.n),), {})])
'''


def test_an_out_of_tree_template_gets_its_torch_op_from_its_binding(tmp_path, monkeypatch):
    (tmp_path / "oot_ops").mkdir()
    (tmp_path / "oot_ops" / "__init__.py").write_text("")
    (tmp_path / "oot_ops" / "plus_one.py").write_text(OUT_OF_TREE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    task = make_task("oot_ops.plus_one", "cpu", shape="n=16")
    export([task.record(task.space.default(), costs=(1e-6,))], tmp_path / "pkg")
    assert not hasattr(torch.ops.autotune, "plus_one")
    at.unload_all()
    try:
        (kernel,) = at.load(tmp_path / "pkg").kernels
        calls = []
        inner = kernel.func
        kernel.func = lambda *args: calls.append(1) or inner(*args)
        x = torch.randn(16)
        with _errors_on_fallback():
            torch.testing.assert_close(torch.ops.autotune.plus_one(x), x + 1)
        assert calls == [1]
        with pytest.warns(at.NoTunedKernelWarning, match="no loaded kernel for n=8 on cpu"):
            torch.testing.assert_close(torch.ops.autotune.plus_one(x[:8]), x[:8] + 1)
        with pytest.raises(ValueError, match="x must be 1-D"):
            torch.ops.autotune.plus_one(x.view(4, 4))
    finally:
        at.unload_all()


@pytest.mark.parametrize("op", sorted(at.ops.BINDINGS))
def test_each_bindings_cases_are_calls_its_kernel_serves(op):
    """`autotune check` runs a kernel on its operator's cases: each must route to the kernel's signature (and
    be non-empty, so the kernel, not PyTorch by design, serves it), pass the checks and match the fake."""
    binding, template = at.ops.BINDINGS[op], search_spaces.get(op)
    w = template.Workload.from_shape(template.TEST_SHAPE)
    cases = list(binding.cases(w, 3, 2))
    assert len(cases) >= 5 and len({name for name, _, _ in cases}) == len(cases)
    for name, args, kwargs in cases:
        binding.check(*args, **kwargs)
        route = binding.route(*args, **kwargs)
        assert route.signature == binding.compiled(w) and route.size >= 1, name
        out, fake = binding.op(*args, **kwargs), binding.fake(*args, **kwargs)
        outs, fakes = (out, fake) if isinstance(out, tuple) else ((out,), (fake,))
        assert [(o.shape, o.dtype) for o in outs] == [(f.shape, f.dtype) for f in fakes], name


# ---- the compiled call path (callpath.cpp): later calls of the same metadata replay the first one's decision -
needs_callpath = requires_build(
    "callpath", lambda: at.callpath.load() is not None,
    "the compiled call path (autotune/torch/callpath.cpp) did not load: it needs a C++ compiler (CXX, else c++), "
    "which `make install` uses to build it, and AUTOTUNE_CALLPATH unset or =compiled")


@pytest.fixture()
def loaded(package):
    """The package loaded as exported: no call counters (a counted kernel is not a TVM function: not replayed)."""
    at.unload_all()
    yield at.load(package)
    at.unload_all()


def _replays(op):
    return at.callpath.stats(op)["replayed"]


@needs_callpath
@pytest.mark.parametrize("op, fields", KERNELS, ids=[f"{op}-{i}" for i, (op, _) in enumerate(KERNELS)])
def test_replayed_calls_match_the_python_path_and_the_reference_on_every_case(loaded, op, fields):
    """Each of the binding's cases (`autotune check`'s: batch sizes, empty bags, edge indices...) three times:
    through the Python dispatch (recorded), replayed in grad mode and in inference mode: the replays are the
    same kernel's bits, and pass the rule that judges kernels (`runtime.judge`)."""
    from autotune.runtime import expected_call, mismatch

    task = make_task(op, "cpu", **fields)
    binding, kernel = at.ops.BINDINGS[task.template.NAME], getattr(torch.ops.autotune, task.template.NAME)
    before, python = _replays(op), at.callpath.stats(op)["python"]
    with _errors_on_fallback():
        for name, args, kwargs in binding.cases(task.workload, 0, 2):
            first = kernel(*args, **kwargs)
            again = kernel(*args, **kwargs)
            with torch.inference_mode():
                third = kernel(*args, **kwargs)
            torch.testing.assert_close(again, first, rtol=0, atol=0, msg=name)
            torch.testing.assert_close(third, first, rtol=0, atol=0, msg=name)
            exp = expected_call(task.template, task.workload, binding.op, *args, **kwargs)
            assert mismatch(again, exp) is None, name
    if _replayable(task):
        assert _replays(op) > before
    else:
        assert _replays(op) == before and at.callpath.stats(op)["python"] > python


def _replayable(task):
    """Whether calls of the task's default kernel replay: not for validated 7-bit activations (their range is
    read), nor where qmatmul pads its operands (a copy per call, not a view of an argument)."""
    if task.template.NAME != "qmatmul":
        return True
    w = task.workload
    return w.a_bits == 8 and task.template.padded_dims(w, task.space.default()) == (w.m, w.k, w.n)


@needs_callpath
def test_a_replayed_call_the_kernel_flags_raises_as_the_python_path_does(loaded):
    weight = torch.randn(50, 8)
    idx, off = bags(8)
    good = F.embedding_bag(idx, weight, off, mode="sum")
    EB(weight, idx, off)
    before = _replays("embedding_bag")
    torch.testing.assert_close(EB(weight, idx, off), good)
    assert _replays("embedding_bag") == before + 1
    bad = idx.clone()
    bad[-1] = 50
    with pytest.raises(at.IndexOutOfRange, match=r"indices must be in \[0, 50\)"):
        EB(weight, bad, off)
    disordered = off.clone()
    disordered[1], disordered[2] = off[2] + 1, off[2]
    with pytest.raises(RuntimeError, match="offsets"):
        EB(weight, idx, disordered)
    torch.testing.assert_close(EB(weight, idx, off), good)  # and the next good call is replayed again
    assert _replays("embedding_bag") == before + 2


@needs_callpath
def test_a_replayed_qmatmul_keeps_one_packing_per_weight_and_packs_an_updated_weight_anew(loaded):
    from autotune.runtime import expected, mismatch

    qmm = search_spaces.get("qmatmul")
    w = qmm.Workload(m=8, k=32, n=32)
    a, w1, a_s, w_s, bias = qmm_inputs(8, n=32)
    w2 = qmm_inputs(8, n=32, seed=1)[1]

    def agrees(weight):
        return mismatch(QMM(a, weight, a_s, w_s, bias), expected(qmm, w, a, weight, a_s, w_s, bias)) is None

    before = _replays("qmatmul")
    for _ in range(3):  # two layers of one shape: a plan each, both replayed
        assert agrees(w1) and agrees(w2)
    assert _replays("qmatmul") == before + 4
    w1.copy_(qmm_inputs(8, n=32, seed=2)[1])  # an in-place update (a new version): packed anew, then replayed
    assert agrees(w1) and agrees(w1)
    assert _replays("qmatmul") == before + 5


@needs_callpath
def test_arguments_sharing_a_buffer_are_replayed_as_themselves(loaded):
    """x and ly views of one buffer (DLRM's fused (B, 1+T, D) layout), then separate tensors of the same metadata:
    the replay must read each argument, not the first one's buffer at the second's offset."""
    flat = torch.randn(8 * 8 + 8 * 3 * 8)
    x, ly = flat[:64].view(8, 8), flat[64:].view(8, 3, 8)
    ref = at.ops.BINDINGS["interaction"].op
    torch.testing.assert_close(INTER(x, ly), ref(x, ly))
    before = _replays("interaction")
    x2, ly2 = torch.randn(8, 8), torch.randn(8, 3, 8)
    torch.testing.assert_close(INTER(x2, ly2), ref(x2, ly2))
    torch.testing.assert_close(INTER(x, ly), ref(x, ly))
    assert _replays("interaction") == before + 2


@needs_callpath
def test_loading_a_package_forgets_the_recorded_calls(loaded, package):
    x, ly = torch.randn(5, 8), torch.randn(5, 3, 8)
    INTER(x, ly)
    assert at.callpath.stats("interaction")["plans"] >= 1
    at.load(package)
    assert at.callpath.stats("interaction")["plans"] == 0


def test_the_python_call_path_serves_when_asked_for_or_without_a_compiler(package, tmp_path):
    """AUTOTUNE_CALLPATH=python, or no C++ compiler: the ops' Python kernels at every key (and a clear error for a
    wrong value)."""
    code = (f"import torch, autotune.torch as at; assert at.callpath.load() is None; at.load({str(package)!r}); "
            "x, ly = torch.randn(8, 8), torch.randn(8, 3, 8); "
            "out = torch.ops.autotune.interaction(x, ly); "
            "ref = at.ops.BINDINGS['interaction'].op(x, ly); "
            "torch.testing.assert_close(out, ref); print('ok')")
    env = {**os.environ, "AUTOTUNE_CALLPATH": "python"}
    done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
    # no C++ compiler: one warning saying so, and the Python kernels serve
    code = (f"import warnings, torch; warnings.simplefilter('always'); import autotune.torch as at; "
            f"at.load({str(package)!r}); x, ly = torch.randn(8, 8), torch.randn(8, 3, 8); "
            "ref = at.ops.BINDINGS['interaction'].op(x, ly); "
            "torch.testing.assert_close(torch.ops.autotune.interaction(x, ly), ref)")
    env.update(AUTOTUNE_CALLPATH="compiled", AUTOTUNE_CACHE=str(tmp_path), CXX="/nonexistent/c++")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count("the compiled one could not be built") == 1, done.stderr[-2000:]
    env["AUTOTUNE_CALLPATH"] = "fast"
    done = subprocess.run([sys.executable, "-c", "import autotune.torch"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0 and "AUTOTUNE_CALLPATH must be compiled or python, got 'fast'" in done.stderr
