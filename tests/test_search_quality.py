"""The search-quality benchmark: its metrics, its contender specs, the measurement cache, and one real run."""

import dataclasses
import json
import math
import os
import statistics

import pytest

from autotune import records
from autotune.build import Built
from autotune.measure import Measured
from autotune.measure.cache import MeasurementCache
from autotune.runtime import Timing
from autotune.task import make_task
from benchmarks import search_quality
from benchmarks.lib import contenders, curves, remeasure, summary

INF = math.inf


# ---- metrics --------------------------------------------------------------------------------------------------
def test_best_so_far_and_best_after():
    curve = curves.best_so_far([INF, 3.0, 4.0, 2.0, 2.5])
    assert curve == [INF, 3.0, 3.0, 2.0, 2.0]
    assert [curves.best_after(curve, n) for n in (1, 2, 4, 5)] == [INF, 3.0, 2.0, 2.0]
    assert curves.best_after(curve, 64) == 2.0  # a run that stopped early keeps its last best
    assert curves.best_after([], 8) == INF


def test_trials_to_within_counts_ties_and_never():
    curve = [5.0, 4.0, 2.1, 2.0]
    assert curves.trials_to_within(curve, 2.1) == 3  # equal to the target is within it
    assert curves.trials_to_within(curve, 2.0999) == 4
    assert curves.trials_to_within(curve, 1.0) is None
    assert curves.trials_to_within([INF, INF], 1.0) is None


def test_median_trials_counts_never_as_twice_the_budget():
    assert curves.median_trials([None, 3, 5], trials=16) == 5
    assert curves.median_trials([None, None, 5], trials=16) == 32
    assert curves.median_trials([2, 6], trials=8) == 4  # even count: the mean of the middle two
    with pytest.raises(ValueError):
        curves.median_trials([], trials=8)


def test_summarize_reports_medians_per_checkpoint_and_the_ratio_to_random():
    both = contenders.parse_contenders(["xgb=xgb", "random=random"])
    runs = [{"contender": "xgb", "seed": 0, "curve": [4.0, 2.0, 1.0, 1.0]},
            {"contender": "xgb", "seed": 1, "curve": [3.0, 1.02, 1.02, 1.02]},
            {"contender": "random", "seed": 0, "curve": [4.0, 4.0, 3.0, 3.0]},
            {"contender": "random", "seed": 1, "curve": [2.0, 2.0, 2.0, 1.05]}]
    s = summary.summarize(runs, both, best=1.0, margin=0.05, trials=4)
    assert s["xgb"]["trials_to_margin"] == [3, 2] and s["xgb"]["median_trials_to_margin"] == 2.5
    assert s["random"]["trials_to_margin"] == [None, 4] and s["random"]["median_trials_to_margin"] == 6
    assert s["xgb"]["vs_random"] == pytest.approx(2.5 / 6) and s["random"]["vs_random"] == 1
    assert s["xgb"]["best_after"] == {"4": 1.01}
    assert curves.checkpoints(40) == [8, 16, 32, 40] and curves.checkpoints(64) == [8, 16, 32, 64]
    assert "never, 4" in summary.table(s, 4, 0.05)


def test_curve_mean_is_the_geometric_mean_of_the_tuning_curve():
    assert curves.curve_mean([2.0, 1.0], worst=8.0) == pytest.approx(2 ** 0.5)
    assert curves.curve_mean([INF, 1.0], worst=4.0) == pytest.approx(2.0)  # no correct trial yet: the worst
    assert math.isnan(curves.curve_mean([], worst=4.0))


