"""Row-wise int8 quantization: the semantics' edge cases, CPU kernels bit for bit against PyTorch (every knob
value, ragged and narrow rows, any batch, the 7-bit range), the torch op with a loaded kernel (and QuantLinear on
it), and the CUDA kernels (built with nvcc within the device's limits, and emulated on the CPU)."""

import warnings

import numpy as np
import pytest
from conftest import cpu_flags, load_counting, needs_gxx
import torch
from torch import nn

import autotune.torch as at
from autotune.build import compile_module
from autotune.package import export
from autotune.task import make_task
from cuda_emulator import cuda_source, emulate_cuda
from gpu_build import ARCHS, assert_built_within_limits, build_sample
from search_spaces import Config, InvalidConfig, InvalidDtype, InvalidInput, WorkloadError
from search_spaces import quantize_rows as qr
from search_spaces.quantize_rows import cpu, cuda
from search_spaces.quantize_rows.torch_op import BINDING, half_boundaries
from search_spaces.quantize_rows.workload import quantize_rows

QR = torch.ops.autotune.quantize_rows


def exact(got, want, msg=""):
    (q, s), (q_ref, s_ref) = got, want
    assert q.dtype == torch.int8 and s.dtype == torch.float32, msg
    assert torch.equal(s, s_ref), f"{msg}: scales differ"
    bad = (q != q_ref).nonzero()
    assert not len(bad), f"{msg}: {len(bad)} q differ, first at {bad[0].tolist()}"


def inputs_of_every_case(w):
    """The x of each of the op's cases (several batches, zero row, extremes, .5 boundaries), and their names."""
    return [(name, args[0]) for name, args, _ in BINDING.cases(w, 3, 2)]


# ---- the semantics --------------------------------------------------------------------------------------------
def test_semantics_round_half_to_even_clamp_zero_rows_and_the_range():
    x = torch.tensor([[127.0, 2.5, 3.5, -2.5, -0.5, 0.5, 1.5, -127.0],  # scale exactly 1: quotients on .5
                      [0.0] * 8,  # all zero: scale is the clamped 1e-12 / 127, q all 0
                      [1e-30, -1e-30, 0, 0, 0, 0, 0, 0]])  # tiny: below the clamp, q all 0
    q, s = quantize_rows(x)  # the default range
    assert q[0].tolist() == [127, 2, 4, -2, 0, 0, 2, -127]  # half to even (not half away from zero)
    assert s[0] == 1.0 and torch.equal(s[1:], torch.full((2,), torch.tensor(1e-12) / 127))
    assert not q[1:].any()
    big = torch.randn(64, 40) * 1e30
    q, s = quantize_rows(big)
    assert int(q.min()) >= -127 and int(q.max()) <= 127 and (q.abs() == 127).sum(1).min() >= 1


def test_boundary_inputs_tell_division_from_reciprocal_and_rounding_modes():
    """The .5 cases catch a kernel that multiplies by 1/scale or rounds half away from zero."""
    x = half_boundaries(64, 40, 0, random_scales=True)
    q, s = quantize_rows(x)
    by_reciprocal = torch.round(x * (1 / s)[:, None]).clamp(-127, 127).to(torch.int8)
    t = x / s[:, None]
    half_away = (torch.sign(t) * torch.floor(t.abs() + 0.5)).clamp(-127, 127).to(torch.int8)
    assert (q != by_reciprocal).float().mean() > 0.02 and (q != half_away).float().mean() > 0.2


def test_the_scale_is_the_ieee_quotient_where_a_reciprocal_product_is_one_ulp_off():
    """PyTorch on a GPU multiplies by 1/qmax where a Python number divides (seen on an H200: every CUDA kernel
    failed a reference that did so): the semantics divide by a tensor, whose quotient numpy's IEEE division
    gives on any device."""
    amax = np.random.default_rng(3).uniform(1e-3, 1e3, 4096).astype(np.float32)
    ieee = amax / np.float32(127)
    by_reciprocal = amax * (np.float32(1) / np.float32(127))
    assert (ieee != by_reciprocal).mean() > 0.02  # these rows (about 5%) tell the two apart
    x = torch.from_numpy(np.stack([amax, -amax / 3], axis=1))
    _, s = quantize_rows(x)
    assert np.array_equal(s.numpy(), ieee)


