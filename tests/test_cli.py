import json
import subprocess
import sys

import pytest

from autotune import records
from autotune.cli import main

SHAPE = "rows=200,dim=8,batch=16,pooling=1-6"


@pytest.mark.parametrize("argv, message", [
    (["tune", "nope", "--shape", "a=1", "--log", "x.jsonl"], "unknown operator"),
    (["tune", "embedding_bag", "--shape", "rows=10", "--log", "x.jsonl"], "missing"),
    (["tune", "embedding_bag", "--shape", "rows=1,dim=2,batch=3,pooling=4,mode=x", "--log", "x.jsonl"], "mode"),
    (["tune", "embedding_bag", "--device", "tpu", "--shape", SHAPE, "--log", "x.jsonl"], "unknown device"),
    (["best", "--log", "missing.jsonl"], "log not found"),
    (["tune", "embedding_bag", "--shape", SHAPE, "--log", "x.jsonl", "--runner", "farm"], "unknown runner"),
    (["tune", "embedding_bag", "--shape", SHAPE], "--log is required"),
    (["tune", "embedding_bag", "--device", "cuda:sm_70", "--shape", SHAPE, "--log", "x.jsonl"], "sm_70"),
    (["export", "--log", "missing.jsonl", "--out", "pkg"], "log not found"),
    (["bench", "embedding_bag", "--shape", SHAPE, "--log", "missing.jsonl"], "log not found"),
    (["tune", "embedding_bag", "--shape", SHAPE, "--log", "x.jsonl", "--retry-errors", "timeout,nope"],
     "unknown error kind 'nope'"),
    (["tune", "embedding_bag", "--shape", SHAPE, "--log", "x.jsonl", "--anchor", "--runner", "offline:dir"],
     "anchored timing is for CPU tasks measured by the local runner, not the offline runner"),
])
def test_user_errors_print_one_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_bench_without_a_matching_record_exits_2(tmp_path, capsys):
    log = tmp_path / "empty.jsonl"
    log.write_text("")
    assert main(["bench", "embedding_bag", "--shape", SHAPE, "--log", str(log)]) == 2
    assert "no correct embedding_bag record" in capsys.readouterr().err


def test_best_and_export_ignore_stale_records_and_say_how_many(tmp_path, capsys):
    from autotune.task import make_task

    task = make_task("templates.faulty", "cpu", shape="n=64")
    good = [c for c in task.space if c.as_dict()["fault"] == "none"]
    log = tmp_path / "f.jsonl"
    records.append(log, [task.record(good[0], costs=(2e-6,)),
                         task.record(good[1], costs=(1e-6,), template_version="0ld0ld0ld0ld")])
    assert main(["best", "--log", str(log)]) == 0
    out = capsys.readouterr().out
    assert "1 records, 0 failed; 1 stale records ignored" in out and "best 0.002 ms" in out
    assert main(["best", "--log", str(log), "--include-stale"]) == 0
    out = capsys.readouterr().out
    assert "2 records" in out and "stale" not in out and "best 0.001 ms" in out
    stale_only = tmp_path / "s.jsonl"
    records.append(stale_only, [task.record(good[1], costs=(1e-6,), template_version="")])
    assert main(["export", "--log", str(stale_only), "--out", str(tmp_path / "pkg")]) == 2
    assert "1 stale records of older template code ignored; --include-stale" in capsys.readouterr().err


def test_list_shows_operators_fields_and_knobs(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "embedding_bag" in out and "pooling" in out and "prefetch" in out and "Software-prefetch" in out


def test_tune_best_bench_through_the_console_script(tmp_path):
    log = tmp_path / "eb.jsonl"
    exe = [sys.executable, "-m", "autotune.cli"]
    tune = subprocess.run(exe + ["tune", "embedding_bag", "--shape", SHAPE, "--trials", "2", "--batch-size", "2",
                                 "--transfer-as", "prior",  # warmed by the shipped logs' prior
                                 "--log", str(log), "--no-progress"], capture_output=True, text=True, timeout=600)
    assert tune.returncode == 0, tune.stderr
    assert "best:" in tune.stdout and len({r.config_key for r in records.load(log)}) == 2
    best = subprocess.run(exe + ["best", "--log", str(log)], capture_output=True, text=True, timeout=120)
    assert best.returncode == 0 and "best" in best.stdout
    bench = subprocess.run(exe + ["bench", "embedding_bag", "--shape", SHAPE, "--log", str(log), "--json", "--rounds", "1",
                                  "--no-roofline"],  # (the roofline's own test: test_bench.py)
                           capture_output=True, text=True, timeout=300)
    assert bench.returncode == 0, bench.stderr
    result = json.loads(bench.stdout)
    assert {"tuned_s", "torch_s", "default_s", "speedup_vs_torch", "gbps"} <= set(result)
    assert result["tuned_s"] > 0 and result["speedup_vs_torch"] == pytest.approx(result["torch_s"] / result["tuned_s"])


def test_tuning_for_a_gpu_without_one_says_how_to_measure_elsewhere(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: candidates would be measured on it")
    argv = ["tune", "embedding_bag", "--device", "cuda:sm_90", "--shape", SHAPE, "--log", str(tmp_path / "x.jsonl")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "sees no GPU" in err and "--runner offline:DIR" in err and "--dry-run" in err
    assert not (tmp_path / "x.jsonl").exists()


def test_dry_run_builds_gpu_candidates_and_shows_their_resources(tmp_path, capsys, monkeypatch, gpu_builder):
    from conftest import default_pools

    monkeypatch.chdir(tmp_path)
    argv = ["tune", "embedding_bag", "--device", "cuda:sm_90", "--shape", "rows=1000,dim=32,batch=64,pooling=1-9",
            "--trials", "2", "--dry-run"]
    with default_pools(gpu_builder):  # dry_run's own Builder(): the session's GPU pool, already started
        assert main(argv) == 0
    out = capsys.readouterr().out
    assert "the first 2 candidates (built, not measured)" in out
    assert out.count("main_kernel") == 2 and "regs" in out and "B smem" in out
    assert list(tmp_path.iterdir()) == []  # no log written
