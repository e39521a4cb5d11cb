"""split_linear: the pieces' arithmetic, the kernels (each path this CPU has) at float32 accuracy against float64
where a bf16 product would not be, the torch op on a loaded kernel (every case, bad tensors, opcheck, compile, the
gradient), the graph rule (which layers it offers, a strided input) and tune_model's grouping of fusing rules,
which judges it against oneDNN's layers apart from the fused embedding stage."""

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
from autotune.torch.whole_model import fusion_groups
from search_spaces import InvalidDtype, InvalidInput, WorkloadError
from search_spaces import split_linear as sl
from search_spaces.split_linear import cpu
from search_spaces.split_linear.torch_op import BINDING
from search_spaces.template import GraphRule

SL = torch.ops.autotune.split_linear
HAS_AMX = "amx_bf16" in cpu_flags()
PATHS = ["simd", *(["amx"] if HAS_AMX else [])]


def test_three_bf16_pieces_sum_to_the_float32_exactly():
    """Magnitudes from 1e-30 to 1e30 (both signs): the last piece, 2^-16 below, is then a normal float. (Below
    about 2^-109 it is subnormal, and a thread whose floating-point unit flushes subnormals to zero, as a
    library loaded before may have set it, loses it: randn's near-zero draws times 1e-30 failed a CI run.)"""
    g = torch.Generator().manual_seed(0)
    sign = torch.randint(0, 2, (4096,), generator=g) * 2 - 1
    x = sign * torch.pow(10.0, torch.empty(4096).uniform_(-30, 30, generator=g))
    hi, mid, lo = cpu.pieces(x)
    assert all(p.dtype == torch.bfloat16 for p in (hi, mid, lo))
    assert torch.equal(hi.double() + mid.double() + lo.double(), x.double())
    assert bool((mid.double().abs() <= hi.double().abs() * 2.0 ** -8).all())  # each piece 8 bits below


@pytest.mark.parametrize("shape, rows, k_block", [
    ("m=2048,k=3456,n=1024", 256, 1024),  # DLRMv2's first top layer: 8 tasks of 256 rows, k in blocks of 1024
    ("m=2048,k=512,n=3456", 256, 256),  # its cross layers' W product: two k blocks
    ("m=512,k=1024,n=64", 64, 512),
    ("m=64,k=256,n=128", 32, 0),  # a small batch: the fewest rows per task; K too short to block
    ("m=2048,k=13,n=512", 256, 0),
])
def test_the_default_keeps_tasks_for_the_cores_and_blocks_long_reductions(shape, rows, k_block):
    w = sl.Workload(**{k: int(v) for k, v in (f.split("=") for f in shape.split(","))})
    assert (cpu.default_rows(w), cpu.default_k_block(w)) == (rows, k_block)
    default = make_task("split_linear", "cpu", shape=shape).space.default().as_dict()
    assert default["rows_per_task"] == rows
    assert default["k_block"] == (k_block if default["intrinsic"] == "amx" else 0)  # 'simd' has no k blocks


def test_workload_refuses_bad_fields():
    for bad in ("m=0,k=4,n=4", "m=4,k=-1,n=4", "m=4,k=4,n=4,relu=2"):
        with pytest.raises(WorkloadError):
            sl.Workload.from_shape(bad)


@pytest.mark.parametrize("path", PATHS)
def test_each_path_is_as_accurate_as_a_float32_gemm(path):
    """Against float64, the kernel's worst error is within a small factor of PyTorch's float32 Linear (here
    1-2.7x; 'simd' sums each output's k in one chain) where a single bf16 product, with 8 significant bits,
    would be ~1000 times larger, on the tile-ragged test shape and a layer's."""
    for shape in (sl.TEST_SHAPE, "m=300,k=512,n=96,relu=0"):
        task = make_task("split_linear", "cpu", shape=shape)
        unblocked = {"k_block": 0, "cols_per_task": 0} if path == "simd" else {}  # 'simd' has no blocks
        cfg = task.space.from_json({**task.space.default().to_json(), "intrinsic": path, **unblocked})
        kernel = BoundKernel(task.template, task.workload, cfg, load_compiled(task, cfg), False)
        inputs = task.template.inputs(task.workload, 3)
        exact = sl.reference(task.workload, *(t.double() for t in inputs))
        ours = (kernel(*inputs).double() - exact).abs().max()
        theirs = (sl.reference(task.workload, *inputs).double() - exact).abs().max()
        assert mismatch(kernel(*inputs), expected(task.template, task.workload, *inputs)) is None
        assert ours <= 8 * theirs + 1e-7, (shape, float(ours), float(theirs))


