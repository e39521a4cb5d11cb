"""The compiler-free runtime: the one measurement core (BoundKernel, check_and_time) every runner uses."""

import os
import weakref

import pytest
import torch

from autotune import runtime
from autotune.build import compile_module
from autotune.task import make_task


def test_check_and_time_accepts_correct_kernels_and_flags_wrong_ones():
    task = make_task("templates.faulty", "cpu", shape="n=64")
    data = runtime.TaskData(task.template, task.workload, 0, "cpu")
    timing = runtime.Timing(number=2, repeat=3, min_repeat_ms=1)
    outcomes = {}
    for cfg in task.space:
        fault = cfg.as_dict()["fault"]
        if fault in ("none", "wrong"):
            bound = data.bind(cfg, compile_module(task, cfg)["main"])
            outcomes[fault] = runtime.check_and_time(data, bound, timing)
    costs, kind, _ = outcomes["none"]
    assert kind is None and len(costs) == 3 and all(c > 0 for c in costs)
    assert outcomes["wrong"][:2] == ((), "wrong")


def test_check_and_time_times_exactly_the_bound_call(monkeypatch):
    """What is timed is `bound(*inputs)`, the user's call: a slower call path is a slower record. The clock is
    a fake that only the bound call moves (by its `tick`), so each cost is exactly one call's tick: nothing
    else is inside the timer, and the count divides it right, however busy the machine is."""
    task = make_task("templates.faulty", "cpu", shape="n=64")
    cfg = next(c for c in task.space if c.as_dict()["fault"] == "none")
    data = runtime.TaskData(task.template, task.workload, 0, "cpu")
    func = compile_module(task, cfg)["main"]
    timing = runtime.Timing(number=1, repeat=3, min_repeat_ms=5)
    clock = _Clock()
    monkeypatch.setattr(runtime, "time", clock)

    class Ticking(runtime.BoundKernel):
        tick, calls = 0.0, 0

        def __call__(self, *tensors):
            Ticking.calls += 1
            clock.now += Ticking.tick
            return super().__call__(*tensors)

    costs = {}
    for tick in (1e-5, 2e-4):
        Ticking.tick, Ticking.calls = tick, 0
        costs[tick], kind, _ = runtime.check_and_time(data, Ticking(task.template, task.workload, cfg, func, False),
                                                      timing)
        assert kind is None and costs[tick] == pytest.approx((tick,) * 3)
        assert Ticking.calls >= 1 + 4 * round(5e-3 / tick)  # the check, a warm-up and 3 repeats of 5 ms each
    assert min(costs[2e-4]) > max(costs[1e-5])


