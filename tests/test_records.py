import json
import math
import multiprocessing as mp
from dataclasses import replace

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


# ---- template versions (format 2) ---------------------------------------------------------------------------
FAULTY = "templates.faulty"  # tests/templates/faulty.py: a real template, so records have a current version


def faulty(cfg="a", version=None, costs=(1.0,), kind=None, device="cpu:x"):
    tag = records.current_version(FAULTY, device) if version is None else version
    return Record(op=FAULTY, workload={"n": 64}, workload_key="w", device=device, target={"kind": "llvm"},
                  config={"k": cfg}, config_key=cfg, costs=costs if kind is None else (), error_kind=kind,
                  template_version=tag)


def _v1_line(cfg):
    d = json.loads(faulty(cfg).to_json())
    del d["template_version"]
    d["version"] = 1
    return json.dumps(d) + "\n"


def test_records_carry_the_template_version_and_v1_lines_load_as_stale(tmp_path):
    log = tmp_path / "log.jsonl"
    records.append(log, [faulty("new")])
    with open(log, "a") as f:
        f.write(_v1_line("old"))
    new, old = records.load(log)
    assert new.version == records.FORMAT_VERSION == 2 and new.template_version == records.current_version(FAULTY, "cpu:x")
    assert old.version == 1 and old.template_version == "" and old.ok
    assert [r.config_key for r in records.current([new, old])] == ["new"]
    assert [r.config_key for r in records.current([new, old], include_stale=True)] == ["new", "old"]


def test_records_of_another_version_or_an_unknown_template_are_stale():
    other = faulty("other", version="0123456789ab")
    unknown = replace(faulty("u"), op="no_such_operator")
    assert [r.config_key for r in records.current([faulty("cur"), other, unknown])] == ["cur"]
    assert records.current_version("no_such_operator", "cpu:x") is None


def test_harness_is_an_error_kind_and_unknown_kinds_are_corrupt(tmp_path):
    log = tmp_path / "log.jsonl"
    records.append(log, [faulty("h", kind="harness")])
    with open(log, "a") as f:
        f.write(faulty("z").to_json().replace('"error_kind":null', '"error_kind":"gremlins"') + "\n")
    with pytest.warns(CorruptLogWarning, match="gremlins"):
        (h,) = records.load(log)
    assert h.error_kind == "harness" and not h.ok


def test_retag_rewrites_one_op_and_device_kind_and_keeps_everything_else(tmp_path):
    log = tmp_path / "log.jsonl"
    keep = [rec("other-op").to_json() + "\n", faulty("gpu", version="", device="cuda:sm_90").to_json() + "\n",
            '{"torn": \n']
    log.write_text(_v1_line("a") + keep[0] + _v1_line("b") + keep[1] + keep[2])
    log.chmod(0o640)
    assert records.retag(log, FAULTY, "cpu") == 2
    lines = log.read_text().splitlines(keepends=True)
    assert [lines[1], lines[3], lines[4]] == keep  # byte for byte
    a, b = (Record.from_json(lines[i]) for i in (0, 2))
    assert records.current([a, b]) == [a, b] and a.version == b.version == records.FORMAT_VERSION
    assert (log.stat().st_mode & 0o777) == 0o640 and sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl"]
    assert records.retag(log, FAULTY, "cuda", version="feedc0ffee00") == 1
    assert Record.from_json(log.read_text().splitlines()[3]).template_version == "feedc0ffee00"
    assert records.retag(log, FAULTY, "cuda", version="0123456789ab", from_version="another") == 0
    assert records.retag(log, FAULTY, "cuda", version="0123456789ab", from_version="feedc0ffee00") == 1
    assert Record.from_json(log.read_text().splitlines()[3]).template_version == "0123456789ab"