def test_every_register_block_computes_the_reference():
    """Each path's every register block, in tasks of 32 rows (the test shape's 37: a whole task and a ragged one;
    N = 40 and K = 45 not whole tiles)."""
    task = make_task("split_linear", "cpu", shape=sl.TEST_SHAPE)
    inputs = task.template.inputs(task.workload, 5)
    exp = expected(task.template, task.workload, *inputs)
    configs = [c for c in task.space if c[cpu.ROWS_PER_TASK] == 32]
    assert {c[cpu.INTRINSIC] for c in configs} == set(PATHS)
    for cfg in configs:
        kernel = BoundKernel(task.template, task.workload, cfg, load_compiled(task, cfg), False)
        assert mismatch(kernel(*inputs), exp) is None, cfg.key()


@pytest.mark.skipif(not HAS_AMX, reason="the blocked kernels are AMX's: this CPU has no AMX-BF16")
def test_blocked_kernels_sum_what_the_whole_rows_kernel_sums():
    """Column groups (the last one short), k blocks (the last one past K) and tasks past M change where the
    accumulators wait between k blocks, not the sums: every blocked config (of two register blocks) gives the
    whole-rows kernel's output with the same register block, bit for bit, on a shape whose M, N and K are no whole
    tiles."""
    task = make_task("split_linear", "cpu", shape="m=70,k=1090,n=300,relu=1")
    inputs = task.template.inputs(task.workload, 7)
    exp = expected(task.template, task.workload, *inputs)

    def run(cfg):
        return BoundKernel(task.template, task.workload, cfg, load_compiled(task, cfg), False)(*inputs)

    blocked = [c for c in task.space if c[cpu.INTRINSIC] == "amx" and c[cpu.ROWS_PER_TASK] == 32
               and (c[cpu.COLS_PER_TASK] or c[cpu.K_BLOCK]) and (c[cpu.M_TILES], c[cpu.N_TILES]) in ((2, 2), (1, 1))]
    assert {c[cpu.K_BLOCK] for c in blocked} == {0, 256} and {c[cpu.COLS_PER_TASK] for c in blocked} == {0, 128, 256}
    whole = {}
    for cfg in blocked:
        block = (cfg[cpu.M_TILES], cfg[cpu.N_TILES])
        if block not in whole:
            whole[block] = run(task.space.from_json({**cfg.to_json(), "cols_per_task": 0, "k_block": 0}))
            assert mismatch(whole[block], exp) is None
        assert torch.equal(run(cfg), whole[block]), cfg.key()


# ---- the torch op ---------------------------------------------------------------------------------------------
W = sl.Workload(m=40, k=45, n=24, relu=True)
W_NO_BIAS = sl.Workload(m=40, k=45, n=24, bias=False)


@pytest.fixture(scope="module")
def package(tmp_path_factory, cpu_builder):
    out = tmp_path_factory.mktemp("sl-pkg")
    tasks = [make_task("split_linear", "cpu", **vars(w)) for w in (W, W_NO_BIAS)]
    export([t.record(t.space.default(), costs=(1e-5,)) for t in tasks], out, builder=cpu_builder)
    return out


@pytest.fixture()
def pkg(package):
    yield load_counting(package)
    at.unload_all()