class _Clock:
    """A fake `time` module for runtime: `perf_counter()` reads `now`, which only the test moves."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def test_timed_calls_cycle_through_the_templates_input_sets():
    """An embedding bag is checked on its inputs, then timed on every set of fresh bags in turn (on one set its
    gathered rows would stay in cache: a third of the time, on one VM)."""
    task = make_task("embedding_bag", "cpu", shape="rows=50,dim=24,batch=13,pooling=0-7")
    data = runtime.TaskData(task.template, task.workload, 0, "cpu")
    assert len(data.sets) > 1 and all(a is b for a, b in zip(data.sets[0], data.inputs))
    cfg = task.space.default()
    seen = []

    class Recording(runtime.BoundKernel):
        def __call__(self, *tensors):
            seen.append(id(tensors[1]))
            return super().__call__(*tensors)

    bound = Recording(task.template, task.workload, cfg, compile_module(task, cfg)["main"], False)
    costs, kind, _ = runtime.check_and_time(data, bound, runtime.Timing(number=1, repeat=3, min_repeat_ms=5))
    assert kind is None and seen[0] == id(data.inputs[1])
    assert set(seen[1:]) == {id(s[1]) for s in data.sets}
    order = [id(s[1]) for s in data.sets]
    start = order.index(seen[1])
    assert seen[1:len(order) + 1] == order[start:] + order[:start]  # round robin, one set a call


def test_input_sets_are_the_inputs_alone_without_the_hook_or_on_a_gpu_and_must_start_with_them():
    import types

    inputs = (torch.zeros(3), torch.ones(2))
    plain = types.SimpleNamespace(__name__="plain")
    assert runtime.input_sets(plain, None, 0, inputs, "cpu") == (inputs,)
    fresh = types.SimpleNamespace(__name__="fresh", timed_inputs=lambda w, seed, x, cache: (x, (x[0], x[1] + 1)))
    assert len(runtime.input_sets(fresh, None, 0, inputs, "cpu")) == 2
    assert runtime.input_sets(fresh, None, 0, inputs, "cuda:0") == (inputs,)  # L2 is flushed there instead
    dropped = types.SimpleNamespace(__name__="dropped", timed_inputs=lambda w, seed, x, cache: ((x[0], x[1] + 1),))
    with pytest.raises(ValueError, match="dropped.timed_inputs must return the inputs"):
        runtime.input_sets(dropped, None, 0, inputs, "cpu")
    one = lambda: 1  # noqa: E731
    assert runtime.cycling([one]) is one
    turns = runtime.cycling([lambda: "a", lambda: "b"])
    assert [turns() for _ in range(5)] == ["a", "b", "a", "b", "a"]
    assert runtime.cpu_cache_bytes() > 0


def test_a_kernel_that_raises_is_a_runtime_error_and_a_bad_library_too(tmp_path):
    task = make_task("templates.faulty", "cpu", shape="n=8")
    data = runtime.TaskData(task.template, task.workload, 0, "cpu")

    def broken(*args):
        raise ValueError("boom")

    costs, kind, msg = runtime.check_and_time(data, data.bind(task.space.default(), broken), runtime.Timing())
    assert (costs, kind) == ((), "runtime") and "boom" in msg
    (tmp_path / "bad.so").write_text("not a library")
    costs, kind, msg = runtime.measure_file(data, task.space.default(), str(tmp_path / "bad.so"), runtime.Timing())
    assert (costs, kind) == ((), "runtime") and msg


class _Packing:
    """A template whose one weight (argument 0) is 'packed' by doubling; records each packing."""

    __name__ = "packing"
    WEIGHTS = (0,)

    def __init__(self):
        self.packed = []

    def pack(self, w, cfg, weight):
        self.packed.append(tuple(weight.shape))  # not the tensor: the cache must not be what keeps it alive
        return (weight * 2,)

    def kernel_args(self, w, cfg, packed, weight, x):
        out = torch.empty_like(x)
        return [packed[0], x, out], out


def _add(p, x, out):
    torch.add(p, x, out=out)


def test_bound_kernel_packs_once_per_weight_and_again_when_it_changes():
    tpl = _Packing()
    bound = runtime.BoundKernel(tpl, None, None, _add, on_gpu=False)
    weight, x = torch.ones(4), torch.zeros(4)
    assert torch.equal(bound(weight, x), torch.full((4,), 2.0))
    bound(weight, x)
    assert len(tpl.packed) == 1  # same weight: packed once
    weight.mul_(3)  # an in-place update bumps the version counter
    assert torch.equal(bound(weight, x), torch.full((4,), 6.0)) and len(tpl.packed) == 2
    other = torch.ones(4)
    assert torch.equal(bound(other, x), torch.full((4,), 2.0)) and len(tpl.packed) == 3
    with torch.inference_mode():  # no version counter: keyed as -1
        frozen = torch.ones(4)
        bound(frozen, x)
        bound(frozen, x)
    assert len(tpl.packed) == 4


def test_a_new_weight_at_a_freed_address_is_packed_anew():
    """A new tensor with the old one's address, version, shape and dtype (here: a second view of one buffer,
    as a reused allocation would be) is packed again once the packed tensor is gone."""
    tpl = _Packing()
    bound = runtime.BoundKernel(tpl, None, None, _add, on_gpu=False)
    buf, x = torch.ones(4), torch.zeros(4)
    weight = buf.view(4)
    bound(weight, x)
    bound(weight, x)
    gone = weakref.ref(weight)
    del weight
    assert gone() is None and len(tpl.packed) == 1
    again = buf.view(4)
    assert again.data_ptr() == buf.data_ptr() and again._version == buf._version
    bound(again, x)
    assert len(tpl.packed) == 2


def test_time_cpu_lengthens_repeats_to_the_minimum_duration(monkeypatch):
    """A call of 10 us (on a fake clock) needs 500 calls to last a repeat of 5 ms: the warm-up and each repeat."""
    clock = _Clock()
    monkeypatch.setattr(runtime, "time", clock)
    calls = []

    def call():
        calls.append(1)
        clock.now += 1e-5

    costs = runtime.time_cpu(call, runtime.Timing(number=1, repeat=2, min_repeat_ms=5))
    assert costs == pytest.approx([1e-5, 1e-5]) and len(calls) >= 3 * 500


class _SwingingMachine:
    """A fake clock whose machine runs 3x slower in every other half second: a shared VM's slow phases."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def kernel(self, seconds: float):
        def run():
            self.now += seconds * (3.0 if int(self.now / 0.5) % 2 else 1.0)
        return run


