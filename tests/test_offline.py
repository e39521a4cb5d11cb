"""The offline runner end to end: the tuner writes batches, measure.py (with TVM blocked) measures them."""

import subprocess
import sys
import threading

import pytest

from autotune import records
from autotune.measure import Timing
from autotune.measure.offline import OfflineRunner, OfflineTimeout
from autotune.task import make_task
from autotune.tuner import tune

FAST = Timing(number=2, repeat=3, min_repeat_ms=1)


def block_tvm(tmp_path):
    """PYTHONPATH that makes `import tvm` fail: the measuring side must not need TVM's compiler."""
    fake = tmp_path / "notvm" / "tvm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('TVM is not installed on this device')\n")
    return str(fake.parent)


def run_measure(root, tmp_path, *args):
    env_path = block_tvm(tmp_path)
    return subprocess.run([sys.executable, str(root / "measure.py"), *args], capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"})


def test_faults_are_recorded_and_every_candidate_measured_once(tmp_path, cpu_builder):
    task = make_task("templates.faulty", "cpu", shape="n=64")
    configs = list(task.space)  # none/wrong (two lane widths each), crash, hang
    root = tmp_path / "farm"
    runner = OfflineRunner(root, FAST, poll_s=0.2, wait_s=300, say=lambda msg: None)
    result = {}

    def tuner():
        result["measured"] = runner.measure(task, cpu_builder.build(task, configs))

    thread = threading.Thread(target=tuner)
    thread.start()
    for _ in range(600):  # the batch appears once built
        if (root / "batch-0000" / "batch.json").exists():
            break
        thread.join(0.2)
    proc = run_measure(root, tmp_path, "--timeout", "8")
    thread.join(60)
    assert proc.returncode == 0, proc.stderr
    kinds = {m.built.config.as_dict()["fault"]: m.error_kind for m in result["measured"]}
    assert kinds["crash"] == "crash" and kinds["hang"] == "timeout" and kinds["wrong"] == "wrong"
    assert kinds["none"] is None
    assert all(m.costs for m in result["measured"] if m.error_kind is None)
    assert len(result["measured"]) == len(configs)


def test_tuning_through_a_directory_resumes_from_the_log(tmp_path, cpu_builder):
    task = make_task("embedding_bag", "cpu", rows=300, dim=16, batch=32, pooling=(1, 6))
    root, log = tmp_path / "farm", tmp_path / "eb.jsonl"
    watcher = {}

    def measure_until_done():
        watcher["proc"] = subprocess.Popen(
            [sys.executable, str(root / "measure.py"), "--watch"], env={"PYTHONPATH": block_tvm(tmp_path),
                                                                         "PATH": "/usr/bin:/bin"},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    runner = OfflineRunner(root, FAST, poll_s=0.2, wait_s=300, say=lambda msg: None)
    runner._prepare(task)  # so the watcher has its script before the first batch
    measure_until_done()
    try:
        res = tune(task, trials=4, log=log, batch_size=2, runner=runner, timing=FAST, progress=False, confirm=0,
                   builder=cpu_builder)
    finally:
        watcher["proc"].kill()
        out = watcher["proc"].communicate()[0]
    assert res.measured == 4 and res.best is not None, out
    assert sorted(p.name for p in root.glob("batch-*")) == ["batch-0000", "batch-0001"]
    assert len(list(records.load(log))) == 4


def test_waiting_gives_up_with_a_clear_error(tmp_path, cpu_builder):
    task = make_task("templates.faulty", "cpu", shape="n=8")
    runner = OfflineRunner(tmp_path, FAST, poll_s=0.05, wait_s=0.2, say=lambda msg: None)
    with pytest.raises(OfflineTimeout, match="rerun the same command"):
        runner.measure(task, cpu_builder.build(task, [task.space.default()]))


def test_a_results_file_still_being_copied_is_waited_for(tmp_path):
    runner = OfflineRunner(tmp_path, FAST, poll_s=0.05, wait_s=0.3, say=lambda msg: None)
    partial = tmp_path / "results.json"
    partial.write_text('{"format": 1, "resu')
    with pytest.raises(OfflineTimeout, match="no complete"):
        runner._wait(partial)
    partial.write_text('{"format": 1, "results": []}')
    assert runner._wait(partial) == {"format": 1, "results": []}


def test_a_task_whose_data_cannot_be_made_on_the_device_is_a_harness_error(tmp_path, cpu_builder):
    """Inputs for n=-1 cannot be made (torch.arange(-1)) by measure.py: the candidates are not to blame."""
    task = make_task("templates.faulty", "cpu", shape="n=8")
    cfgs = [c for c in task.space if c.as_dict()["fault"] == "none"]
    root = tmp_path / "farm"
    runner = OfflineRunner(root, FAST, poll_s=0.2, wait_s=300, say=lambda msg: None)
    runner.write_batch(make_task("templates.faulty", "cpu", shape="n=-1"), cpu_builder.build(task, cfgs))
    proc = run_measure(root, tmp_path)
    assert proc.returncode == 0, proc.stderr
    results = runner._wait(root / "batch-0000" / "results.json")["results"]
    assert [r["error_kind"] for r in results] == ["harness"] * len(cfgs)
    assert all("making the task's inputs failed" in r["error"] for r in results)


@pytest.mark.parametrize("flag, value", [("--timeout", "0"), ("--prepare-timeout", "-5"), ("--timeout", "soon")])
def test_measure_script_refuses_limits_that_are_not_positive_seconds(capsys, flag, value):
    """A zero or negative limit would mark every candidate as hung: a clear error instead, before measuring."""
    from autotune.measure import offline_device

    with pytest.raises(SystemExit) as exc:
        offline_device.main([flag, value])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"argument {flag}:" in err
    assert ("expected seconds" if value == "soon" else f"must be positive, got {value}") in err