def test_torch_op_runs_the_kernel_on_every_case(pkg):
    """`autotune check`'s cases (several M, zeros, both signs, magnitudes 1e-20 to 1e20, cancelling products)
    on the loaded kernels, judged by the float64 rule, with and without a bias."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", at.NoTunedKernelWarning)
        for w in (W, W_NO_BIAS):
            for name, args, kwargs in BINDING.cases(w, 3, 2):
                ref = sl.reference(w, *(a.double() for a in args[:2]),
                                   None if args[2] is None else args[2].double())
                mag = sl.reference(w, *(a.double().abs() for a in args[:2]),
                                   None if args[2] is None else args[2].double().abs())
                got = SL(*args, **kwargs).double()
                rtol, atol = sl.tolerance(w)
                assert bool(((got - ref).abs() <= atol + rtol * mag).all()), name
    assert sum(k.calls for k in pkg.kernels) == sum(len(list(BINDING.cases(w, 3, 2))) for w in (W, W_NO_BIAS))
    assert SL(torch.empty(7, 45, device="meta"), torch.empty(24, 45, device="meta")).shape == (7, 24)


def test_torch_op_refuses_bad_tensors(pkg):
    x, weight, bias = sl.inputs(W, 1)
    with pytest.raises(InvalidDtype, match="x must be float32"):
        SL(x.double(), weight, bias, True)
    with pytest.raises(InvalidInput, match="x has 44 features but weight takes 45"):
        SL(x[:, :44].contiguous(), weight, bias, True)
    with pytest.raises(InvalidInput, match=r"bias must hold one value per output, shape \(24,\)"):
        SL(x, weight, bias[:5], True)
    with pytest.raises(InvalidInput, match="contiguous"):
        SL(x.t().contiguous().t(), weight, bias, True)
    assert sum(k.calls for k in pkg.kernels) == 0


def test_torch_op_passes_opcheck_and_compiles_whole(pkg):
    """The op's schema, fake, autograd registration and a `torch.compile(fullgraph=True)` of a call, each
    through the kernel."""
    x, weight, bias = sl.inputs(W, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", at.NoTunedKernelWarning)
        torch.library.opcheck(SL.default, (x, weight.requires_grad_(), bias, True))
        compiled = torch.compile(lambda x, w, b: SL(x, w, b, True), fullgraph=True)
        torch.testing.assert_close(compiled(x, weight.detach(), bias), sl.reference(W, x, weight.detach(), bias),
                                   rtol=1e-5, atol=1e-5)
    assert sum(k.calls for k in pkg.kernels) > 1


def test_torch_op_has_linears_gradient(pkg):
    x, weight, bias = (t.clone().requires_grad_() for t in sl.inputs(W, 2))
    SL(x, weight, bias, True).square().sum().backward()
    grads = [t.grad.clone() for t in (x, weight, bias)]
    for t in (x, weight, bias):
        t.grad = None
    torch.relu(nn.functional.linear(x, weight, bias)).square().sum().backward()
    for g, t in zip(grads, (x, weight, bias)):
        assert torch.allclose(g, t.grad, rtol=1e-4, atol=1e-5)


# ---- tune_model -----------------------------------------------------------------------------------------------
def test_fusion_groups_keep_the_embedding_stages_rules_together_and_split_linear_apart():
    """The fused embedding stage's three rules all fuse the interaction: one alternative, judged together as
    before; split_linear fuses dense_linear's sites only: judged on its own."""
    find = lambda *a: iter(())  # noqa: E731
    rules = [GraphRule("ei_int8", find, fuses=("bags_int8", "interaction")),
             GraphRule("ei_fp16", find, fuses=("bags_fp16", "interaction")),
             GraphRule("ei", find, fuses=("bags", "interaction")), GraphRule("bags", find),
             GraphRule("split_linear", find, fuses=("dense_linear",)), GraphRule("dense_linear", find)]
    assert [[r.name for r in g] for g in fusion_groups(rules)] == [["ei_int8", "ei_fp16", "ei"], ["split_linear"]]


@pytest.mark.skipif(not HAS_AMX, reason="the rule is offered on CPUs with AMX-BF16 only")
def test_the_rule_offers_float32_linears_with_their_relu_and_leaves_small_ones():
    """A layer of 64 -> 256 over 512 rows is offered with its ReLU; a head of 8 outputs (under a tile) is not,
    nor a layer of too few products (the split and the tiles' setup would cost more than they save)."""
    from autotune.torch.graph import capture, example_values
    from search_spaces.split_linear.graph import find

    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8)).eval()
    for rows, want in ((512, [{"m": 512, "k": 64, "n": 256, "bias": True, "relu": True}]), (16, [])):
        args = (torch.randn(rows, 64),)
        gm = capture(model, args)
        assert [m.tasks[0][1] for m in find(gm, example_values(gm, args), set())] == want


def test_a_rewritten_layer_takes_a_strided_input(pkg):
    """The rule puts `aten.contiguous` before the op (a no-op on rows already contiguous), since the Linear it
    replaces took any strides: here a transposed x, through the kernel."""
    from search_spaces.split_linear.graph import _replace

    x, weight, bias = sl.inputs(W, 4)
    graph = torch.fx.Graph()
    xt, w_, b_ = graph.placeholder("xt"), graph.placeholder("w"), graph.placeholder("b")
    x_ = graph.call_function(torch.ops.aten.t.default, (xt,))
    linear = graph.call_function(torch.ops.aten.linear.default, (x_, w_, b_))
    relu = graph.call_function(torch.ops.aten.relu.default, (linear,))
    graph.output(relu)
    gm = torch.fx.GraphModule({}, graph)
    (new,) = _replace(linear, relu)(gm)
    relu.replace_all_uses_with(new)
    for node in (relu, linear):
        graph.erase_node(node)
    gm.recompile()
    strided = x.t().contiguous()
    torch.testing.assert_close(gm(strided, weight, bias), torch.relu(nn.functional.linear(x, weight, bias)),
                               rtol=1e-5, atol=1e-5)
    assert sum(k.calls for k in pkg.kernels) == 1
