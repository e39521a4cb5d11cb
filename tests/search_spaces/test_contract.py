"""The contract every registered template satisfies: search_spaces/template.py's `Template` protocol.

Each test runs for every operator the registry discovers, so a new operator package is held to it without an
edit here. Operator-specific behaviour (modes, GPU schedules, emulated CUDA) is pinned in test_<op>.py.
"""

from __future__ import annotations

import random

import pytest
import torch

import search_spaces
from autotune.build import compile_module
from autotune.runtime import (FLOAT64, BoundKernel, expected, expected_call, judge, mismatch, nth_tolerance,
                              reference_precision)
from autotune.targets import resolve
from autotune.task import make_task
from search_spaces import InvalidConfig, Template, TorchBinding, Traffic, WorkloadError
from search_spaces.template import device_kinds

OPS = search_spaces.names()
MEMBERS = sorted({*Template.__annotations__, *(n for n in vars(Template) if not n.startswith("_"))})


def _task(op: str, device: str = "cpu"):
    tpl = search_spaces.get(op)
    return make_task(op, device, shape=tpl.TEST_SHAPE)


@pytest.mark.parametrize("op", OPS)
def test_template_provides_the_protocol(op):
    tpl = search_spaces.get(op)
    missing = [m for m in MEMBERS if not hasattr(tpl, m)]
    assert not missing, f"{op} lacks {missing}"
    assert tpl.NAME == op
    assert all(isinstance(i, int) for i in tpl.WEIGHTS)
    reference_precision(tpl)  # a known rule, or none (native)


@pytest.mark.parametrize("op", OPS)
def test_shapes_round_trip_through_text_and_json(op):
    tpl = search_spaces.get(op)
    for text in (tpl.EXAMPLE_SHAPE, tpl.TEST_SHAPE):
        w = tpl.Workload.from_shape(text)
        assert tpl.Workload.from_json(w.to_json()) == w
        assert tpl.Workload.from_json(w.to_json()).key() == w.key()


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("text", ["", "nonsense=1", "noequals", "=3"])
def test_bad_shape_text_is_a_workload_error(op, text):
    tpl = search_spaces.get(op)
    with pytest.raises(WorkloadError):
        tpl.Workload.from_shape(text if text != "nonsense=1" else f"{tpl.TEST_SHAPE},{text}")


@pytest.mark.parametrize("op", OPS)
def test_a_missing_field_is_a_workload_error(op):
    tpl = search_spaces.get(op)
    first = tpl.TEST_SHAPE.split(",")[0]
    with pytest.raises(WorkloadError, match="missing"):
        tpl.Workload.from_shape(tpl.TEST_SHAPE.replace(first, "").strip(","))


@pytest.mark.parametrize("op", OPS)
def test_default_and_sampled_configs_match_the_reference(op):
    task = _task(op)
    space = task.space
    rng = random.Random(7)
    configs = [space.default(), *(space.sample(rng) for _ in range(2))]
    inputs = task.template.inputs(task.workload, 1)
    exp = expected(task.template, task.workload, *inputs)
    for cfg in dict.fromkeys(configs):
        func = compile_module(task, cfg)["main"]
        out = BoundKernel(task.template, task.workload, cfg, func, on_gpu=False)(*inputs)
        assert mismatch(out, exp) is None, f"{op} {cfg}: {mismatch(out, exp)}"


@pytest.mark.parametrize("op", [op for op in OPS if reference_precision(search_spaces.get(op)) == FLOAT64])
def test_the_float64_rule_holds_for_pytorch_and_its_magnitude_bounds_the_value(op):
    """A template judged against float64 (`runtime.judge`): on its inputs and every `autotune check` case, the
    magnitude bounds |value| (the reference sums products of its floating inputs, as the rule assumes) and
    PyTorch's own output passes the bound its kernels must meet."""
    tpl, w = search_spaces.get(op), _task(op).workload
    binding = tpl.torch_binding()
    calls = [(tpl.reference, (w, *tpl.inputs(w, 5)), {})]
    calls += [(binding.op, args, kwargs) for _, args, kwargs in (binding.cases(w, 5, 2) if binding else ())]
    for fn, args, kwargs in calls:
        exp = expected_call(tpl, w, fn, *args, **kwargs)
        values, magnitudes = (exp.float64.value, exp.float64.magnitude)
        for value, magnitude in zip(*(x if isinstance(x, tuple) else (x,) for x in (values, magnitudes))):
            assert value.dtype == torch.float64 and bool((magnitude >= value.abs() * (1 - 1e-12)).all())
        assert judge(exp.pytorch, exp).why is None


@pytest.mark.parametrize("op", OPS)
def test_a_config_of_another_space_is_refused(op):
    task = _task(op)
    other = next(o for o in OPS if o != op)
    foreign = search_spaces.get(other).space(_task(other).workload, task.device.target()).default()
    with pytest.raises((InvalidConfig, KeyError, ValueError)):
        task.space.from_json(foreign.to_json())


@pytest.mark.parametrize("op", OPS)
def test_check_inputs_accepts_its_inputs_and_rejects_a_wrong_dtype(op):
    tpl, w = search_spaces.get(op), _task(op).workload
    inputs = tpl.inputs(w, 2)
    tpl.check_inputs(w, *inputs)
    first = inputs[0]
    wrong = first.to(torch.float64 if not first.is_floating_point() or first.dtype != torch.float64
                     else torch.int32)
    with pytest.raises((TypeError, ValueError)):
        tpl.check_inputs(w, wrong, *inputs[1:])