def test_add_knobs_completes_one_ops_configs_and_their_keys_and_keeps_everything_else(tmp_path):
    log = tmp_path / "log.jsonl"
    keep = [rec("other-op").to_json() + "\n", '{"torn": \n']
    done = faulty("d").to_json().replace('"config":{"k":"d"}', '"config":{"blk":8,"k":"d"}') + "\n"
    log.write_text(faulty("a").to_json() + "\n" + keep[0] + done + keep[1])
    assert records.add_knobs(log, FAULTY, {"blk": 0}) == 1  # the record that has the knob keeps its value
    lines = log.read_text().splitlines(keepends=True)
    assert lines[1:] == [keep[0], done, keep[1]]  # byte for byte
    a = Record.from_json(lines[0])
    assert a.config == {"blk": 0, "k": "a"} and a.config_key == '{"blk":0,"k":"a"}'
    assert a.costs == faulty("a").costs and a.template_version == faulty("a").template_version
    assert records.add_knobs(log, FAULTY, {"blk": 0}) == 0


def test_best_pools_every_measurement_of_a_config():
    lucky, steady = rec("lucky", costs=(1.0, 9.0, 9.0)), rec("steady", costs=(5.0, 5.0, 5.0))
    assert records.best([lucky, steady], "op", "w1", "cpu:x").config_key == "steady"  # one fast repeat is luck
    first, again = rec("a", costs=(1.0, 2.0, 3.0)), rec("a", costs=(9.0, 9.0, 1.0))
    pooled = records.best([first, steady, again], "op", "w1", "cpu:x")
    assert pooled.config_key == "a" and sorted(pooled.costs) == [1.0, 1.0, 2.0, 3.0, 9.0, 9.0]
    assert pooled.latency == 2.5  # the median of both measurements, not the first one's 2.0


def test_program_features_round_trip_and_lines_without_them_load(tmp_path):
    log = tmp_path / "log.jsonl"
    with_features = replace(rec("f"), features={"p.stores": 2.0, "p.sum.0": 1.5}, features_version="1")
    old = json.loads(rec("old").to_json())
    del old["features"], old["features_version"]  # a line written before records had them
    records.append(log, [with_features])
    with open(log, "a") as f:
        f.write(json.dumps(old) + "\n")
        f.write(rec("bad").to_json().replace('"features":null', '"features":[1,2]') + "\n")
    with pytest.warns(CorruptLogWarning, match="features"):
        a, b = records.load(log)
    assert a == with_features and a.features["p.sum.0"] == 1.5
    assert b.config_key == "old" and b.features is None and b.features_version == "" and b.ok


def stale_shipped(paths) -> list[str]:
    return [f"{p}: {r.op} {r.workload_key} on {r.device} is {r.template_version!r}, the code ships "
            f"{records.current_version(r.op, r.device)!r}" for p in paths for r in records.stale(p)]


def shipped_paths() -> list:
    import search_spaces

    return [p for op in search_spaces.names() for kind in ("cpu", "cuda") for p in records.shipped_logs(op, kind)]


def test_every_shipped_record_is_current_for_the_code_that_ships_with_it():
    """A shipped record counts as a measurement already made (tune_model does not tune a task they cover), so
    each must have been measured with the code that ships: a change to a template's generated-code closure
    makes its records stale, and this fails the change that neither retags them (after proving the code
    unchanged) nor drops them (`records.drop_stale`)."""
    paths = shipped_paths()
    assert paths, "no shipped logs found"
    stale = stale_shipped(paths)
    assert not stale, "\n".join(stale[:20]) + (f"\n... ({len(stale)} in all)" if len(stale) > 20 else "")


def test_one_stale_record_in_a_shipped_log_is_found_and_dropped(tmp_path):
    src = shipped_paths()[0]
    copy = tmp_path / src.name
    copy.write_bytes(src.read_bytes())
    first = next(records.load(copy))
    records.append(copy, [replace(first, template_version="0" * 12, config_key="older")])
    (found,) = stale_shipped([copy])
    assert "'000000000000'" in found and first.op in found
    assert records.drop_stale(copy) == 1 and stale_shipped([copy]) == []
    assert copy.read_bytes() == src.read_bytes()
