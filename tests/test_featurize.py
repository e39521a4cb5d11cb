"""`autotune featurize`: program features added to old logs, every other byte kept."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from autotune import records
from autotune.cli import main
from autotune.featurize import add_program_features, record_device
from autotune.targets import resolve
from autotune.task import make_task
from cost_model.program import PROGRAM_FEATURES_VERSION

NEW = ("features", "features_version")


def _line(r: records.Record) -> str:
    d = json.loads(r.to_json())
    for k in NEW:  # as logs written before records had program features
        del d[k]
    return json.dumps(d, sort_keys=True, separators=(",", ":")) + "\n"


def test_records_gain_features_and_every_other_byte_is_kept(tmp_path, capsys, cpu_builder):
    task = make_task("templates.faulty", "cpu", shape="n=64")
    a, b = (c for c in task.space if c.to_json()["fault"] == "none")
    foreign = make_task("embedding_bag", "cpu", shape="rows=10,dim=8,batch=2,pooling=1").space.default()
    first, again = task.record(a, costs=(1.0,)), task.record(a, costs=(2.0,))  # the same config measured twice
    keep = [_line(replace(task.record(b, costs=(1.0,)), template_version="0123456789ab")),  # stale: other code
            _line(replace(task.record(b, costs=(1.0,)), config=foreign.to_json())),  # no longer lowers
            '{"torn": \n']
    log = tmp_path / "log.jsonl"
    log.write_text(_line(first) + keep[0] + _line(again) + keep[1] + keep[2])
    log.chmod(0o640)
    builder = cpu_builder  # the session's pool: the features come from its workers all the same
    assert add_program_features(log, builder) == 2
    lines = log.read_text().splitlines(keepends=True)
    assert [lines[1], lines[3], lines[4]] == keep
    for old, new in ((first, lines[0]), (again, lines[2])):
        d = json.loads(new)
        assert d["features_version"] == PROGRAM_FEATURES_VERSION and d["features"]["p.stores"] >= 1
        assert {k: v for k, v in d.items() if k not in NEW} == json.loads(_line(old))
    assert (log.stat().st_mode & 0o777) == 0o640 and [p.name for p in tmp_path.iterdir()] == ["log.jsonl"]
    assert add_program_features(log, builder) == 0  # nothing left to do: the log is not rewritten
    assert add_program_features(log, builder, include_stale=True) == 1  # today's lowering of the stale one
    with pytest.warns(records.CorruptLogWarning):  # the torn line, counted by the summary's load
        assert main(["featurize", str(log), "--workers", "1"]) == 0
    assert "0 records gained program features; 3 of 4 carry them" in capsys.readouterr().out
    assert main(["featurize", str(tmp_path / "missing.jsonl")]) == 2


@pytest.mark.parametrize("name", ["cpu", "cuda:sm_90"])
def test_a_records_device_is_rebuilt_from_its_target_json(name):
    dev = resolve(name)
    assert record_device(dev.name, dev.to_json()) == dev
    stored = json.loads(json.dumps(dev.to_json(), sort_keys=True))  # as a log line holds it
    assert str(record_device(dev.name, stored).target()) == str(dev.target())
    with pytest.raises(ValueError, match="target"):
        record_device(dev.name, {"mcpu": "x"})
