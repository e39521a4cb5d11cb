"""benchmarks.embedding_stage without tuning or timing: its shapes are valid workloads, and its table judges each
target by the median of the benches' ratios, saying where a contender was not timed."""

from __future__ import annotations

import pytest

from autotune.task import make_task
from benchmarks import embedding_stage as stage


@pytest.mark.parametrize("name", sorted(stage.SHAPES))
def test_every_shape_is_a_workload_of_its_op(name):
    s = stage.SHAPES[name]
    task = make_task(s.op, "cpu", shape=s.shape)
    assert task.workload.dtype == s.dtype
    assert s.torch in ("torch", "torch_per_table") and s.targets


def _bench(tuned_ms: float, **paths_ms: float) -> dict:
    return {"tuned_s": tuned_ms / 1e3, "baselines_isolated": {k: v / 1e3 for k, v in paths_ms.items()},
            "roofline": {"share": 0.9}}


def test_a_target_is_judged_by_the_median_of_the_benches_ratios():
    s = stage.Shape("embedding_bag", "rows=10,dim=8,batch=2,pooling=1", (("torch", 1.1), ("fbgemm_tbe_float32", 2.0)))
    runs = [_bench(1.0, torch=1.2), _bench(1.0, torch=1.0), _bench(2.0, torch=2.4)]  # ratios 1.2, 1.0, 1.2
    assert stage.median_ratio(runs, "torch") == pytest.approx(1.2)
    row = stage.summary_row("x", s, runs)
    assert "torch 1.20x (>= 1.1: yes)" in row[5]
    assert "fbgemm_tbe_float32: not timed" in row[5]  # FBGEMM absent: said, not judged
    assert row[2] == "1.000 1.000 2.000" and row[3] == "1.200" and row[-1] == "90%-90%"
    slow = [_bench(1.0, torch=1.05)] * 3
    assert "(>= 1.1: no)" in stage.summary_row("x", s, slow)[5]


def test_unknown_shapes_and_counts_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        stage.main(["--log-dir", str(tmp_path), "--only", "zipf,nope"])
    assert "unknown shape(s) ['nope']" in capsys.readouterr().err
    for bad in (["--trials", "-1"], ["--benches", "0"]):
        with pytest.raises(SystemExit):
            stage.main(["--log-dir", str(tmp_path), *bad])
        assert "--trials must be >= 0 and --benches >= 1" in capsys.readouterr().err
