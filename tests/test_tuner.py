"""End-to-end tuning on tiny shapes: a real loop with real workers, small enough for CI."""

import dataclasses
import functools
import json
import random

import pytest
import torch

import autotune
from autotune import records
from autotune.measure import Timing
from autotune.task import make_task
from autotune.tuner import tune

FAST = Timing(number=1, repeat=2, min_repeat_ms=1)
SHAPE = "rows=500,dim=16,batch=32,pooling=0-12,dist=zipf:1.1"


@pytest.fixture(scope="module")
def workers(cpu_builder, local_runner):
    """The session's build pool (Builder(timeout=60)'s settings) and its measure worker, measuring with FAST and a
    20 s timeout: the same settings as a pool and runner of this module's own, without their start-up."""
    from conftest import RunnerView

    return cpu_builder, RunnerView(local_runner, FAST, timeout=20)


def test_short_run_logs_a_best_config_that_rebuilds_and_matches_torch(tmp_path, workers):
    log = tmp_path / "eb.jsonl"
    task = make_task("embedding_bag", "cpu", shape=SHAPE)
    # 2 batches of 4 (each proposed by the cost model, warm from the shipped logs, and reranked on program
    # features), then the 3 leaders again
    res = tune(task, trials=8, log=log, batch_size=4, builder=workers[0], runner=workers[1], progress=False)
    assert res.measured == 8 and res.best is not None and res.best.ok
    assert len(res.curve) == 8 and res.curve == sorted(res.curve, reverse=True)
    logged = list(records.load(log))
    assert len(logged) == 8 + 3 and all(r.ok for r in logged)
    assert len({r.config_key for r in logged}) == 8  # the 3 fastest were measured once more, before stopping
    leaders = sorted(logged[:8], key=lambda r: r.latency)[:3]
    assert {r.config_key for r in logged[8:]} == {r.config_key for r in leaders}
    pooled = records.best(logged, task.op, task.workload_key, task.device.name)  # leaders' costs pooled
    assert (res.best.config_key, sorted(res.best.costs)) == (pooled.config_key, sorted(pooled.costs))
    assert len(pooled.costs) in (len(leaders[0].costs), 2 * len(leaders[0].costs))
    kern = autotune.kernel("embedding_bag", "cpu", log=log, shape=SHAPE)
    assert kern.config == task.space.from_json(res.best.config)
    tensors = task.template.inputs(task.workload, seed=7)
    torch.testing.assert_close(kern(*tensors), task.template.reference(task.workload, *tensors))


def test_resume_measures_nothing_twice(tmp_path, workers):
    log = tmp_path / "eb.jsonl"
    task = make_task("embedding_bag", "cpu", shape=SHAPE)
    first = tune(task, trials=4, log=log, batch_size=4, strategy="random", builder=workers[0],
                 runner=workers[1], progress=False)
    second = tune(task, trials=4, log=log, batch_size=4, strategy="xgb", builder=workers[0],
                  runner=workers[1], progress=False)
    assert first.resumed == 0 and second.resumed == 4
    keys = [r.config_key for r in records.load(log)]
    assert len(keys) == 8 + 2 * 3 and len(set(keys)) == 8  # each run measured its 3 leaders again


def test_resume_on_a_nearly_exhausted_space_stops_cleanly(tmp_path, workers):
    # the crashing and the hanging config pre-recorded (as the tests below do): measuring them is the test
    # below's subject, and the hang would cost the runner's whole timeout (20 s)
    log = tmp_path / "f.jsonl"
    task = make_task("templates.faulty", "cpu", shape="n=64")
    good = [c for c in task.space if c.as_dict()["fault"] == "none"]
    (crash,), (hang,) = ([c for c in task.space if c.as_dict()["fault"] == f] for f in ("crash", "hang"))
    records.append(log, [task.record(c, costs=(1e-6,)) for c in good] + [
        task.record(crash, error_kind="crash", error="x"), task.record(hang, error_kind="timeout", error="x")])
    res = tune(task, trials=50, log=log, strategy="random", builder=workers[0], runner=workers[1],
               progress=False)
    assert res.resumed == 4 and res.measured == len(task.space) - 4 == 2  # the two wrong ones, then no more


