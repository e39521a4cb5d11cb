"""End-to-end tuning on tiny shapes: a real loop with real workers, small enough for CI."""

import json

import pytest
import torch

import autotune
from autotune import records
from autotune.build import Builder
from autotune.measure import LocalRunner, Timing
from autotune.task import make_task
from autotune.tuner import tune

FAST = Timing(number=1, repeat=2, min_repeat_ms=1)
SHAPE = "rows=500,dim=16,batch=32,pooling=0-12,dist=zipf:1.1"


@pytest.fixture(scope="module")
def workers():
    builder, runner = Builder(timeout=60), LocalRunner(FAST, timeout=20)
    yield builder, runner
    builder.close()
    runner.close()


def test_short_run_logs_a_best_config_that_rebuilds_and_matches_torch(tmp_path, workers):
    log = tmp_path / "eb.jsonl"
    task = make_task("embedding_bag", "cpu", shape=SHAPE)
    res = tune(task, trials=12, log=log, batch_size=6, builder=workers[0], runner=workers[1], progress=False)
    assert res.measured == 12 and res.best is not None and res.best.ok
    assert len(res.curve) == 12 and res.curve == sorted(res.curve, reverse=True)
    logged = list(records.load(log))
    assert len(logged) == 12 and all(r.ok for r in logged)
    kern = autotune.kernel("embedding_bag", "cpu", log=log, shape=SHAPE)
    assert kern.config == task.space.from_json(res.best.config)
    tensors = task.template.inputs(task.workload, seed=7)
    torch.testing.assert_close(kern(*tensors), task.template.reference(task.workload, *tensors))


def test_resume_measures_nothing_twice(tmp_path, workers):
    log = tmp_path / "eb.jsonl"
    task = make_task("embedding_bag", "cpu", shape=SHAPE)
    first = tune(task, trials=6, log=log, batch_size=6, strategy="random", builder=workers[0],
                 runner=workers[1], progress=False)
    second = tune(task, trials=6, log=log, batch_size=6, strategy="xgb", builder=workers[0],
                  runner=workers[1], progress=False)
    assert first.resumed == 0 and second.resumed == 6
    keys = [r.config_key for r in records.load(log)]
    assert len(keys) == 12 and len(set(keys)) == 12


def test_resume_on_a_nearly_exhausted_space_stops_cleanly(tmp_path, workers):
    log = tmp_path / "f.jsonl"
    task = make_task("templates.faulty", "cpu", shape="n=64")
    good = [c for c in task.space if c.as_dict()["fault"] == "none"]
    records.append(log, [task.record(c, costs=(1e-6,)) for c in good])
    res = tune(task, trials=50, log=log, strategy="random", builder=workers[0], runner=workers[1],
               progress=False)
    assert res.resumed == 2 and res.measured == len(task.space) - 2


def test_crashing_hanging_and_wrong_candidates_become_error_records(tmp_path):
    log = tmp_path / "faulty.jsonl"
    task = make_task("templates.faulty", "cpu", shape="n=64")
    with Builder(timeout=60) as builder:
        runner = LocalRunner(FAST, timeout=4)
        try:
            res = tune(task, trials=100, log=log, strategy="random", batch_size=8, builder=builder,
                       runner=runner, progress=False)
        finally:
            runner.close()
    kinds = {json.dumps(r.config, sort_keys=True): r.error_kind for r in records.load(log)}
    assert res.measured == 6 == len(kinds)
    by_fault = {}
    for cfg, kind in kinds.items():
        by_fault.setdefault(json.loads(cfg)["fault"], set()).add(kind)
    assert by_fault == {"none": {None}, "wrong": {"wrong"}, "crash": {"crash"}, "hang": {"timeout"}}
    assert res.best is not None and res.best.config["fault"] == "none"


def test_early_stopping_and_bad_arguments(tmp_path, workers):
    task = make_task("templates.faulty", "cpu", shape="n=64")
    good_only = tmp_path / "g.jsonl"
    with pytest.raises(ValueError, match="strategy"):
        tune(task, trials=4, log=good_only, strategy="nope")
    with pytest.raises(ValueError, match="trials"):
        tune(task, trials=0, log=good_only)


@pytest.mark.parametrize("op, shape", [("qmatmul", "m=24,k=40,n=24,relu=1"),
                                       ("qmatmul", "m=8,k=16,n=8,mode=weight_only")])
def test_short_run_of_other_templates(op, shape, tmp_path, workers):
    log = tmp_path / f"{op}.jsonl"
    task = make_task(op, "cpu", shape=shape)
    res = tune(task, trials=6, log=log, batch_size=6, builder=workers[0], runner=workers[1], progress=False)
    assert res.measured == 6 and res.best is not None
    kern = autotune.kernel(op, "cpu", log=log, shape=shape)
    tensors = task.template.inputs(task.workload, seed=3)
    rtol, atol = task.template.tolerance(task.workload)
    torch.testing.assert_close(kern(*tensors), task.template.reference(task.workload, *tensors), rtol=rtol, atol=atol)