def test_summarize_is_margin_free_too():
    """Two runs that cross the 5% line on the same trial, one hovering 4% above the best and the other at 2x
    until then: the counts at 5% tie, the mean curve and the other margins tell them apart."""
    both = contenders.parse_contenders(["xgb=xgb", "random=random"])
    runs = [{"contender": "xgb", "seed": 0, "curve": [1.04, 1.04, 1.0, 1.0]},
            {"contender": "random", "seed": 0, "curve": [2.0, 2.0, 1.0, 1.0]},
            {"contender": "xgb", "seed": 1, "curve": [INF, 1.5, 1.5, 1.5]},
            {"contender": "random", "seed": 1, "curve": [1.5, 1.5, 1.5, 1.5]}]
    s = summary.summarize(runs, both, best=1.0, margin=0.05, trials=4)
    assert s["xgb"]["trials_to_margin"] == [1, None] and s["random"]["trials_to_margin"] == [3, None]
    assert s["xgb"]["median_trials_by_margin"] == {"0.02": 5.5, "0.05": 4.5, "0.1": 4.5, "0.2": 4.5}
    assert s["random"]["median_trials_by_margin"]["0.02"] == 5.5
    assert s["xgb"]["curve_mean"][0] == pytest.approx(1.04 ** 0.5)
    assert s["xgb"]["curve_mean"][1] == pytest.approx((2.0 * 1.5 ** 3) ** 0.25)  # INF counts as the worst, 2.0
    assert s["random"]["curve_mean"][0] == pytest.approx(2 ** 0.5)
    assert s["xgb"]["seeds_below_random"] == [1, 2]
    assert s["xgb"]["curve_vs_random"] == pytest.approx(s["xgb"]["median_curve_mean"] /
                                                        s["random"]["median_curve_mean"])
    text = summary.margin_free_table(s)
    assert "| xgb | 5.5 | 4.5 | 4.5 | 4.5 |" in text and "1 of 2" in text


def test_timing_spec():
    assert remeasure.parse_timing("") == Timing()
    assert remeasure.parse_timing("number=1,repeat=7,min_repeat_ms=20,anchor=1") == Timing(1, 7, 20.0, anchor=True)
    for bad in ("repeat", "anchor=yes", "flush_l2=0"):
        with pytest.raises(ValueError, match="expected number=N"):
            remeasure.parse_timing(bad)


@pytest.mark.parametrize("spec, message", [
    ("a=random:default_first=yes", "contender a: default_first must be true or false, got 'yes'"),
    ("a=xgb:epsilon=abc", "contender a: epsilon must be a number in [0, 1], got 'abc'"),
    ("a=xgb:nonsense=1", "contender a: strategy options ['nonsense'] are not options of model_search"),
])
def test_bad_contender_options_fail_before_anything_is_measured(spec, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        search_quality.main(["--op", "quantize_rows", "--shape", "rows=9,cols=37", "--seeds", "1", "--trials", "2",
                 "--cache", str(tmp_path / "c.jsonl"), "--contenders", "random=random", spec])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "c.jsonl").exists()  # nothing was measured


def test_an_anchored_cache_keeps_its_scale_beside_it(tmp_path):
    cache = str(tmp_path / "c.jsonl")
    assert remeasure.anchor_scale(cache, Timing()) is None and remeasure.anchor_scale(None, Timing(anchor=True)) is None
    scale = remeasure.anchor_scale(cache, Timing(anchor=True))
    assert scale.path == tmp_path / "c.jsonl.anchor.json" and scale.load() is None
    scale.save({"k": 0.002})
    assert scale.load() == {"k": 0.002}
    scale.path.write_text('{"k": -1}')
    with pytest.raises(SystemExit, match="unreadable anchor scale"):
        scale.load()
    scale.path.write_text("{")
    with pytest.raises(SystemExit, match="unreadable anchor scale"):
        scale.load()


def test_spread_of_repeated_measurements():
    s = curves.spread([1.0, 1.1, 0.9, 1.0, 1.2])
    assert s["median_s"] == 1.0 and s["range_rel"] == pytest.approx(0.3) and s["iqr_rel"] == pytest.approx(0.1)
    assert curves.spread([])["n"] == 0