def test_crashing_hanging_and_wrong_candidates_become_error_records(tmp_path, cpu_builder, local_runner):
    from conftest import RunnerView

    log = tmp_path / "faulty.jsonl"
    task = make_task("templates.faulty", "cpu", shape="n=64")
    res = tune(task, trials=100, log=log, strategy="random", batch_size=8, builder=cpu_builder,
               runner=RunnerView(local_runner, FAST, timeout=4), progress=False)
    kinds = {json.dumps(r.config, sort_keys=True): r.error_kind for r in records.load(log)}
    assert res.measured == 6 == len(kinds)
    by_fault = {}
    for cfg, kind in kinds.items():
        by_fault.setdefault(json.loads(cfg)["fault"], set()).add(kind)
    assert by_fault == {"none": {None}, "wrong": {"wrong"}, "crash": {"crash"}, "hang": {"timeout"}}
    assert res.best is not None and res.best.config["fault"] == "none"


def test_early_stopping_and_bad_arguments(tmp_path, workers):
    task = make_task("templates.faulty", "cpu", shape="n=64")
    good_only = tmp_path / "g.jsonl"
    with pytest.raises(ValueError, match="strategy"):
        tune(task, trials=4, log=good_only, strategy="nope")
    with pytest.raises(ValueError, match="trials"):
        tune(task, trials=0, log=good_only)


@pytest.mark.parametrize("op, shape", [("qmatmul", "m=24,k=40,n=24,relu=1"),
                                       ("qmatmul", "m=8,k=16,n=8,mode=weight_only")])
def test_short_run_of_other_templates(op, shape, tmp_path, workers):
    log = tmp_path / f"{op}.jsonl"
    task = make_task(op, "cpu", shape=shape)
    res = tune(task, trials=6, log=log, batch_size=6, builder=workers[0], runner=workers[1], progress=False)
    assert res.measured == 6 and res.best is not None
    kern = autotune.kernel(op, "cpu", log=log, shape=shape)
    tensors = task.template.inputs(task.workload, seed=3)
    rtol, atol = task.template.tolerance(task.workload)
    torch.testing.assert_close(kern(*tensors), task.template.reference(task.workload, *tensors), rtol=rtol, atol=atol)


# ---- template versions, retries and harness failures (faulty's 6 configs; none of them hangs or crashes here:
# those two are pre-recorded, so every run below measures only correct or wrong candidates) --------------------
def _configs(task):
    return {(c.as_dict()["fault"], c.as_dict()["lanes"]): c for c in task.space}


def _log(tmp_path, task, **special):
    """A log with a record for each config: `special[fault_lanes]` gives (error kind or None, template version)."""
    log = tmp_path / "f.jsonl"
    recs = []
    for (fault, lanes), cfg in _configs(task).items():
        kind, version = special.get(f"{fault}{lanes}", (None if fault == "none" else "wrong", None))
        fields = {"costs": (1e-9,)} if kind is None else {"error_kind": kind, "error": "x"}
        recs.append(task.record(cfg, **fields, **({} if version is None else {"template_version": version})))
    records.append(log, recs)
    return log


def _new(log, before):
    return {(r.config["fault"], r.config["lanes"]): r for r in list(records.load(log))[before:]}


