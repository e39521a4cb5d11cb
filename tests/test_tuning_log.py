"""autotune/tuning_log.py: a log read once and asked per task: resume set, current records, best; appends."""

import pytest

from autotune import records
from autotune.records import Record
from autotune.tuning_log import TuningLog, existing_paths

FAULTY = "templates.faulty"  # tests/templates/faulty.py: a real template, so records have a current version
TASK = (FAULTY, "w", "cpu:x")


def rec(cfg, costs=(1.0,), kind=None, version=None, wkey="w"):
    tag = records.current_version(FAULTY, "cpu:x") if version is None else version
    return Record(op=FAULTY, workload={"n": 64}, workload_key=wkey, device="cpu:x", target={"kind": "llvm"},
                  config={"k": cfg}, config_key=cfg, costs=costs if kind is None else (), error_kind=kind,
                  template_version=tag)


@pytest.fixture
def log_path(tmp_path):
    path = tmp_path / "log.jsonl"
    records.append(path, [rec("fast", (1.0,)), rec("slow", (3.0,)), rec("crashed", kind="crash"),
                          rec("hung", kind="timeout"), rec("harness", kind="harness"),
                          rec("old", (0.1,), version="0ld"), rec("other", (0.01,), wkey="w2")])
    return path


def test_queries_split_a_task_by_template_version_and_pool_the_best(log_path):
    log = TuningLog(log_path)
    assert log.tasks() == [TASK, (FAULTY, "w2", "cpu:x")]
    assert [r.config_key for r in log.of(TASK)] == ["fast", "slow", "crashed", "hung", "harness", "old"]
    assert [r.config_key for r in log.current(TASK)] == ["fast", "slow", "crashed", "hung", "harness"]
    assert [r.config_key for r in log.stale(TASK)] == ["old"]
    assert log.stale(TASK, include_stale=True) == []
    assert log.best(TASK).config_key == "fast"
    assert log.best(TASK, include_stale=True).config_key == "old"  # the stale record is faster
    assert log.best((FAULTY, "w3", "cpu:x")) is None and log.of((FAULTY, "w3", "cpu:x")) == []


def test_the_resume_set_leaves_out_harness_failures_and_the_kinds_to_retry(log_path):
    log = TuningLog(log_path)
    assert [r.config_key for r in log.resume_set(TASK)] == ["fast", "slow", "crashed", "hung"]
    assert [r.config_key for r in log.resume_set(TASK, retry_errors={"timeout"})] == ["fast", "slow", "crashed"]
    assert log.resumed(TASK) == 4 and log.resumed(TASK, include_stale=True) == 5
    log.append([rec("fast", (2.0,))])  # a config measured twice counts once
    assert log.resumed(TASK) == 4


def test_append_writes_the_file_and_what_the_object_holds(log_path):
    log = TuningLog(log_path)
    log.append([rec("faster", (0.5,)), rec("fast", (0.2, 0.2))])
    assert log.best(TASK).config_key == "fast" and log.best(TASK).costs == (1.0, 0.2, 0.2)  # pooled: median 0.2
    again = TuningLog(log_path)
    assert [r.config_key for r in again.records] == [r.config_key for r in log.records]
    assert again.best(TASK) == log.best(TASK)


def test_several_files_read_together_are_read_only_and_missing_ones_are_named(log_path, tmp_path):
    other = tmp_path / "other.jsonl"
    records.append(other, [rec("elsewhere", (0.5,))])
    both = TuningLog([log_path, other])
    assert both.best(TASK).config_key == "elsewhere"
    with pytest.raises(ValueError, match="read-only"):
        both.append([rec("x")])
    assert TuningLog(tmp_path / "new.jsonl").records == []  # a first run's log does not exist yet
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        TuningLog.existing([log_path, tmp_path / "nope.jsonl"])
    with pytest.raises(FileNotFoundError, match="log not found"):
        existing_paths(tmp_path)  # a directory is not a log


def test_shipped_records_need_only_features_this_machine_has(tmp_path, monkeypatch):
    """A CPU kind is LLVM's model name, which a VM may show with another CPU's instruction sets (an AMX Xeon named
    rocketlake): a shipped record compiled for features this machine lacks is not offered here."""
    from dataclasses import replace

    from autotune import targets

    host = f"cpu:{targets.host_cpu()}"
    plain, amx = (replace(rec(c), device=host, target={"kind": "llvm", **t}) for c, t in
                  (("plain", {}), ("amx", {"mattr": ["+amx-tile", "+amx-int8"]})))
    shipped = tmp_path / "shipped.jsonl"
    records.append(shipped, [plain, amx])
    monkeypatch.setattr(records, "shipped_logs", lambda op, device: [shipped])
    for features, offered in (((), {"plain"}), (("+amx-tile", "+amx-int8", "+amx-bf16"), {"plain", "amx"})):
        monkeypatch.setattr(targets, "host_extra_features", lambda mcpu, f=features: f)
        assert {r.config_key for r in TuningLog.shipped(FAULTY, host).records} == offered
        assert TuningLog.shipped(FAULTY, host).best((FAULTY, "w", host)).config_key == "plain"
    other = "cpu:znver4" if host != "cpu:znver4" else "cpu:znver3"  # another kind (cross-compiling): as they are
    assert {r.config_key for r in TuningLog.shipped(FAULTY, other).records} == {"plain", "amx"}