# ---- contender specs ----------------------------------------------------------------------------------------
def test_contender_spec_parsing():
    c = contenders.parse_contender("eps=xgb:epsilon=0.3,batch=8,features=program,pool=4,greedy=true,mode=sa")
    assert (c.label, c.strategy, c.batch, c.features) == ("eps", "xgb", 8, "program")
    assert c.options == {"epsilon": 0.3, "pool": 4, "greedy": True, "mode": "sa"}
    assert contenders.parse_contender("random=random") == contenders.Contender("random", "random")
    warm = contenders.parse_contender("hedge=xgb:transfer=true,diversity=2")
    assert warm.transfer == (contenders.WARM,) and warm.options == {"diversity": 2}  # --transfer's log, once known
    assert contenders.parse_contender("cold=xgb:transfer=false").transfer == ()
    prior = contenders.parse_contender("prior=xgb:transfer=true,transfer_as=prior")
    assert prior.transfer_as == "prior" and contenders.tune_kwargs(prior)["transfer_as"] == "prior"
    assert "transfer_as" not in contenders.tune_kwargs(warm)  # tune's default


@pytest.mark.parametrize("spec, message", [
    ("xgb", "expected LABEL=STRATEGY"), ("=xgb", "expected LABEL=STRATEGY"), ("a b=xgb", "label"),
    ("a=gradient", "unknown strategy 'gradient'"), ("a=xgb:batch=0", "batch must be"),
    ("a=xgb:batch=x", "batch must be"), ("a=xgb:features=pixels", "features must be one of"),
    ("a=xgb:epsilon", "not key=value"), ("a=xgb:epsilon=", "not key=value"),
    ("a=xgb:pool=2,pool=3", "given twice"), ("a=xgb:", "nothing after"),
    ("a=xgb:transfer=yes", "transfer must be true or false"), ("a=xgb:transfer=true,transfer=true", "given twice"),
    ("a=xgb:transfer_as=blend", "transfer_as must be one of prior, pooled"),
    ("a=xgb:transfer_as=prior,transfer_as=pooled", "given twice"),
])
def test_bad_contender_specs_say_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=message):
        contenders.parse_contender(spec)


def test_duplicate_labels_and_bad_arguments_are_rejected(capsys):
    with pytest.raises(ValueError, match="label given twice: a"):
        contenders.parse_contenders(["a=xgb", "a=random"])
    with pytest.raises(SystemExit):
        search_quality.main(["--op", "quantize_rows", "--shape", "rows=9,cols=37", "--seeds", "1", "--trials", "2",
                 "--contenders", "a=nope"])
    assert "unknown strategy 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        search_quality.main(["--op", "quantize_rows", "--shape", "rows=9,cols=37", "--seeds", "1", "--trials", "2",
                 "--contenders", "a=xgb:transfer=true"])
    assert "no --transfer LOG is given" in capsys.readouterr().err


def test_the_reference_is_put_back_into_the_moment_the_runs_were_measured_in(monkeypatch):
    """Re-measured 20% slower (a busier moment of the machine), the configs near the best tell the drift, and
    the reference is the fastest re-measured median divided by it; the lucky first draw never is."""
    from types import SimpleNamespace

    task = make_task("quantize_rows", "cpu", shape="rows=64,cols=37")
    cfgs = list(task.space)[:12]
    logged = {c.key(): 1e-3 * (1 + 0.05 * i) for i, c in enumerate(cfgs)}
    mine = [task.record(c, costs=(logged[c.key()],)) for c in cfgs]
    mine[0] = task.record(cfgs[0], costs=(0.8e-3,))  # the luckiest draw: really 1 ms, like the rest
    true = {**logged, cfgs[0].key(): 1e-3}
    asked = []

    def again(task_, builder, runner, cfg, k):
        asked.append(cfg.key())
        return [1.2 * true[cfg.key()]] * k, None

    monkeypatch.setattr(remeasure, "remeasure", again)
    cache = SimpleNamespace(inner_builder=None, inner_runner=None)
    ref = remeasure.confirm(task, cache, mine, 2, 3, None, drift=4)
    assert ref["remeasured_s"] == pytest.approx(1.2e-3) and ref["drift"] == pytest.approx(1.2)
    assert ref["latency_s"] == pytest.approx(1e-3) and ref["drift_configs"] == 4 and len(asked) == 6
    assert len(set(asked[2:]) & set(asked[:2])) == 0  # the drift is told by other configs than the fastest
    plain = remeasure.confirm(task, cache, mine, 2, 3, None)  # --drift 0: as re-measured
    assert plain["latency_s"] == pytest.approx(1.2e-3) and plain["drift"] == 1.0