def test_a_stale_record_is_measured_again_unless_include_stale(tmp_path, workers):
    # confirm=0 in these resume tests: each tune's closing re-measurement of its leaders would add records
    task = make_task("templates.faulty", "cpu", shape="n=64")
    log = _log(tmp_path, task, none4=(None, "0ld0ld0ld0ld"), none1=("wrong", None))
    res = tune(task, trials=10, log=log, strategy="random", builder=workers[0], runner=workers[1], progress=False, confirm=0)
    assert res.resumed == 5 and res.measured == 1
    (new,) = _new(log, 6).values()
    assert new.config["lanes"] == 4 and new.ok and new.template_version == task.template_version
    assert res.best == new and new.latency > 1e-9  # the stale record's (impossible) timing never counts
    # Resumed with include_stale, the same stale record counts as measured, and its timing as the best.
    log2 = _log(tmp_path / "b", task, none4=(None, "0ld0ld0ld0ld"), none1=("wrong", None))
    res2 = tune(task, trials=10, log=log2, strategy="random", builder=workers[0], runner=workers[1], confirm=0,
                progress=False, include_stale=True)
    assert res2.measured == 0 and res2.resumed == 6 and res2.best.template_version == "0ld0ld0ld0ld"


def test_kernel_ignores_stale_records_unless_include_stale(tmp_path):
    task = make_task("templates.faulty", "cpu", shape="n=64")
    log = _log(tmp_path, task, none4=(None, "0ld0ld0ld0ld"), none1=(None, ""))
    with pytest.raises(autotune.NoTunedKernel, match="2 correct records of older template code"):
        autotune.kernel("templates.faulty", "cpu", log=log, shape="n=64")
    k = autotune.kernel("templates.faulty", "cpu", log=log, shape="n=64", include_stale=True)
    x = torch.arange(64, dtype=torch.float32)
    assert k.config.as_dict()["fault"] == "none"
    torch.testing.assert_close(k(x), x + 1)


def test_retry_errors_measures_only_those_kinds_again(tmp_path, workers):
    task = make_task("templates.faulty", "cpu", shape="n=64")
    special = dict(none4=("timeout", None), wrong1=("runtime", None), wrong4=("build", None),
                   crash1=("crash", None), hang1=("crash", None))
    log = _log(tmp_path, task, **special)
    with pytest.raises(ValueError, match="unknown error kind 'gremlins'; known: invalid"):
        tune(task, trials=4, log=log, retry_errors=("timeout", "gremlins"))
    res = tune(task, trials=10, log=log, strategy="random", builder=workers[0], runner=workers[1], confirm=0,
               progress=False, retry_errors=("timeout", "runtime"))
    new = _new(log, 6)
    assert res.resumed == 4 and res.measured == 2 and set(new) == {("none", 4), ("wrong", 1)}
    assert new["none", 4].ok and new["wrong", 1].error_kind == "wrong"
    # Retried once, they are measured: a plain resume measures nothing.
    again = tune(task, trials=10, log=log, strategy="random", builder=workers[0], runner=workers[1], progress=False, confirm=0)
    assert again.measured == 0


def test_harness_failures_are_measured_again_on_resume(tmp_path, workers):
    task = make_task("templates.faulty", "cpu", shape="n=64")
    log = _log(tmp_path, task, none4=("harness", None))
    res = tune(task, trials=10, log=log, strategy="random", builder=workers[0], runner=workers[1], progress=False, confirm=0)
    assert res.resumed == 5 and res.measured == 1 and set(_new(log, 6)) == {("none", 4)}


def test_the_cost_model_trains_on_the_current_version_only_unless_include_stale():
    import search_spaces
    from autotune import records
    from cost_model import TrainingSet

    task = make_task("templates.faulty", "cpu", shape="n=64")
    cfgs = list(task.space)
    recs = [task.record(cfgs[0], costs=(1e-6,)), task.record(cfgs[1], costs=(2e-6,), template_version="0ld"),
            task.record(cfgs[2], costs=(3e-6,), template_version=""), task.record(cfgs[3], error_kind="harness")]

    def training(version):
        return TrainingSet(task.op, task.device.name, "knobs", search_spaces.get, version)

    current, every = training(records.current_version), training(lambda op, device: None)
    current.add(recs)
    every.add(recs)
    assert current.latencies == [1e-6] and every.latencies == [1e-6, 2e-6, 3e-6]