def test_anchored_timing_cancels_the_machines_slow_phases(monkeypatch):
    machine = _SwingingMachine()
    monkeypatch.setattr(runtime, "time", machine)
    timing = runtime.Timing(number=1, repeat=40, min_repeat_ms=20)
    raw = runtime.time_cpu(machine.kernel(1e-3), timing)
    assert max(raw) / min(raw) > 2.5  # the phases, as time_cpu sees them
    anchor = runtime.Anchor(machine.kernel(2e-3)).calibrate(timing)
    assert anchor.nominal in (pytest.approx(2e-3), pytest.approx(6e-3))  # of a fast or a slow phase
    anchored = runtime.time_anchored(machine.kernel(1e-3), anchor, timing)
    assert len(anchored) == 40
    # half the anchor's nominal latency whatever the phase, but for repeats a phase change cut through
    inside = [c for c in anchored if c == pytest.approx(anchor.nominal / 2)]
    assert len(inside) >= 30 and sorted(anchored)[20] == pytest.approx(anchor.nominal / 2)


def test_check_and_time_times_anchored_only_with_an_anchor():
    task = make_task("templates.faulty", "cpu", shape="n=64")
    data = runtime.TaskData(task.template, task.workload, 0, "cpu")
    cfg = task.space.default()
    bound = data.bind(cfg, compile_module(task, cfg)["main"])
    timing = runtime.Timing(number=1, repeat=3, min_repeat_ms=1, anchor=True)
    with pytest.raises(RuntimeError, match="no anchor kernel"):
        runtime.check_and_time(data, bound, timing)
    calls = []
    data.anchor = runtime.Anchor(lambda: calls.append(1)).calibrate(timing, repeats=3)
    n = len(calls)
    costs, kind, _ = runtime.check_and_time(data, bound, timing)
    assert kind is None and len(costs) == 3 and all(c > 0 for c in costs) and len(calls) > n  # anchor ran too


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_time_cuda_flushes_l2_before_every_call_and_excludes_the_flush():
    """A call that does nothing on the GPU costs ~nothing although each is preceded by a flush of 2x L2."""
    l2 = runtime.l2_bytes_here()
    costs = runtime.time_cuda(lambda: None, runtime.Timing(number=3, repeat=5, min_repeat_ms=1), l2)
    x = torch.randn(1 << 24, device="cuda")
    work = runtime.time_cuda(lambda: x.mul_(1.0), runtime.Timing(number=3, repeat=5, min_repeat_ms=1), l2)
    assert len(costs) == 5 and max(costs) < 2e-5 < min(work)


def test_mismatch_names_shape_dtype_and_value_differences():
    exact = runtime.Expected(torch.ones(3), 0, 0)
    assert runtime.mismatch(torch.ones(3), exact) is None
    assert "shape" in runtime.mismatch(torch.ones(2), exact)
    assert "dtype torch.float64" in runtime.mismatch(torch.ones(3, dtype=torch.float64), exact)
    why = runtime.mismatch(torch.zeros(3), runtime.Expected(torch.full((3,), 2.0), 0, 0.5))
    assert "max abs error 2" in why and "kernel 0, PyTorch 2" in why and "bound 0.5" in why


def test_the_native_rule_is_isclose_with_nans_and_infinities_where_pytorch_has_them():
    inf, nan = float("inf"), float("nan")
    ref = torch.tensor([1.0, inf, nan, 100.0])
    exp = runtime.Expected(ref, 0.01, 0.0)
    assert runtime.judge(torch.tensor([1.0, inf, nan, 101.0]), exp).ratio == pytest.approx(1.0)
    for wrong in ([1.0, -inf, nan, 100.0], [1.0, inf, 0.0, 100.0], [nan, inf, nan, 100.0], [1.0, inf, nan, 102.0]):
        assert runtime.judge(torch.tensor(wrong), exp).why is not None, wrong