def test_rescoring_judges_runs_by_medians_of_one_stretch(monkeypatch):
    """Each run's fastest configs by its own figures are rescored, keyed by config key; a run is within the margin
    once it has measured a config whose rescored median is, whatever its logged figure said: a config logged
    lucky does not count, a config logged in a slow phase (here a whole run measured 3x slower) does."""
    from types import SimpleNamespace

    task = make_task("quantize_rows", "cpu", shape="rows=64,cols=37")
    cfgs = list(task.space)[:5]
    keys = [c.key() for c in cfgs]
    runs = [{"contender": "xgb", "seed": 0, "keys": [keys[1], keys[0], keys[4]], "latencies": [3e-3, 3.6e-3, INF]},
            {"contender": "random", "seed": 0, "keys": [keys[0], keys[3], keys[2], keys[1]],
             "latencies": [0.5e-3, 4e-3, 0.8e-3, 0.9e-3]}]
    ranks = remeasure.run_fastest(runs, per_run=2)
    assert ranks == {keys[1]: 1, keys[0]: 1, keys[2]: 2}  # the failed trial and each run's slowest are not cut in
    true = {cfgs[0]: 2.0e-3, cfgs[1]: 1.0e-3, cfgs[2]: 1.5e-3}
    asked = []

    def interleaved(task_, builder, runner, chosen, k, seed=0):
        asked.append((list(chosen), runner.timing))
        return {c: ([true[c]] * k, None) for c in chosen}

    monkeypatch.setattr(remeasure, "remeasure_interleaved", interleaved)
    runner = SimpleNamespace(timing="the runner's")
    raw = {c.key(): c.to_json() for c in cfgs}
    lat = remeasure.rescore(task, SimpleNamespace(inner_builder=None, inner_runner=runner), {k: raw[k] for k in ranks},
                     k=4, timing="short")
    assert asked == [([cfgs[1], cfgs[0], cfgs[2]], "short")] and runner.timing == "the runner's"  # restored
    assert lat == {c.key(): [true[c]] * 4 for c in cfgs[:3]}
    medians = {k: statistics.median(v) for k, v in lat.items()}
    assert summary.rescored_curve([keys[3], keys[0], keys[1]], medians) == [INF, 2.0e-3, 1.0e-3]
    both = contenders.parse_contenders(["xgb=xgb", "random=random"])
    s = summary.summarize_rescored(runs, both, medians, 0.05, trials=4)
    assert s["xgb"]["trials_to_margin"] == [1] and s["random"]["trials_to_margin"] == [4]
    assert s["xgb"]["vs_random"] == 0.25 and s["random"]["median_trials_by_margin"]["0.2"] == 4
    assert "| xgb | 1 | 1 | 0.25 |" in summary.rescored_table(s, 0.05)


def test_split_half_is_how_far_two_halves_of_the_rounds_disagree():
    steady = [1.0, 1.0, 1.0, 1.0]
    odd_slow = [1.1, 1.0, 1.1, 1.0, 1.1, 1.0]  # odd rounds 1.1, even 1.0: 10% apart, relative to their mean
    assert remeasure.split_half({"a": steady}) == 0.0
    assert remeasure.split_half({"a": odd_slow}) == pytest.approx(0.1 / 1.05)
    assert remeasure.split_half({"a": steady, "b": odd_slow, "c": odd_slow}) == pytest.approx(0.1 / 1.05)
    assert math.isnan(remeasure.split_half({"a": [1.0, 2.0, 3.0]}))  # too few rounds to split


# ---- the measurement cache ----------------------------------------------------------------------------------
class FakeBuilder:
    def __init__(self):
        self.built = []

    def build(self, task, configs):
        self.built += [c.key() for c in configs]
        return [Built(c, f"/nonexistent/{i}.so", 0.25) for i, c in enumerate(configs)]


