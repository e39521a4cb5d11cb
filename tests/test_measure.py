import pytest
import torch

from autotune.measure import LocalRunner, Timing
from autotune.task import make_task


def test_measures_correct_candidates_and_flags_wrong_ones(cpu_builder):
    task = make_task("templates.faulty", "cpu", shape="n=64")
    cfgs = [c for c in task.space if c.as_dict()["fault"] in ("none", "wrong")]
    runner = LocalRunner(Timing(number=2, repeat=3, min_repeat_ms=1), timeout=30)
    try:
        out = runner.measure(task, cpu_builder.build(task, cfgs))
    finally:
        runner.close()
    for m in out:
        if m.built.config.as_dict()["fault"] == "none":
            assert m.error_kind is None and len(m.costs) == 3 and all(c > 0 for c in m.costs)
        else:
            assert m.error_kind == "wrong" and "max abs error" in m.error and not m.costs


def test_a_task_whose_data_cannot_be_made_is_a_harness_error_for_each_candidate(cpu_builder):
    """Inputs for n=-1 cannot be made (torch.arange(-1)): the machinery failed, not the candidates."""
    task = make_task("templates.faulty", "cpu", shape="n=8")
    unpreparable = make_task("templates.faulty", "cpu", shape="n=-1")
    cfgs = [c for c in task.space if c.as_dict()["fault"] == "none"]
    runner = LocalRunner(Timing(number=1, repeat=1, min_repeat_ms=1), timeout=30)
    try:
        out = runner.measure(unpreparable, cpu_builder.build(task, cfgs))
        good = runner.measure(task, cpu_builder.build(task, cfgs[:1]))  # the runner recovers for the next task
    finally:
        runner.close()
    assert [m.error_kind for m in out] == ["harness"] * len(cfgs)
    assert all("making the task's inputs failed" in m.error for m in out)
    assert good[0].error_kind is None and good[0].costs


def test_timing_is_the_runtimes_one_type():
    import autotune
    from autotune import runtime

    assert Timing is runtime.Timing is autotune.Timing


def test_anchored_timing_compiles_its_anchor_in_the_worker_and_keeps_its_scale_across_crashes(cpu_builder):
    """The default config is compiled and calibrated in the measure worker; the records look as usual; the worker
    that replaces a crashed one takes the first one's nominal anchor latency instead of calibrating anew (on a
    machine whose speed swings 2x, a new calibration would put the records after a crash on another scale)."""
    task = make_task("templates.faulty", "cpu", shape="n=64")
    by_fault = {c.as_dict()["fault"]: c for c in task.space}
    runner = LocalRunner(Timing(number=1, repeat=3, min_repeat_ms=1, anchor=True), timeout=10)
    try:
        out = runner.measure(task, cpu_builder.build(task, [by_fault[f] for f in ("none", "wrong", "crash")]))
        nominal = dict(runner.anchor_nominal)
        again = runner.measure(task, cpu_builder.build(task, [by_fault["none"]]))
    finally:
        runner.close()
    assert [m.error_kind for m in out] == [None, "wrong", "crash"]
    assert len(out[0].costs) == 3 and all(c > 0 for c in out[0].costs)
    assert again[0].error_kind is None and again[0].costs
    assert list(nominal) == [task.workload_key] and nominal[task.workload_key] > 0
    assert runner.anchor_nominal == nominal  # the new worker was handed the nominal latency and kept it
    later = LocalRunner(runner.timing, timeout=10, anchor_nominal=nominal)  # a later run on the same scale
    try:
        assert later.measure(task, cpu_builder.build(task, [by_fault["none"]]))[0].costs
    finally:
        later.close()
    assert later.anchor_nominal == nominal


def test_anchored_timing_is_refused_where_it_cannot_run(tmp_path):
    from autotune.measure import OfflineRunner

    with pytest.raises(ValueError, match="not the offline runner"):
        OfflineRunner(tmp_path, Timing(anchor=True))
    runner = LocalRunner(Timing(anchor=True))
    try:
        with pytest.raises(ValueError, match="not a GPU"):
            runner.measure(make_task("embedding_bag", "cuda:sm_90", shape="rows=100,dim=8,batch=4,pooling=2"), [])
    finally:
        runner.close()


def test_every_runner_keeps_the_protocol_and_make_runner_reads_the_runner_text(tmp_path):
    from autotune.measure import MeasurementCache, OfflineRunner, RPCRunner, Runner, make_runner

    assert all(issubclass(cls, Runner) for cls in (LocalRunner, OfflineRunner, RPCRunner))
    assert isinstance(MeasurementCache(None, builder=None, runner=None).runner, Runner)
    assert make_runner("local") is None  # the tuner's own LocalRunner
    offline = make_runner(f"offline:{tmp_path}", Timing(repeat=2))
    assert isinstance(offline, OfflineRunner) and offline.root == tmp_path and offline.timing == Timing(repeat=2)
    for bad in ("offline:", "ssh://host", "remote"):
        with pytest.raises(ValueError, match="expected local, offline:DIR or rpc://HOST:PORT/KEY"):
            make_runner(bad)