def test_seven_bit_range_scales_by_63_and_clamps_there():
    """qmax=63 (FBGEMM's reduce_range): scale = max|x| / 63, q in [-63, 63], still half to even."""
    x = torch.tensor([[63.0, 2.5, 3.5, -2.5, -62.5, 0.5, -63.0, 1.5]])
    q, s = qr.reference(qr.Workload(rows=1, cols=8, qmax=63), x)
    assert s.tolist() == [1.0] and q[0].tolist() == [63, 2, 4, -2, -62, 0, -63, 2]
    x = half_boundaries(64, 40, 0, random_scales=True, qmax=63)
    q, s = quantize_rows(x, 63)  # the eager semantics (the op's PyTorch implementation) as the reference
    assert torch.equal(q, qr.reference(qr.Workload(rows=64, cols=40, qmax=63), x)[0])
    assert int(q.abs().max()) == 63 and torch.equal(s, x.abs().amax(1) / 63)


@pytest.mark.parametrize("qmax", [0, -63, 128, 255, True, 63.0, "63", None])
def test_workload_refuses_a_range_int8_cannot_hold(qmax):
    with pytest.raises(WorkloadError, match="qmax"):
        qr.Workload(rows=4, cols=8, qmax=qmax)


def test_workload_takes_the_range_from_shape_text_and_json():
    assert qr.Workload.from_shape("rows=4,cols=8").qmax == 127
    w = qr.Workload.from_shape("rows=4,cols=8,qmax=63")
    assert w == qr.Workload(4, 8, 63) and qr.Workload.from_json(w.to_json()) == w
    assert qr.Workload.from_json({"rows": 4, "cols": 8}).qmax == 127  # records written before the field
    assert qr.Workload(4, 8, 2).qmax == 2  # any symmetric int8 range but ternary (see QMIN)
    with pytest.raises(WorkloadError, match=r"qmax must be in \[2, 127\]"):
        qr.Workload.from_shape("rows=4,cols=8,qmax=128")


# ---- CPU kernels ------------------------------------------------------------------------------------------------
# Every knob value at least once over the three shapes (a config also leaves some knobs at the default).
SHAPES = {
    "ragged": (dict(rows=9, cols=37), [dict(threading="serial", lanes=16, max_chains=1, quant_unroll=1),
                                       dict(rows_per_task=1, lanes=4, max_chains=8, quant_unroll=1)]),
    "narrow": (dict(rows=5, cols=3), [dict(lanes=4, max_chains=1, rows_per_task=2)]),  # all scalar tail
    "whole-vectors": (dict(rows=6, cols=64), [dict(rows_per_task=128, max_chains=4, quant_unroll=4),
                                              dict(lanes=16, rows_per_task=4, quant_unroll=1),
                                              dict(rows_per_task=8), dict(rows_per_task=32), dict(rows_per_task=64)]),
    "7-bit": (dict(rows=9, cols=37, qmax=63), [dict(lanes=4, quant_unroll=1)]),  # vectors and tail clamp at 63
    # bfloat16 rows (a DCN's cross state) widened as read, vectors and tail, smoothed too
    "bfloat16": (dict(rows=9, cols=37, dtype="bfloat16"), [dict(lanes=16, max_chains=1, quant_unroll=1)]),
    "bfloat16-smoothed": (dict(rows=6, cols=64, dtype="bfloat16", smooth=True), []),
}