def test_transfer_warms_the_first_batch_and_cold_starts_spread_out(tmp_path, workers, monkeypatch):
    """With a log of another shape the very first batch is the model's; with transfer=() it is the spread
    design, the default config first; unknown transfer logs and strategy options are errors."""
    from autotune import search

    seen_scores = []
    real = search.model_search

    @functools.wraps(real)  # keeps model_search's signature: its declared options and `candidates`
    def spy(space, seen, n, rng, score=None, elites=(), **kw):
        seen_scores.append(score is not None)
        return real(space, seen, n, rng, score, elites, **kw)

    monkeypatch.setitem(search.STRATEGIES, "xgb", dataclasses.replace(search.STRATEGIES["xgb"], propose=spy))
    other = make_task("embedding_bag", "cpu", shape="rows=400,dim=16,batch=32,pooling=0-12,dist=zipf:1.1")
    source = tmp_path / "other.jsonl"
    tune(other, trials=8, log=source, strategy="random", batch_size=8, builder=workers[0], runner=workers[1],
         progress=False, confirm=0)
    task = make_task("embedding_bag", "cpu", shape=SHAPE)
    cold = tune(task, trials=4, log=tmp_path / "cold.jsonl", batch_size=4, transfer=(), builder=workers[0],
                runner=workers[1], progress=False, confirm=0)
    assert seen_scores == [False] and cold.trials[0].config_key == task.space.default().key()
    seen_scores.clear()
    tune(task, trials=4, log=tmp_path / "warm.jsonl", batch_size=4, transfer=[source], builder=workers[0],
         runner=workers[1], progress=False, confirm=0)
    assert seen_scores == [True]
    with pytest.raises(FileNotFoundError, match="transfer logs not found"):
        tune(task, trials=1, log=tmp_path / "x.jsonl", transfer=[tmp_path / "missing.jsonl"], progress=False)
    with pytest.raises(ValueError, match="not options"):
        tune(task, trials=1, log=tmp_path / "x.jsonl", options={"epsilonn": 0.2}, progress=False)
    with pytest.raises(ValueError, match="feature set"):
        tune(task, trials=1, log=tmp_path / "x.jsonl", features="knob", progress=False)
    with pytest.raises(ValueError, match="transfer_as must be one of prior, pooled, got 'blend'"):  # any strategy
        tune(task, trials=1, log=tmp_path / "x.jsonl", strategy="random", transfer_as="blend", progress=False)


@pytest.mark.parametrize("strategy", ["random", "xgb"])
def test_a_proposer_asks_for_what_the_log_lacks_and_learns_what_it_is_told(tmp_path, strategy):
    """Ask and tell without measuring (how a lent GPU's second run is chosen): the log's configs are never
    asked for, nor what was asked before, and told records train the model."""
    from autotune.tuner import Proposer
    from autotune.tuning_log import TuningLog

    task = make_task("embedding_bag", "cpu", shape=SHAPE)
    log = tmp_path / "eb.jsonl"
    known = [task.space.default()] + [task.space.sample(random.Random(i)) for i in range(6)]
    known = list(dict.fromkeys(known))
    records.append(log, [task.record(c, costs=(1e-3 * (i + 1),)) for i, c in enumerate(known)])
    proposer = Proposer(task, TuningLog(log), strategy, seed=0, transfer=())
    first = proposer.ask(5)
    assert len(first) == 5 and not set(first) & set(known)
    second = proposer.ask(5)
    assert not set(second) & (set(first) | set(known))
    if strategy == "xgb":
        assert proposer.model.trained  # from the log's records alone (transfer=())
        fitted = len(proposer.model.main.training.latencies)
        proposer.tell([task.record(c, costs=(5e-4,)) for c in first])
        assert len(proposer.model.main.training.latencies) == fitted + 5