class FakeRunner:
    """Costs from a counter, so a second measurement of a config would differ from the first."""

    def __init__(self, harness_for=()):
        self.calls, self.n, self.harness_for = [], 0, set(harness_for)

    def measure(self, task, builts):
        self.calls.append([b.config.key() for b in builts])
        out = []
        for b in builts:
            self.n += 1
            kind = "harness" if b.config.key() in self.harness_for else None
            out.append(Measured(b, () if kind else (self.n * 1e-6,), kind, "x" if kind else None))
        return out


@pytest.fixture
def faulty():
    task = make_task("templates.faulty", "cpu", shape="n=64")
    return task, list(task.space)


def _through(cache, task, cfgs):
    return cache.runner.measure(task, cache.builder.build(task, cfgs))


def test_a_hit_neither_builds_nor_measures_and_returns_the_stored_outcome(tmp_path, faulty):
    task, cfgs = faulty
    builder, runner = FakeBuilder(), FakeRunner()
    cache = MeasurementCache(tmp_path / "c.jsonl", builder, runner)
    first = _through(cache, task, cfgs[:3])
    again = _through(cache, task, [cfgs[1], cfgs[3], cfgs[0]])
    assert builder.built == [c.key() for c in cfgs[:3]] + [cfgs[3].key()]
    assert runner.calls == [[c.key() for c in cfgs[:3]], [cfgs[3].key()]]
    assert [m.costs for m in again] == [first[1].costs, (4e-6,), first[0].costs]
    assert [m.built.config for m in again] == [cfgs[1], cfgs[3], cfgs[0]]
    assert again[0].built.lib is None and again[0].built.build_s == 0.25
    assert (cache.hits, cache.misses) == (2, 4)
    cache.builder.close(), cache.runner.close()  # what a tuner may do: the workers stay
    assert len(records.load_many([tmp_path / "c.jsonl"])) == 4


def test_the_cache_persists_skips_corrupt_lines_and_never_caches_harness_failures(tmp_path, faulty):
    task, cfgs = faulty
    path = tmp_path / "c.jsonl"
    first = _through(MeasurementCache(path, FakeBuilder(), FakeRunner(harness_for={cfgs[2].key()})), task, cfgs[:3])
    assert first[2].error_kind == "harness"
    with open(path, "a") as f:
        f.write('{"op": "half a line\n')
    builder, runner = FakeBuilder(), FakeRunner()
    with pytest.warns(records.CorruptLogWarning):
        cache = MeasurementCache(path, builder, runner)
    replay = _through(cache, task, cfgs[:3])
    assert [m.costs for m in replay[:2]] == [first[0].costs, first[1].costs]
    assert runner.calls == [[cfgs[2].key()]] and replay[2].costs == (1e-6,)  # the harness failure measured anew


def test_records_of_another_template_version_do_not_hit(tmp_path, faulty):
    task, cfgs = faulty
    path = tmp_path / "c.jsonl"
    records.append(path, [task.record(cfgs[0], costs=(1.0,), template_version="0ld")])
    runner = FakeRunner()
    (m,) = _through(MeasurementCache(path, FakeBuilder(), runner), task, cfgs[:1])
    assert runner.calls == [[cfgs[0].key()]] and m.costs == (1e-6,)


def test_a_hit_carries_the_program_features_of_its_build(tmp_path, faulty):
    task, cfgs = faulty

    class FeaturingBuilder(FakeBuilder):
        def build(self, task, configs):
            return [dataclasses.replace(b, features={"p.stores": 2.0}) for b in super().build(task, configs)]

    path = tmp_path / "c.jsonl"
    _through(MeasurementCache(path, FeaturingBuilder(), FakeRunner()), task, cfgs[:1])
    (m,) = _through(MeasurementCache(path, FakeBuilder(), FakeRunner()), task, cfgs[:1])
    assert m.built.features == {"p.stores": 2.0}