@pytest.mark.parametrize("shape, changes", SHAPES.values(), ids=SHAPES.keys())
def test_cpu_kernels_are_bit_exact_for_every_knob_value(shape, changes):
    task = make_task("quantize_rows", "cpu", **shape)
    default = task.space.default().to_json()
    configs = [task.space.default(), *(task.space.make({**default, **change}) for change in changes)]
    cases = list(BINDING.cases(task.workload, 3, 2))
    for cfg in configs:
        func = compile_module(task, cfg)["main"]
        for name, (x,), kwargs in cases:
            args, out = qr.kernel_args(task.workload, cfg, (), x, kwargs.get("smooth"))
            func(*args)
            exact(out, qr.reference(task.workload, x, kwargs.get("smooth")), f"{cfg} {name}")


def test_the_configs_above_cover_every_cpu_knob_value(host):
    seen: dict[str, set] = {}
    for shape, changes in SHAPES.values():
        sp = qr.space(qr.Workload(**shape), host.target())
        for cfg in [sp.default(), *(sp.make({**sp.default().to_json(), **c}) for c in changes)]:
            for name, value in cfg.to_json().items():
                seen.setdefault(name, set()).add(value)
    for knob in (cpu.THREADING, cpu.ROWS_PER_TASK, cpu.LANES, cpu.MAX_CHAINS, cpu.QUANT_UNROLL):
        assert seen[knob.name] == set(knob.options), knob.name


def test_cpu_space_follows_the_row_width_and_lower_refuses_bad_configs(host):
    knobs = {k.name: set(k.values) for k in qr.space(qr.Workload(rows=4, cols=3), host.target()).knobs}
    assert knobs["lanes"] == {4}  # wider vectors would leave every column to the scalar tail
    sp = qr.space(qr.Workload(rows=4, cols=40), host.target())
    good = sp.default().to_json()
    with pytest.raises(InvalidConfig, match="divide"):
        sp.make({**good, "lanes": 16, "quant_unroll": 4})  # 40 // 16 = 2 vectors
    with pytest.raises(InvalidConfig, match="rows_per_task"):
        sp.make({**good, "threading": "serial", "rows_per_task": 4})
    raw = Config(tuple({**good, "lanes": 16, "quant_unroll": 4}.items()))
    with pytest.raises(InvalidConfig, match="quant_unroll"):
        qr.lower(qr.Workload(rows=4, cols=40), raw, host.target())


def test_cpu_kernel_takes_fma_quotients_and_vectorises(host):
    """The quotient is the row's reciprocal and two FMAs (quotient.py: a division's bits without vdivps) and
    rounding vectorises in TVM: a scalarized quantizing loop comes back from LLVM's loop vectorizer as strided
    shuffles (2-3x slower)."""
    import tvm

    if "fma" not in cpu_flags():  # the CPU's own flags: the assembly under test must not decide the skip
        pytest.skip(f"no FMA on {host.name}")
    w = qr.Workload(rows=16, cols=64)
    mod = cpu.lower(w, cpu.space(w, host.target()).default(), host.target())
    asm = tvm.compile(mod, target=host.target()).mod.inspect_source("asm")
    assert "vdivps" not in asm and "vfnmadd" in asm, "the quantizing loop divides"
    assert "vroundps" in asm or "vrndscaleps" in asm
    assert "vrcpps" not in asm and "vrcp14ps" not in asm  # an approximate reciprocal is not the IEEE quotient
    assert "vunpcklps" not in asm and "vshufps" not in asm, "strided shuffles: TVM scalarized the rounding"


def _quotient_kernel(host, correct: bool = True):
    """x / s element-wise through quotient.exact_quotient (r = 1 / s per element), or x * r if not `correct`."""
    import tvm
    from tvm import te

    from search_spaces.quantize_rows.quotient import exact_quotient

    n = te.var("n")
    x, s = te.placeholder((n,), "float32", name="x"), te.placeholder((n,), "float32", name="s")
    r = te.compute((n,), lambda i: tvm.tirx.const(1.0, "float32") / s[i], name="r")
    q = te.compute((n,), lambda i: exact_quotient(x[i], s[i], r[i]) if correct else x[i] * r[i], name="q")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, s, q]))
    sch.vectorize(sch.split(sch.get_loops(sch.get_sblock("q"))[0], [None, 16])[1])
    return tvm.compile(sch.mod, target=host.target())