def _cancelling_dots(n: int = 64, scale: float = 1e3):
    """Dot products of terms of size scale**2 that cancel to about 1e-3 of that, and PyTorch's fp32 result."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(32, n, generator=gen) * scale
    b = torch.stack([a[:, 1::2], -a[:, 0::2]], dim=-1).flatten(1) + 1e-3 * scale * torch.randn(32, n, generator=gen)

    def dot(a, b):
        return (a * b).sum(-1)

    return dot, a, b, dot(a, b)


def test_the_float64_rule_bounds_error_by_the_terms_so_cancellation_fails_no_good_result():
    dot, a, b, fp32 = _cancelling_dots()
    f64 = runtime.float64_reference(dot, a, b)
    assert f64.value.dtype == torch.float64
    assert torch.equal(f64.magnitude, (a.double() * b.double()).abs().sum(-1))
    exp = runtime.Expected(fp32, 1e-4, 0.0, f64)
    good = runtime.judge(fp32, exp)  # fp32's own rounding, PyTorch's path as the kernel's
    assert good.why is None and good.ratio == good.pytorch_ratio < 0.1 and good.error == good.pytorch_error > 0
    relative_to_output = runtime.Expected(f64.value.float(), 1e-4, 0.0)  # the native rule's bound
    assert runtime.mismatch(fp32, relative_to_output) is not None
    off = fp32 + 3e-4 * f64.magnitude.float()  # off by 3e-4 of the terms: wrong, though small beside them
    why = runtime.mismatch(off, exp)
    assert why is not None and "float64" in why and "magnitude" in why and "PyTorch" in why


def test_float64_reference_casts_floating_tensors_only_through_containers():
    seen = []

    def fn(w, idx, rows, scale=None):
        seen.append((w.dtype, idx.dtype, [r.dtype for r in rows], scale.dtype))
        return w[idx] * scale + sum(rows)

    w, idx = torch.tensor([[-1.0, 2.0]]), torch.tensor([0, 0])
    f64 = runtime.float64_reference(fn, w, idx, [torch.tensor([-3.0, 1.0])], scale=torch.tensor(-2.0))
    assert seen[0] == (torch.float64, torch.int64, [torch.float64], torch.float64)
    assert torch.equal(f64.value, torch.tensor([[-1.0, -3.0]] * 2, dtype=torch.float64))
    assert torch.equal(f64.magnitude, torch.tensor([[5.0, 5.0]] * 2, dtype=torch.float64))


def test_judge_takes_each_output_of_a_tuple_with_its_own_tolerance():
    exp = runtime.Expected((torch.ones(2), torch.ones(2)), (0.0, 0.5), (0.0, 0.0))
    assert runtime.mismatch((torch.ones(2), torch.full((2,), 1.4)), exp) is None
    assert runtime.mismatch((torch.full((2,), 1.4), torch.ones(2)), exp).startswith("output 0: ")
    assert "tuple of 2" in runtime.mismatch(torch.ones(2), exp)


def test_a_float64_value_past_the_output_dtype_is_its_infinity():
    """fp32 overflows where float64 does not: a correctly rounded output is inf there, as PyTorch's."""
    big = torch.tensor([1e39], dtype=torch.float64)
    out = torch.tensor([float("inf")])
    exp = runtime.Expected(out.clone(), 1e-4, 0.0, runtime.Float64Reference(big, big))
    assert runtime.judge(out, exp).why is None
    assert runtime.judge(torch.tensor([3e38]), exp).why is not None


def test_reference_precision_is_native_unless_a_template_names_float64():
    import search_spaces

    assert runtime.reference_precision(object()) == "native"
    assert runtime.reference_precision(search_spaces.get("interaction")) == "float64"
    with pytest.raises(ValueError, match="REFERENCE_PRECISION"):
        runtime.reference_precision(type("T", (), {"REFERENCE_PRECISION": "float128"}))


def test_task_data_judges_against_float64_where_the_template_says():
    task = make_task("interaction", "cpu", batch=3, tables=2, dim=8)
    data = runtime.TaskData(task.template, task.workload, 0, "cpu")
    assert data.reference is data.expected.pytorch and data.expected.rtol == task.template.tolerance(task.workload)[0]
    assert data.expected.float64.value.dtype == torch.float64
    assert data.expected.float64.value.shape == data.reference.shape
    eb = make_task("embedding_bag", "cpu", rows=20, dim=4, batch=3, pooling=(0, 3))
    assert runtime.TaskData(eb.template, eb.workload, 0, "cpu").expected.float64 is None


def test_the_runtime_imports_nothing_of_autotune_or_tvm():
    import ast

    tree = ast.parse(open(runtime.__file__).read())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not [n for n in names if n.split(".")[0] in ("tvm", "autotune", "search_spaces")], names
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level > 0]


def test_compile_cached_builds_once_per_source_and_says_what_failed(tmp_path, monkeypatch):
    import ctypes
    import subprocess

    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path))
    cmd = [os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC"]
    one = runtime.compile_cached("probe", "int probe(void) { return 1; }", cmd)
    assert runtime.compile_cached("probe", "int probe(void) { return 1; }", cmd) == one  # cached, not rebuilt
    two = runtime.compile_cached("probe", "int probe(void) { return 2; }", cmd)  # another source: another library
    assert two != one and [ctypes.CDLL(p).probe() for p in (one, two)] == [1, 2]
    with pytest.raises(subprocess.SubprocessError, match="error"):
        runtime.compile_cached("broken", "int broken(void) { return }", cmd)
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in (one, two))  # no half-written file
