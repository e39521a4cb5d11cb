"""The compiler-free runtime: checking and timing a kernel the way every runner does."""

import torch

from autotune import runtime
from autotune.build import compile_module
from autotune.task import make_task


def test_check_and_time_accepts_correct_kernels_and_flags_wrong_ones():
    task = make_task("templates.faulty", "cpu", shape="n=64")
    data = runtime.TaskData(task.template, task.workload, 0, "cpu")
    spec = runtime.TimingSpec(number=2, repeat=3, min_repeat_ms=1)
    outcomes = {}
    for cfg in task.space:
        fault = cfg.as_dict()["fault"]
        if fault in ("none", "wrong"):
            outcomes[fault] = runtime.check_and_time(data, cfg, compile_module(task, cfg)["main"], spec)
    costs, kind, _ = outcomes["none"]
    assert kind is None and len(costs) == 3 and all(c > 0 for c in costs)
    assert outcomes["wrong"][:2] == ((), "wrong")


def test_time_cpu_lengthens_repeats_to_the_minimum_duration():
    calls = []
    costs = runtime.time_cpu(lambda: calls.append(1), runtime.TimingSpec(number=1, repeat=2, min_repeat_ms=5))
    assert len(costs) == 2 and len(calls) > 100  # a no-op needs many calls to last 5 ms


def test_mismatch_names_shape_and_value_differences():
    assert runtime.mismatch(torch.ones(3), torch.ones(3), 0, 0) is None
    assert "shape" in runtime.mismatch(torch.ones(2), torch.ones(3), 0, 0)
    assert "max abs error 2" in runtime.mismatch(torch.zeros(3), torch.full((3,), 2.0), 0, 0.5)
