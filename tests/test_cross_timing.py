"""benchmarks.cross_timing: the chained state feeds each call's output to the next as its x, over the batch's
one x0; a small run prints every config in the three states."""

from __future__ import annotations

import json

import pytest
import torch

from autotune.task import make_task
from benchmarks import cross_timing


def test_chained_calls_take_the_previous_output_as_x_and_the_batch_x0_throughout():
    calls = []

    def kernel(a, x0, x):
        calls.append((x0, x))
        return x + 1

    tensors = (torch.zeros(2), torch.zeros(2, 3), torch.zeros(2, 3))
    sets = [(torch.zeros(2), torch.full((2, 3), float(i)), torch.zeros(2, 3)) for i in range(cross_timing.BATCHES)]
    cross_timing.states(kernel, tensors, sets)["chained"]()
    assert len(calls) == cross_timing.BATCHES * cross_timing.LAYERS
    for b in range(cross_timing.BATCHES):
        batch = calls[b * cross_timing.LAYERS:(b + 1) * cross_timing.LAYERS]
        x0 = batch[0][0]
        assert torch.equal(x0, sets[b][1]) and x0 is not sets[b][1]  # a copy, as the model's cat writes x0
        assert all(c[0] is x0 for c in batch) and batch[0][1] is x0
        assert [float(c[1][0, 0]) for c in batch] == [b, b + 1, b + 2]


@pytest.mark.parametrize("op", cross_timing.OPS)
def test_a_small_run_prints_each_config_in_the_three_states(op, capsys):
    shape = "m=13,k=40,n=24"
    cfg = make_task(op, "cpu", shape=shape).space.default()
    cross_timing.main(["--op", op, "--shape", shape, "--config", json.dumps(cfg.to_json()), "--rounds", "1"])
    out = capsys.readouterr().out
    assert out.startswith(f"{op} ") and "| config | repeated | fresh | chained |" in out and f"| {cfg} | " in out


def test_nothing_to_time_is_refused():
    with pytest.raises(SystemExit):
        cross_timing.main(["--shape", "m=13,k=40,n=24"])


@pytest.mark.parametrize("argv, says", [
    (["--config", "{not json"], "Expecting property name"),
    (["--config", '{"m_block": 128}'], "config knobs do not match the space"),
    (["--config", "3"], "--config takes a JSON object of knob values, got ['3']"),
    (["--log", "/nonexistent/cross.jsonl"], "log not found: /nonexistent/cross.jsonl"),
    (["--config", "{}", "--top", "0"], "--top and --rounds take values >= 1"),
])
def test_bad_arguments_are_refused_saying_why(argv, says, capsys):
    with pytest.raises(SystemExit):
        cross_timing.main(["--shape", "m=13,k=40,n=24", *argv])
    assert says in capsys.readouterr().err


def test_a_log_without_the_task_is_refused(tmp_path, capsys):
    log = tmp_path / "empty.jsonl"
    log.write_text("")
    with pytest.raises(SystemExit):
        cross_timing.main(["--shape", "m=13,k=40,n=24", "--log", str(log)])
    assert "holds no correct record of qmatmul_cross" in capsys.readouterr().err