def test_a_new_shape_first_measures_what_won_on_the_operators_other_shapes(tmp_path):
    """Few trials: the first model-guided batch of a task opens with the best config of each other shape of
    its operator in the log (a quarter of the batch at most), then the model's picks; a task with its own
    measurements, or a strategy without a model, gets none."""
    from autotune.tuner import Proposer
    from autotune.tuning_log import TuningLog

    other = make_task("embedding_bag", "cpu", shape="rows=400,dim=16,batch=32,pooling=0-12,dist=zipf:1.1")
    task = make_task("embedding_bag", "cpu", shape=SHAPE)
    cfgs = list(dict.fromkeys(other.space.sample(random.Random(i)) for i in range(12)))
    winner = cfgs[5]
    log = tmp_path / "eb.jsonl"
    records.append(log, [other.record(c, costs=(1e-4 if c == winner else 1e-3,)) for c in cfgs])
    proposer = Proposer(task, TuningLog(log), "xgb", seed=0, transfer=())
    assert proposer.seeds == [task.space.from_json(winner.to_json())]
    first = proposer.ask(8)
    assert first[0] == task.space.from_json(winner.to_json())
    assert len(first) == len(set(first)) == 8 and proposer.seeds == []  # only the first batch
    assert Proposer(task, TuningLog(log), "random", seed=0, transfer=()).seeds == []
    records.append(log, [task.record(task.space.default(), costs=(2e-3,))])
    assert Proposer(task, TuningLog(log), "xgb", seed=0, transfer=()).seeds == []


def test_a_task_measured_under_older_template_code_first_measures_its_old_winner(tmp_path):
    """A template change stales a task's records (measured again), but its old winner opens the first batch,
    ahead of the other shapes' winners: with 8 trials a re-tune otherwise may never meet it again."""
    from dataclasses import replace

    from autotune.tuner import Proposer
    from autotune.tuning_log import TuningLog

    other = make_task("embedding_bag", "cpu", shape="rows=400,dim=16,batch=32,pooling=0-12,dist=zipf:1.1")
    task = make_task("embedding_bag", "cpu", shape=SHAPE)
    cfgs = list(dict.fromkeys(task.space.sample(random.Random(i)) for i in range(12)))
    old_winner, their_winner = cfgs[3], other.space.from_json(cfgs[7].to_json())
    log = tmp_path / "eb.jsonl"
    records.append(log, [replace(task.record(c, costs=(1e-4 if c == old_winner else 1e-3,)), template_version="0ld")
                         for c in cfgs] + [other.record(their_winner, costs=(1e-5,))])
    proposer = Proposer(task, TuningLog(log), "xgb", seed=0, transfer=())
    assert proposer.seeds[:2] == [old_winner, task.space.from_json(their_winner.to_json())]
    assert proposer.ask(8)[0] == old_winner


def test_an_operator_whose_space_holds_anothers_seeds_it_with_the_extra_knobs_dropped(tmp_path):
    """qmatmul's knobs are qmatmul_requant's and n_block: a qmatmul winner seeds a requant task (tune_model
    tunes the model's int8 chain as both), projected onto the requant space."""
    from autotune.tuner import Proposer
    from autotune.tuning_log import TuningLog
    from search_spaces import InvalidConfig

    qm = make_task("qmatmul", "cpu", shape="m=64,k=128,n=64")
    rq = make_task("qmatmul_requant", "cpu", shape="m=64,k=96,n=64")
    names = {k.name for k in rq.space.knobs}
    assert names < {k.name for k in qm.space.knobs}
    for i in range(200):
        winner = qm.space.sample(random.Random(i))
        try:
            projected = rq.space.from_json({k: v for k, v in winner.to_json().items() if k in names})
            break
        except InvalidConfig:
            continue
    log = tmp_path / "rq.jsonl"
    other = tmp_path / "qm.jsonl"
    records.append(other, [qm.record(winner, costs=(1e-4,))])
    assert Proposer(rq, TuningLog(log), "xgb", seed=0, transfer=[other]).seeds == [projected]