def test_picks_are_re_measured_in_interleaved_rounds(tmp_path, faulty):
    task, cfgs = faulty

    class FileBuilder:
        def build(self, task, configs):  # the third config does not build
            out = []
            for i, c in enumerate(configs):
                lib = tmp_path / f"{i}.so"
                if i < 2:
                    lib.write_bytes(b"lib")
                out.append(Built(c, str(lib), 0.1) if i < 2 else Built(c, None, 0.1, "build", "no"))
            return out

    class DeletingRunner(FakeRunner):  # as the real runners: what was measured is deleted
        def measure(self, task, builts):
            for b in builts:
                os.unlink(b.lib)
            return super().measure(task, builts)

    runner = DeletingRunner()
    timed = remeasure.remeasure_interleaved(task, FileBuilder(), runner, [cfgs[0], cfgs[1], cfgs[2], cfgs[0]], k=3)
    assert set(timed) == set(cfgs[:3])
    rounds = [tuple(sorted(a + b)) for a, b in zip(runner.calls[0::2], runner.calls[1::2])]
    assert rounds == [tuple(sorted([cfgs[0].key(), cfgs[1].key()]))] * 3  # every round times each config once
    assert len(timed[cfgs[0]][0]) == len(timed[cfgs[1]][0]) == 3 and timed[cfgs[2]] == ([], "build: no")
    assert list(tmp_path.iterdir()) == []  # the libraries and their copies are gone


def test_summarize_reports_each_seeds_pick_re_measured():
    both = contenders.parse_contenders(["xgb=xgb", "random=random"])
    a, b = {"t": 1}, {"t": 2}
    runs = [{"contender": "xgb", "seed": 0, "curve": [1.0], "pick": a},
            {"contender": "xgb", "seed": 1, "curve": [1.0], "pick": b},
            {"contender": "random", "seed": 0, "curve": [1.0], "pick": b},
            {"contender": "random", "seed": 1, "curve": [INF], "pick": None}]
    s = summary.summarize(runs, both, best=1.0, margin=0.05, trials=1,
                     picks={remeasure.pick_key(a): 2.0, remeasure.pick_key(b): 4.0})
    assert s["xgb"]["pick_s"] == [2.0, 4.0] and s["xgb"]["median_pick_s"] == 3.0
    assert s["random"]["pick_s"] == [4.0, None] and s["random"]["median_pick_s"] == 4.0
    assert s["xgb"]["pick_vs_random"] == 0.75
    assert "| 3.000e+03 |" not in summary.margin_free_table(s) and "| 3000.000 | 0.75 |" in summary.margin_free_table(s)
    assert summary.summarize(runs, both, best=1.0, margin=0.05, trials=1)["xgb"]["median_pick_s"] is None


def test_transfer_log_drops_the_benchmarked_workload(tmp_path):
    task = make_task("quantize_rows", "cpu", shape="rows=9,cols=37")
    other = make_task("quantize_rows", "cpu", shape="rows=64,cols=37")
    cfg = task.space.default()
    src = tmp_path / "src.jsonl"
    records.append(src, [task.record(cfg, costs=(1.0,)), other.record(cfg, costs=(2.0,)),
                         other.record(cfg, costs=(3.0,))])
    kept, dropped, by = contenders.filter_transfer(src, task, tmp_path / "out.jsonl")
    assert (kept, dropped) == (2, 1) and list(by.values()) == [2] and "rows=64" in next(iter(by))
    assert {r.workload_key for r in records.load(tmp_path / "out.jsonl")} == {other.workload_key}
    with pytest.raises(ValueError, match="does not exist"):
        contenders.filter_transfer(tmp_path / "none.jsonl", task, tmp_path / "x.jsonl")