def test_fma_quotient_is_the_ieee_division_bit_for_bit(host):
    """Quotients of the magnitudes quantizing meets (|x / s| up to 255, scales from 1e-12 / 255 to 1e30), values
    a hair from .5 boundaries, tiny x, random bit patterns: the FMA quotient equals numpy's division everywhere
    the rounded result can depend on it, while the plain reciprocal product misses thousands of them."""
    import tvm

    rng = np.random.default_rng(0)
    n = 1 << 21
    s = (10.0 ** rng.uniform(-14, 30, n)).astype(np.float32)
    x = (rng.uniform(-255, 255, n) * s).astype(np.float32)
    k = rng.integers(-255, 255, n // 4) + 0.5  # .5 boundaries and their float32 neighbours
    x[: n // 4] = np.nextafter((k * s[: n // 4]).astype(np.float32), rng.choice([-np.inf, np.inf], n // 4))
    x[n // 4: n // 4 + 1000] = rng.uniform(-1, 1, 1000).astype(np.float32) * np.float32(1e-38)  # subnormal range
    bits = rng.integers(0, 2**32, n // 4, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x[-n // 4:] = np.where(np.isfinite(bits) & (np.abs(bits) < 1e30), bits, 1.0)
    want = x / s
    finite = np.isfinite(want)
    got, crude = (np.empty(n, np.float32) for _ in range(2))
    for out, correct in ((got, True), (crude, False)):
        res = tvm.runtime.tensor(out)
        _quotient_kernel(host, correct)(tvm.runtime.tensor(x), tvm.runtime.tensor(s), res)
        out[:] = res.numpy()
    # below |x / s| = 2^-50 a subnormal remainder may move the last bit; such quotients round to 0 either way
    significant = finite & (np.abs(want) >= 2.0**-50)
    assert np.array_equal(got[significant], want[significant])
    assert np.array_equal(np.rint(got[finite]), np.rint(want[finite]))
    assert (crude[significant] != want[significant]).sum() > 1000  # the inputs tell a reciprocal product apart


# ---- the torch op -------------------------------------------------------------------------------------------
KERNELS = [("quantize_rows", dict(rows=8, cols=32)), ("quantize_rows", dict(rows=8, cols=32, qmax=63)),
           ("quantize_rows", dict(rows=8, cols=32, smooth=True)), ("quantize_rows", dict(rows=8, cols=32, dtype="bfloat16")),
           ("qmatmul", dict(m=8, k=32, n=16))]
W = qr.Workload(rows=8, cols=32)  # the op's cases: several batches, a zero row, extremes, .5 boundaries
W7 = qr.Workload(rows=8, cols=32, qmax=63)  # the same width, 7-bit: a kernel of its own


@pytest.fixture(scope="module")
def package(tmp_path_factory, cpu_builder):
    out = tmp_path_factory.mktemp("qr-pkg")
    tasks = [make_task(op, "cpu", **fields) for op, fields in KERNELS]
    export([t.record(t.space.default(), costs=(1e-5,)) for t in tasks], out, builder=cpu_builder)
    return out


@pytest.fixture()
def pkg(package):
    yield load_counting(package)
    at.unload_all()


def calls(pkg, op, **fields):
    return sum(k.calls for k in pkg.kernels if k.op == op and all(getattr(k.workload, f) == v
                                                                   for f, v in fields.items()))


def test_torch_op_runs_the_kernel_on_every_case_bit_exact(pkg):
    cases = inputs_of_every_case(W)
    with warnings.catch_warnings():
        warnings.simplefilter("error", at.NoTunedKernelWarning)
        for name, x in cases:
            exact(QR(x), qr.reference(W, x), name)
            exact(QR(x, validate=False), qr.reference(W, x), name + " (validate=False)")
    assert calls(pkg, "quantize_rows", qmax=127) == 2 * len(cases) and calls(pkg, "quantize_rows", qmax=63) == 0
    q, s = QR(torch.empty(7, 32, device="meta"))  # the fake: shapes and dtypes without data
    assert (q.shape, q.dtype, s.shape, s.dtype) == ((7, 32), torch.int8, (7,), torch.float32)


def test_torch_op_refuses_bad_tensors_and_falls_back_on_strided_ones(pkg):
    with pytest.raises(InvalidDtype, match="float32"):
        QR(torch.randn(4, 32, dtype=torch.float64))
    with pytest.raises(InvalidInput, match="2-D"):
        QR(torch.randn(32))
    strided = torch.randn(32, 4).t()
    with pytest.raises(InvalidInput, match="contiguous"):
        QR(strided)
    with pytest.warns(at.NoTunedKernelWarning, match="strided"):  # unvalidated: PyTorch's path, still right
        exact(QR(strided, validate=False), qr.reference(W, strided))
    with pytest.warns(at.NoTunedKernelWarning, match="cols=5"):
        QR(torch.randn(3, 5))
    for qmax in (0, -1, 128):
        with pytest.raises(InvalidInput, match=rf"qmax must be in \[2, 127\].*got {qmax}"):
            QR(torch.randn(4, 32), qmax)
    # the call as it was before qmax came second: validate=True lands on qmax as 1, and is refused, not ternary
    with pytest.raises(InvalidInput, match="got 1 .the second argument is qmax now: pass validate= by keyword"):
        QR(torch.randn(4, 32), True)
    assert calls(pkg, "quantize_rows") == 0


def test_torch_op_routes_each_range_to_its_own_kernel(pkg):
    """The case tuples carry the workload's qmax (what `autotune check` calls the op with): a 7-bit call runs
    the 7-bit kernel, never the full-range one of the same width, positionally or by keyword."""
    cases = list(BINDING.cases(W7, 3, 2))
    assert all(kwargs == {"qmax": 63} for _, _, kwargs in cases)
    assert all(BINDING.route(*args, **kwargs).signature == BINDING.compiled(W7) == (32, 63, False, "float32")
               for _, args, kwargs in cases)
    with warnings.catch_warnings():
        warnings.simplefilter("error", at.NoTunedKernelWarning)
        for name, (x,), kwargs in cases:
            exact(QR(x, **kwargs), qr.reference(W7, x), name)
            exact(QR(x, 63, None, False), qr.reference(W7, x), name + " (positional, validate=False)")
    assert calls(pkg, "quantize_rows", qmax=63) == 2 * len(cases) and calls(pkg, "quantize_rows", qmax=127) == 0
    at.ops._WARNED.clear()  # (warned once per process)
    with pytest.warns(at.NoTunedKernelWarning, match="cols=32 qmax=31"):  # no kernel of that range: PyTorch
        exact(QR(cases[0][1][0], 31), qr.reference(qr.Workload(8, 32, 31), cases[0][1][0]))
    assert calls(pkg, "quantize_rows") == 2 * len(cases)


def test_smoothing_factors_are_multiplied_in_the_same_pass_as_pytorch_multiplies_them(pkg):
    """`smooth`: the kernel compiled for it quantizes x * smooth bit for bit as the multiply and the quantize
    apart do (every case: .5 boundaries of the product included), and only it serves such calls."""
    ws = qr.Workload(rows=8, cols=32, smooth=True)
    cases = list(BINDING.cases(ws, 3, 2))
    factors = cases[0][2]["smooth"]
    assert all(kwargs["smooth"] is factors for _, _, kwargs in cases)
    boundary = half_boundaries(8, 32, 5) / factors  # x * smooth lands next to .5 boundaries
    with warnings.catch_warnings():
        warnings.simplefilter("error", at.NoTunedKernelWarning)
        for name, (x,), kwargs in [*cases, ("boundaries", (boundary.contiguous(),), {"smooth": factors})]:
            got = QR(x, **kwargs)
            exact(got, qr.reference(ws, x, factors), name)
            exact(got, quantize_rows(x * factors), name + " (the multiply apart)")
    assert calls(pkg, "quantize_rows", smooth=True) == len(cases) + 1
    assert calls(pkg, "quantize_rows", smooth=False) == 0
    x = cases[0][1][0]
    for bad, match, kind in ((factors[:-1], r"one factor per column, shape \(32,\), got \(31,\)", InvalidInput),
                             (factors.double(), "float32", InvalidDtype),
                             (torch.ones(64)[::2], "contiguous", InvalidInput)):
        with pytest.raises(kind, match=match):
            QR(x, smooth=bad)
    with pytest.raises(InvalidInput, match="takes no smoothing"):
        qr.check_inputs(W, x, factors)
    with pytest.raises(InvalidConfig, match="CPUs only"):
        cuda.space(ws, None)


def test_bfloat16_rows_run_their_own_kernel_and_quantize_as_their_float32_widening(pkg):
    """bfloat16 x (a DCN's cross state): its kernel, and no other, serves it, bit for bit the quantization of
    `x.float()`; the float32 kernel of the same width keeps float32 calls; GPUs and other 16-bit types refused."""
    wb = qr.Workload(rows=8, cols=32, dtype="bfloat16")
    cases = list(BINDING.cases(wb, 3, 2))
    assert all(args[0].dtype == torch.bfloat16 for _, args, _ in cases)
    with warnings.catch_warnings():
        warnings.simplefilter("error", at.NoTunedKernelWarning)
        for name, (x,), kwargs in cases:
            exact(QR(x, **kwargs), quantize_rows(x.float()), name)
        exact(QR(cases[0][1][0].float()), quantize_rows(cases[0][1][0].float()), "float32")
    assert calls(pkg, "quantize_rows", dtype="bfloat16") == len(cases)
    assert calls(pkg, "quantize_rows", dtype="float32") == 1
    with pytest.raises(InvalidDtype, match="float32 .or bfloat16 on a CPU., got torch.float16"):
        QR(torch.randn(4, 32, dtype=torch.float16))
    with pytest.raises(InvalidDtype, match="reads bfloat16 rows, got torch.float32"):
        qr.check_inputs(wb, torch.randn(4, 32))
    with pytest.raises(InvalidConfig, match="CPUs only"):
        cuda.space(wb, None)
    with pytest.raises(WorkloadError, match="dtype must be one of float32, bfloat16"):
        qr.Workload(rows=8, cols=32, dtype="float16")
    assert "dtype" not in W.key() and '"dtype":"bfloat16"' in wb.key()  # older records keep their keys


def test_torch_op_takes_the_range_on_the_pytorch_fallback():
    """No kernel loaded: PyTorch's implementation quantizes to the requested range, eager, compiled and under
    opcheck (the schema's `int qmax=127`)."""
    at.unload_all()
    x = half_boundaries(6, 40, 1, random_scales=True, qmax=63)
    want = qr.reference(qr.Workload(6, 40, 63), x)
    at.ops._WARNED.clear()  # (warned once per process)
    with pytest.warns(at.NoTunedKernelWarning, match="cols=40 qmax=63"):
        exact(QR(x, 63), want, "eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", at.NoTunedKernelWarning)
        exact(QR(x, qmax=63), want, "keyword")
        exact(QR(x), qr.reference(qr.Workload(6, 40), x), "default range")
        exact(torch.compile(lambda t: QR(t, 63), fullgraph=True)(x), want, "compiled")
        torch.library.opcheck(QR.default, (x, 63))
    with pytest.raises(InvalidInput, match=r"qmax must be in \[2, 127\]"):
        QR(x, 200)


def test_quant_linear_quantizes_its_input_in_the_kernel(pkg):
    linear = nn.Linear(32, 16)
    layer = at.QuantLinear.from_float(linear)
    x = torch.randn(2, 4, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", at.NoTunedKernelWarning)
        y = layer(x)
    assert calls(pkg, "quantize_rows") == 1 and calls(pkg, "qmatmul") == 1
    a, s = at.quantize_rows(x.reshape(8, 32))  # the eager semantics, still exported
    want = (a.double() @ layer.weight.double().t()).float() * s[:, None] * layer.w_scale + layer.bias
    torch.testing.assert_close(y.reshape(8, 16), want, rtol=1e-5, atol=1e-5)


def test_the_rule_that_judges_kernels_takes_every_tensor_of_a_tuple_output_exactly():
    """`runtime.judge`, as `autotune check` and the tuner use it: quantize_rows is judged by the native rule
    with tolerance zero, each of its two outputs."""
    from autotune.runtime import Judgement, expected, judge

    x = half_boundaries(4, 32, 0, random_scales=True)
    exact = expected(qr, W, x)
    q, s = exact.pytorch
    assert exact.float64 is None and judge((q, s), exact) == Judgement(0.0, 0.0)
    off = q.clone()
    off[2, 5] += 1
    assert "output 0: error 1 at flat index 69" in judge((off, s), exact).why
    assert "output 1" in judge((q, s * 2), exact).why
    assert "not a tuple of 2 tensors" in judge(q, exact).why


# ---- CUDA ---------------------------------------------------------------------------------------------------
# No GPU here: kernels are built with nvcc (limits checked by ptxas) and their CUDA C is emulated on the CPU.
@pytest.mark.parametrize("arch", ARCHS)
def test_gpu_default_and_sampled_configs_build_within_limits(gpu_builder, arch):
    task, built = build_sample(gpu_builder, "quantize_rows", arch, n=2, seed=7, rows=64, cols=512)
    assert_built_within_limits(task, built)


def test_gpu_space_follows_the_row_width():
    narrow = {k.name: set(k.values) for k in make_task("quantize_rows", "cuda:sm_90", rows=4, cols=20).space.knobs}
    assert narrow["threads"] == {32}
    for cfg in make_task("quantize_rows", "cuda:sm_90", rows=64, cols=4096).space:
        assert cfg[cuda.THREADS] * cfg[cuda.ROWS_PER_BLOCK] <= cuda.MAX_THREADS


def _emulated(task, cfg, x):
    src = cuda_source(task, cfg)
    head = src.index('extern "C" __global__')  # the kernel's declaration; the emulator's prelude lacks nearbyintf
    at_ = src.index(";", head) + 1
    src = src[:at_] + '\nextern "C" float nearbyintf(float);\n' + src[at_:]
    rows, rpb = x.shape[0], cfg[cuda.ROWS_PER_BLOCK]
    q, s = torch.full(x.shape, 99, dtype=torch.int8), torch.full((rows,), float("nan"))
    emulate_cuda(src, (-(-rows // rpb),), (cfg[cuda.THREADS], rpb), dict(x=x, q=q, scale=s, B=rows))
    return q, s


@needs_gxx
@pytest.mark.parametrize("change", [{}, dict(threads=64), dict(rows_per_block=4), dict(threads=64, rows_per_block=2)],
                         ids=["warp-per-row", "two-warps", "4-rows-a-block", "two-warps-2-rows"])
def test_cuda_kernels_are_bit_exact_when_emulated(change):
    """One warp (shuffles only) or two (shared memory between them) per row, one or several rows a block, with
    a batch that leaves the last block part empty."""
    task = make_task("quantize_rows", "cuda:sm_90", rows=9, cols=37)
    cfg = task.space.make({**task.space.default().to_json(), **change})
    for rows, x in [(7, half_boundaries(7, 37, 1, random_scales=True)), (5, qr.inputs(qr.Workload(5, 37), 2)[0])]:
        x[rows - 1] = 0.0  # a zero row: the clamp
        exact(_emulated(task, cfg, x), qr.reference(task.workload, x), f"{cfg} rows={rows}")


@needs_gxx
def test_cuda_kernel_quantizes_to_the_workloads_range_when_emulated():
    task = make_task("quantize_rows", "cuda:sm_90", rows=9, cols=37, qmax=63)
    cfg = task.space.make({**task.space.default().to_json(), "rows_per_block": 2})
    x = half_boundaries(7, 37, 2, random_scales=True, qmax=63)
    q, s = _emulated(task, cfg, x)
    exact((q, s), qr.reference(task.workload, x), f"{cfg} qmax=63")
    assert int(q.abs().max()) == 63
