import math
import multiprocessing as mp

import pytest

from autotune import records
from autotune.records import CorruptLogWarning, Record


def rec(cfg="a", costs=(1.0, 2.0, 3.0), kind=None, wkey="w1", op="op"):
    return Record(op=op, workload={"n": 1}, workload_key=wkey, device="cpu:x", target={"kind": "llvm"},
                  config={"k": cfg}, config_key=cfg, costs=costs if kind is None else (), error_kind=kind,
                  error=None if kind is None else "boom")


def test_round_trip_and_latency(tmp_path):
    log = tmp_path / "sub" / "log.jsonl"
    written = rec("a")
    records.append(log, [written, rec("b", kind="crash")])
    a, b = list(records.load(log))
    assert a == written and a.latency == 2.0 and a.ok
    assert not b.ok and b.latency == math.inf and b.error_kind == "crash"


def test_best_ignores_errors_and_other_tasks(tmp_path):
    recs = [rec("slow", (5.0,)), rec("fast", (1.0,)), rec("err", kind="wrong"), rec("x", (0.1,), wkey="w2")]
    best = records.best(recs, "op", "w1", "cpu:x")
    assert best.config_key == "fast"
    assert records.best(recs, "op", "w3", "cpu:x") is None


def test_corrupt_lines_are_skipped_with_a_warning(tmp_path):
    log = tmp_path / "log.jsonl"
    records.append(log, [rec("a")])
    with open(log, "a") as f:
        f.write('{"truncated": \n')
        f.write("not json at all\n")
        f.write('{"version": 99}\n')
    records.append(log, [rec("b")])
    with pytest.warns(CorruptLogWarning):
        got = [r.config_key for r in records.load(log)]
    assert got == ["a", "b"]


def test_append_after_a_torn_line_keeps_the_new_record(tmp_path):
    log = tmp_path / "log.jsonl"
    records.append(log, [rec("a")])
    with open(log, "a") as f:
        f.write('{"op": "half a line')  # a writer killed mid-line: no newline
    records.append(log, [rec("b")])
    with pytest.warns(CorruptLogWarning):
        assert [r.config_key for r in records.load(log)] == ["a", "b"]


def _writer(path, tag):
    for i in range(50):
        records.append(path, [rec(f"{tag}{i}")])


def test_concurrent_writers_lose_nothing(tmp_path):
    log = tmp_path / "log.jsonl"
    procs = [mp.get_context("spawn").Process(target=_writer, args=(str(log), t)) for t in "xy"]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    keys = [r.config_key for r in records.load(log)]
    assert len(keys) == 100 and len(set(keys)) == 100


def test_missing_log_is_empty(tmp_path):
    assert list(records.load(tmp_path / "nope.jsonl")) == []