# ---- one real run -------------------------------------------------------------------------------------------
def test_a_tiny_real_benchmark_writes_its_figures(tmp_path, capsys, monkeypatch, cpu_builder, local_runner):
    import search_spaces
    from conftest import RunnerView, SharedPool

    # the benchmark's Builder() and LocalRunner(timing): the session's pool and measure worker, not fresh ones
    monkeypatch.setattr(search_quality, "Builder", lambda: SharedPool(cpu_builder))
    monkeypatch.setattr(search_quality, "LocalRunner", lambda timing, **_: RunnerView(local_runner, timing))

    shape = search_spaces.get("quantize_rows").TEST_SHAPE
    other = make_task("quantize_rows", "cpu", shape="rows=64,cols=37")
    warm = tmp_path / "warm.jsonl"
    records.append(warm, [other.record(c, costs=(1e-5 * (i + 1),)) for i, c in enumerate(list(other.space)[:5])])
    out = search_quality.main([
        "--op", "quantize_rows", "--shape", shape, "--seeds", "2", "--trials", "4", "--noise", "2",
        "--confirm", "2", "--transfer", str(warm), "--cache", str(tmp_path / "cache.jsonl"),
        "--contenders", "xgb=xgb", "random=random", "hedge=xgb:transfer=true,diversity=2",
        "--timing", "number=1,repeat=2,min_repeat_ms=1", "--rescore", "4", "--rescore-top", "2",
        "--json", str(tmp_path / "o.json"), "--png", str(tmp_path / "o.png")])
    printed = capsys.readouterr().out
    assert "| xgb+transfer |" in printed and "margin" in printed
    d = json.loads((tmp_path / "o.json").read_text())
    assert set(d["contenders"]) == {"xgb", "random", "hedge", "xgb+transfer"}
    assert [(r["seed"], r["contender"]) for r in d["runs"]] == [
        (s, c) for s in (0, 1) for c in ("xgb", "random", "hedge", "xgb+transfer")]  # interleaved, seed-major
    hedge = d["contenders"]["hedge"]
    assert hedge["transfer"] == d["contenders"]["xgb+transfer"]["transfer"] != []
    assert hedge["options"] == {"diversity": 2}
    assert all(len(r["curve"]) == 4 and r["curve"] == sorted(r["curve"], reverse=True) for r in d["runs"])
    assert d["best"]["latency_s"] == min(x for r in d["runs"] for x in r["curve"])
    assert d["transfer"]["kept"] == 5 and d["transfer"]["dropped_own_workload"] == 0
    assert d["checkpoints"] == [4] and set(d["contenders"]["xgb"]["best_after"]) == {"4"}
    assert all(len(d["noise"][w]["latencies"]) == 2 for w in ("default", "best"))
    assert d["margin"]["used"] >= max(0.05, d["noise"]["best"]["iqr_rel"]) - 1e-12
    # the reference: the least median of re-measurements of the 2 configs logged fastest (the best's own: --noise)
    assert d["reference"]["configs"] == 2 and d["reference"]["k"] == 5
    assert d["reference"]["remeasured_s"] <= statistics.median(d["noise"]["best"]["latencies"])
    assert d["reference"]["latency_s"] == pytest.approx(d["reference"]["remeasured_s"] / d["reference"]["drift"])
    # every config was measured once, however many runs proposed it
    assert d["cache"]["measured"] == len({json.dumps(r.config, sort_keys=True)
                                          for r in records.load(tmp_path / "cache.jsonl")})
    assert (tmp_path / "o.png").stat().st_size > 1000
    # every run's pick was re-measured (--picks, default 5) and each contender's median pick is one of them
    assert set(d["picks"]) == {remeasure.pick_key(r["pick"]) for r in d["runs"]}
    assert all(d["contenders"][c]["median_pick_s"] > 0 for c in d["contenders"])
    assert out["best"]["latency_s"] == d["best"]["latency_s"]
    # --rescore: each run's 2 fastest configs, 4 rounds each, and every contender judged by their medians
    r = d["rescored"]
    assert 2 <= r["configs"] <= 16 and r["margin"] >= 0.05 and r["best_s"] == min(r["medians"].values())
    assert set(r["contenders"]) == set(d["contenders"]) and "rescored:" in printed
    assert r["run_ranks_within_margin"] and all(1 <= i <= 2 for i in r["run_ranks_within_margin"])
    assert all(len(run["keys"]) == 4 for run in d["runs"])