@pytest.mark.parametrize("op", [op for op in OPS if hasattr(search_spaces.get(op), "timed_inputs")])
def test_timed_input_sets_are_calls_the_kernel_must_serve(op):
    """Every set a timing cycles through is a valid call of the workload on the same weights, the given inputs
    first, and the default kernel computes each one's reference (so timing them times correct work)."""
    tpl, task = search_spaces.get(op), _task(op)
    w = task.workload
    inputs = tpl.inputs(w, 4)
    sets = tpl.timed_inputs(w, 4, inputs, 1 << 20)
    assert len(sets) > 1 and all(a is b for a, b in zip(sets[0], inputs))
    cfg = task.space.default()
    bound = BoundKernel(tpl, w, cfg, compile_module(task, cfg), False)
    for s in sets[:4]:
        assert all(s[i] is inputs[i] for i in tpl.WEIGHTS)
        tpl.check_inputs(w, *s)
        assert mismatch(bound(*s), expected(tpl, w, *s)) is None
    assert len(tpl.timed_inputs(w, 4, inputs, 0)) == 1  # no cache to leave: one set


@pytest.mark.parametrize("op", OPS)
def test_baselines_compute_the_reference_and_traffic_is_positive(op):
    tpl, w = search_spaces.get(op), _task(op).workload
    inputs = tpl.inputs(w, 3)
    ref = tpl.reference(w, *inputs)
    rtol, atol = tpl.tolerance(w)
    baselines = tpl.baselines(w, *inputs)
    assert baselines
    refs = ref if isinstance(ref, tuple) else (ref,)  # an op may return several tensors
    for name, fn in baselines.items():  # PyTorch's fastest paths may round differently (fbgemm requantizes)
        out = fn()
        outs = out if isinstance(out, tuple) else (out,)
        assert len(outs) == len(refs), name
        for i, (o, r) in enumerate(zip(outs, refs)):
            assert o.shape == r.shape and o.dtype == r.dtype, name
            scale = float(r.double().abs().max()) or 1.0
            assert float((o.double() - r.double()).abs().max()) <= 0.02 * scale + nth_tolerance(atol, i), name
    traffic = tpl.traffic(w, *inputs)
    assert isinstance(traffic, Traffic) and traffic.bytes > 0 and traffic.rate(1e-3) > 0


GPU_OPS = [op for op in OPS if "cuda" in device_kinds(search_spaces.get(op))]


@pytest.mark.parametrize("op", GPU_OPS)
def test_gpu_space_lowers_its_default_config(op):
    task = _task(op, "cuda:sm_90")
    mod = task.lower(task.space.default())
    assert "main" in [gv.name_hint for gv in mod.get_global_vars()]


@pytest.mark.parametrize("op", sorted(set(OPS) - set(GPU_OPS)))
def test_a_cpu_only_template_refuses_a_gpu_target_and_says_so(op):
    task = _task(op, "cuda:sm_90")
    assert device_kinds(task.template) == ("cpu",)
    with pytest.raises(InvalidConfig, match="runs on CPUs only: it has no CUDA template"):
        task.space
    with pytest.raises(InvalidConfig, match="runs on CPUs only"):
        task.template.lower(task.workload, _task(op).space.default(), task.device.target())


@pytest.mark.parametrize("op, device", [(op, "cpu") for op in OPS] + [(op, "cuda:sm_90") for op in GPU_OPS])
def test_sampling_covers_every_code_path_of_the_space(op, device):
    space = _task(op, device).space
    names = [k.name for k in space.knobs]
    assert all(p in names for p in space.paths), (space.paths, names)
    present = space.paths_present()
    assert present, f"{op} on {device}: no code path has a valid config"
    rng = random.Random(0)
    seen = [space.path_of(space.sample(rng)) for _ in range(20 * len(present))]
    assert set(seen) == set(present), f"{op} on {device}: sampling missed {set(present) - set(seen)}"


# Operators whose template declares no torch op (`torch_binding()` is None): named here, so an operator that
# loses its op fails below instead of skipping.
WITHOUT_TORCH_OP: set[str] = set()


@pytest.mark.parametrize("op", OPS)
def test_torch_binding_is_consistent_with_the_workload(op):
    tpl, w = search_spaces.get(op), _task(op).workload
    binding = tpl.torch_binding()
    if op in WITHOUT_TORCH_OP:
        assert binding is None, f"{op} has a torch op now: take it off WITHOUT_TORCH_OP"
        return
    assert isinstance(binding, TorchBinding), f"{op} lost its torch op (torch_binding() is {binding!r})"
    hash(binding.compiled(w))
    assert binding.size(w) >= 1
    cases = list(binding.cases(w, 0, 2))
    assert cases, "an operator with a torch op names the cases `autotune check` runs"
    for name, args, kwargs in cases:
        route = binding.route(*args, **kwargs)
        assert not isinstance(route, str), f"case {name} would not reach a kernel: {route}"
        assert route.signature == binding.compiled(w), name
        out, fake = binding.op(*args, **kwargs), binding.fake(*args, **kwargs)
        outs, fakes = (out, fake) if isinstance(out, tuple) else ((out,), (fake,))  # one tensor or several
        assert [(o.shape, o.dtype) for o in outs] == [(f.shape, f.dtype) for f in fakes], name


def test_registry_finds_every_template_package_once():
    assert len(OPS) == len(set(OPS)) and {"embedding_bag", "interaction", "qmatmul"} <= set(OPS)
    assert all(search_spaces.get(op) is search_spaces.get(op) for op in OPS)
    assert resolve("cpu").name.startswith("cpu:")
