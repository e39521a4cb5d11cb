import pytest
import torch

import autotune
from autotune.kernel import NoTunedKernel
from autotune.records import shipped_logs
from autotune.task import make_task

SHAPE = "rows=40,dim=8,batch=5,pooling=1-4"


@pytest.fixture()
def log(tmp_path):
    from autotune import records

    task = make_task("embedding_bag", "cpu", shape=SHAPE)
    path = tmp_path / "eb.jsonl"
    cfgs = list(task.space)[:3]
    records.append(path, [task.record(cfgs[0], costs=(3e-6,)), task.record(cfgs[1], costs=(1e-6,)),
                          task.record(cfgs[2], error_kind="crash", error="x")])
    return path, cfgs[1]


def test_kernel_runs_the_best_correct_record_with_reference_argument_order(log):
    path, best = log
    k = autotune.kernel("embedding_bag", "cpu", log=path, shape=SHAPE)
    assert k.config == best
    w = k.task.workload
    weight, idx, off = k.task.template.inputs(w, 0)
    torch.testing.assert_close(k(weight, idx, off), torch.nn.functional.embedding_bag(idx, weight, off, mode="sum"))


def test_kernel_accepts_workload_fields_as_keywords(log):
    path, best = log
    k = autotune.kernel("embedding_bag", "cpu", log=[path], rows=40, dim=8, batch=5, pooling=(1, 4))
    assert k.config == best


def test_validation_catches_out_of_range_indices_unless_disabled(log):
    path, _ = log
    k = autotune.kernel("embedding_bag", "cpu", log=path, shape=SHAPE)
    weight = torch.randn(40, 8)
    with pytest.raises(IndexError, match="indices must be in"):
        k(weight, torch.tensor([0, 40]), torch.tensor([0, 1]))
    assert not autotune.kernel("embedding_bag", "cpu", log=path, shape=SHAPE, validate=False).validate


def test_no_record_or_no_log_is_a_clear_error(log, tmp_path):
    path, _ = log
    with pytest.raises(NoTunedKernel, match="autotune tune"):
        autotune.kernel("embedding_bag", "cpu", log=path, rows=41, dim=8, batch=5, pooling=(1, 4))
    with pytest.raises(FileNotFoundError):
        autotune.kernel("embedding_bag", "cpu", log=tmp_path / "none.jsonl", shape=SHAPE)


def test_shipped_logs_are_found_by_device_kind():
    assert all(p.name == "embedding_bag.jsonl" for p in shipped_logs("embedding_bag", "cpu:whatever"))


def test_kernel_checks_inputs_then_runs_the_bound_kernel_the_tuner_timed(log):
    from autotune import runtime

    path, _ = log
    k = autotune.kernel("embedding_bag", "cpu", log=path, shape=SHAPE)
    assert isinstance(k.bound, runtime.BoundKernel) and k.bound.config == k.config
    calls = []
    k.bound = lambda *tensors: calls.append(tensors) or "out"
    weight, idx, off = k.task.template.inputs(k.task.workload, 0)
    assert k(weight, idx, off) == "out" and len(calls) == 1
    with pytest.raises(IndexError):
        k(weight, torch.tensor([0, 40]), torch.tensor([0, 1]))
    assert len(calls) == 1  # bad input never reaches the kernel


def test_a_kernel_runs_its_parallel_loops_on_pytorchs_pool_as_the_tuner_timed_it(tmp_path, monkeypatch):
    """Compiled in this process, a CPU kernel is loaded as the tuner's measure worker and the torch ops load
    theirs: its parallel loops on PyTorch's OpenMP pool, not on TVM's own pool beside it."""
    from autotune import records, runtime

    task = make_task("embedding_bag", "cpu", shape=SHAPE)
    cfg = next(c for c in task.space if c.as_dict()["threading"] == "parallel")
    path = tmp_path / "eb.jsonl"
    records.append(path, [task.record(cfg, costs=(1e-6,))])
    real, pools = runtime.load_function, []

    def spy(lib, name="main"):
        func = real(lib, name)
        pools.append(runtime.parallel_launcher(lib))
        return func

    monkeypatch.setattr(runtime, "load_function", spy)
    k = autotune.kernel("embedding_bag", "cpu", log=path, shape=SHAPE)
    assert pools == ["openmp"]
    weight, idx, off = task.template.inputs(task.workload, 0)
    torch.testing.assert_close(k(weight, idx, off), torch.nn.functional.embedding_bag(idx, weight, off, mode="sum"))
