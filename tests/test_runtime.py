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


def test_mismatch_names_shape_and_value_differences():
    assert runtime.mismatch(torch.ones(3), torch.ones(3), 0, 0) is None
    assert "shape" in runtime.mismatch(torch.ones(2), torch.ones(3), 0, 0)
    assert "max abs error 2" in runtime.mismatch(torch.zeros(3), torch.full((3,), 2.0), 0, 0.5)


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
