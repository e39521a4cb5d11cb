"""`python -m autotune.lowered`: the fingerprints that prove a template change left its records' code alone."""

import json

from autotune import lowered

SHIPPED = "logs/cpu/qmatmul.jsonl"


def _lines(path, n):
    with open(path, encoding="utf-8") as f:
        return [next(f) for _ in range(n)]


def test_a_record_lowers_to_the_same_fingerprint_each_time_and_configs_differ(tmp_path, capsys):
    first, second = _lines(SHIPPED, 2)
    log = tmp_path / "log.jsonl"
    log.write_text(first + second + first)  # the first config measured twice: one line
    assert lowered.main([str(log)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2
    again = dict(lowered.fingerprints([log]))
    assert dict(line.split("\t") for line in out) == again
    assert len(set(again.values())) == 2 and not any(fp.startswith("invalid") for fp in again.values())


def test_a_config_the_code_no_longer_takes_is_named_invalid(tmp_path):
    raw = json.loads(_lines(SHIPPED, 1)[0])
    raw["config"] = {**raw["config"], "m_tile": 3}  # not an option of the knob
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps(raw) + "\n")
    [(ident, fp)] = list(lowered.fingerprints([log]))
    assert ident.startswith("qmatmul cpu:") and fp.startswith("invalid: ")
    assert list(lowered.fingerprints([log], ops={"interaction"})) == []


def test_a_log_that_is_no_file_is_refused_not_proven_empty(tmp_path, capsys):
    import pytest

    missing = tmp_path / "nope.jsonl"
    with pytest.raises(SystemExit) as exit_:
        lowered.main([str(missing)])
    assert exit_.value.code == 2 and "nope.jsonl" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        list(lowered.fingerprints([missing]))


def test_specialized_binds_a_kernels_task_count_at_the_records_workload():
    """qmatmul's CPU kernels take their number of tasks; --specialized binds it at the tuned M, so the module
    compared is the kernel the record measured (its buffers of the tuned padded rows, no free variable)."""
    import search_spaces
    from autotune import records
    from search_spaces.template import target_from_json

    r = next(iter(records.load(SHIPPED)))
    template = search_spaces.get(r.op)
    w = template.Workload.from_json(r.workload)
    target = target_from_json(r.target)
    cfg = template.space(w, target).from_json(r.config)
    mod = template.lower(w, cfg, target)
    assert mod["main"].params[-1].name == "tasks"
    func = lowered._specialized(mod, template.scalar_args, w, cfg)["main"]
    mp, kp, _ = template.padded_dims(w, cfg)
    script = func.script()
    assert "tasks" not in [p.name for p in func.params] and "tasks" not in script
    assert f"A: T.Buffer(({mp}, {kp}), " in script