def test_a_code_path_nothing_has_measured_gets_the_models_best_config_of_it_early(tmp_path):
    """A model trained on every path but one (a new intrinsic, or a machine the first to have it) extrapolates
    there from nothing: its best config of that path is measured in the first batch, once; a path some
    record of the operator on this kind of device took is the model's to rank, unless it won another shape
    on this device (or another operator's, whose knobs hold the task's)."""
    from autotune.tuner import Proposer
    from autotune.tuning_log import TuningLog

    task = make_task("qmatmul", "cpu:sapphirerapids", shape="m=64,k=128,n=64")
    space = task.space
    assert ("amx",) in space.paths_present() and len(space.paths_present()) > 2
    rng = random.Random(0)
    measured = [c for c in dict.fromkeys(space.sample(rng) for _ in range(400)) if space.path_of(c) != ("amx",)]
    log = tmp_path / "qm.jsonl"
    records.append(log, [task.record(c, costs=(1e-3 * (1 + i % 7),)) for i, c in enumerate(measured[:40])])
    proposer = Proposer(task, TuningLog(log), "xgb", seed=0, transfer=())
    assert proposer.unexplored == [("amx",)]
    first = proposer.ask(4)
    assert [space.path_of(c) for c in first].count(("amx",)) >= 1 and proposer.unexplored == []
    amx = next(c for c in first if space.path_of(c) == ("amx",))
    pool = [c for c in space.configs_of_path(("amx",)) if c not in set(measured[:40])]
    assert proposer.model.score([amx])[0] == max(proposer.model.score(pool))  # the model's pick of the path
    records.append(log, [task.record(amx, costs=(2e-4,))])
    assert Proposer(task, TuningLog(log), "xgb", seed=0, transfer=()).unexplored == []
    assert Proposer(task, TuningLog(log), "random", seed=0, transfer=()).unexplored == []
    # another shape, and qmatmul_requant (whose knobs qmatmul's hold), on this device: amx won here, so each
    # explores it, and nothing else (the paths qmatmul's records took are known to the requant task too)
    for op, shape in [("qmatmul", "m=64,k=256,n=32"), ("qmatmul_requant", "m=64,k=256,n=32")]:
        other = make_task(op, "cpu:sapphirerapids", shape=shape)
        records.append(log, [other.record(other.space.from_json({k: v for k, v in c.to_json().items()
                                                                 if k in {n.name for n in other.space.knobs}}),
                                          costs=(1e-3,)) for c in measured[:3] if c.as_dict()["intrinsic"] != "vnni"])
        unexplored = Proposer(other, TuningLog(log), "xgb", seed=0, transfer=()).unexplored
        assert unexplored == [("amx",)]


def test_before_the_model_is_trained_an_unexplored_path_still_gets_a_config_in_the_first_batch(tmp_path):
    """A first batch of 4 opens with a seed and a spread design of 3 configs, which need not reach every path:
    the unexplored one (here AMX, which no record took) gets a config of its own, a path a seed measures none."""
    from autotune.tuner import Proposer
    from autotune.tuning_log import TuningLog

    task = make_task("qmatmul", "cpu:sapphirerapids", shape="m=64,k=128,n=64")
    other = make_task("qmatmul", "cpu:sapphirerapids", shape="m=32,k=64,n=32")
    firsts = {path: next(other.space.configs_of_path(path)) for path in [("none",), ("avx2",), ("vnni",)]}
    vnni = firsts[("vnni",)]
    log = tmp_path / "qm.jsonl"
    records.append(log, [other.record(c, costs=(1e-4 if c == vnni else 1e-3,)) for c in firsts.values()])
    proposer = Proposer(task, TuningLog(log), "xgb", seed=0, transfer=())
    assert proposer.unexplored == [("amx",), ("vnni",)]  # the unknown path first, then the winners'
    proposer.model = None  # as before any model is trained (no scorer: the spread design)
    first = proposer.ask(4)
    assert [task.space.path_of(c) for c in first].count(("amx",)) == 1 and first[0] == vnni
