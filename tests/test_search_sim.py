"""The offline search simulator: its surrogate follows the records it is fitted to, and its runs are tune's runs."""

import json
import math
import random
import zlib

import numpy as np
import pytest

from autotune import records
from autotune.task import make_task
from benchmarks import search_sim as sim
SHAPE = "batch=64,tables=4,dim=16"


@pytest.fixture(scope="module")
def task():
    return make_task("interaction", "cpu", shape=SHAPE)


def planted(cfg) -> float:
    """A landscape with main effects and one interaction, in seconds: what the surrogate should recover."""
    h = lambda name, value: (zlib.crc32(f"{name}={value}".encode()) % 1000) / 1000.0  # noqa: E731
    items = dict(cfg.items)
    names = sorted(items)
    log = sum(h(n, items[n]) for n in names) + 0.5 * h(names[0] + names[1], (items[names[0]], items[names[1]]))
    return 1e-3 * math.exp(log)


def planted_records(task, n: int, noise: float, seed: int = 0):
    rng = random.Random(seed)
    cfgs = list(dict.fromkeys(task.space.sample(rng) for _ in range(n)))
    return [task.record(c, costs=(planted(c) * math.exp(rng.gauss(0, noise)),)) for c in cfgs]


def test_the_surrogate_recovers_a_planted_landscape_from_noisy_records(task):
    truth, stats = sim.fit_surrogate(task, planted_records(task, 400, 0.03))
    every = list(task.space)
    assert set(truth) == set(every) and stats["space"] == len(every)
    want = np.array([planted(c) for c in every])
    got = np.array([truth[c] for c in every])
    assert sim._rank_correlation(got, want) > 0.9  # over the whole space, most of it never measured
    assert stats["held_out_rank_correlation"] > 0.8


def test_the_surrogate_refuses_too_few_records(task):
    with pytest.raises(ValueError, match="too few to fit a surrogate"):
        sim.fit_surrogate(task, planted_records(task, 6, 0.0))


def test_a_simulated_run_is_tunes_run_on_the_surrogate(task):
    truth = {c: planted(c) for c in task.space}
    xgb, rnd = sim.parse_contenders(["xgb=xgb", "random=random"])
    run = sim.simulate(task, truth, xgb, seed=1, trials=12, noise=0.02)
    assert len(run) == 12 and all(x in truth.values() for x in run)
    assert run == sim.simulate(task, truth, xgb, seed=1, trials=12, noise=0.02)  # seeded: reproducible
    assert run[0] == truth[task.space.default()]  # xgb's cold first batch starts with the default
    best = min(truth.values())
    assert sim.judge(run, best, 0.0) == (run.index(best) + 1 if best in run else None)
    assert sim.judge([2 * best, 1.04 * best], best, 0.05) == 2
    with pytest.raises(ValueError, match="program features"):
        sim.simulate(task, truth, sim.parse_contenders(["p=xgb:features=all"])[0], 0, 4, 0.0)


def test_main_prints_and_writes_each_contenders_trials(task, tmp_path, capsys):
    log = tmp_path / "cache.jsonl"
    recs = planted_records(task, 120, 0.02)
    records.append(log, recs)
    out = sim.main(["--op", "interaction", "--shape", SHAPE, "--cache", str(log), "--seeds", "2", "--trials", "8",
                    "--margins", "0.05", "0.2", "--json", str(tmp_path / "o.json")])
    printed = capsys.readouterr().out
    assert "held-out rank correlation" in printed and "random" in printed and "xgb" in printed
    saved = json.loads((tmp_path / "o.json").read_text())
    assert saved["contenders"].keys() == {"xgb", "random"}
    for row in saved["contenders"].values():
        assert len(row["0.05"]["trials_to_margin"]) == 2
        assert row["0.2"]["median"] <= row["0.05"]["median"]  # a wider margin is never reached later
    assert out["surrogate"]["records"] == len(recs)


def test_transfer_warms_the_first_batch_with_real_records_of_another_shape(task, tmp_path, capsys):
    other = make_task("interaction", "cpu", shape="batch=128,tables=4,dim=16")
    log = tmp_path / "other.jsonl"
    records.append(log, planted_records(other, 200, 0.02))  # the same landscape, measured on another shape
    truth = {c: planted(c) for c in task.space}
    ranked = sorted(truth.values())
    warm = sim.Contender("warm", "xgb", transfer=(str(log),))
    first_batch = sim.simulate(task, truth, warm, seed=3, trials=4, noise=0.0)
    assert min(first_batch) <= ranked[len(ranked) // 20]  # the model, not the default, chose it: top 5%
    with pytest.raises(ValueError, match="needs --transfer"):
        sim.simulate(task, truth, sim.Contender("w", "xgb", transfer=("<--transfer>",)), 0, 4, 0.0)

    cache = tmp_path / "cache.jsonl"
    own = planted_records(task, 120, 0.02)
    records.append(cache, own + planted_records(other, 5, 0.02))
    out = sim.main(["--op", "interaction", "--shape", SHAPE, "--cache", str(cache), "--seeds", "2", "--trials", "8",
                    "--transfer", str(cache), "--contenders", "xgb=xgb", "t8=xgb:transfer=true,batch=8"])
    assert f"{len(own)} of this workload dropped" in capsys.readouterr().out  # the answer is not in the warm-up
    assert out["contenders"].keys() == {"xgb", "t8", "xgb+transfer"}
    with pytest.raises(SystemExit):
        sim.main(["--op", "interaction", "--shape", SHAPE, "--cache", str(cache), "--contenders", "t=xgb:transfer=true"])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        sim.main(["--op", "interaction", "--shape", SHAPE, "--cache", str(cache), "--transfer", str(tmp_path / "nope")])
    assert f"transfer log {tmp_path / 'nope'} does not exist" in capsys.readouterr().err
