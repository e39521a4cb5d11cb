"""What teaches a task's cost model: the transfer policy of cost_model.training, and the ranker over it."""

import random

import numpy as np
import pytest
import search_spaces
from autotune import records
from autotune.targets import resolve
from autotune.task import make_task
from cost_model import Ranker, TaskFeaturizer, TrainingSet

SHAPE = "m=10,k=40,n=24,relu=1"


def _training(task, feature_set="knobs"):
    return TrainingSet(task.op, task.device.name, feature_set, search_spaces.get, records.current_version, "1")


def _recs(task, n, features=None, seed=0):
    cfgs = random.Random(seed).sample(list(task.space), n)
    return [task.record(c, costs=(1e-6 * (i + 1),), features=features, features_version="1" if features else "")
            for i, c in enumerate(cfgs)]


def test_other_shapes_and_other_cpu_models_teach_other_device_kinds_do_not():
    here = make_task("qmatmul", "cpu:znver3", shape=SHAPE)
    other_shape = make_task("qmatmul", "cpu:znver3", shape="m=20,k=40,n=24")
    other_cpu = make_task("qmatmul", "cpu:emeraldrapids", shape=SHAPE)
    gpu = make_task("qmatmul", "cuda:sm_90", shape=SHAPE)
    ts = _training(here)
    assert ts.add(_recs(other_shape, 5)) == 5 and ts.add(_recs(other_cpu, 5)) == 5
    assert ts.add(_recs(gpu, 5)) == 0  # a GPU's configs are another space
    assert len(set(ts.groups)) == 2 and ts.own == 5
    er, zen = (r for r in (ts.rows[5], ts.rows[0]))
    assert er["d.avx512f"] == 1.0 and zen["d.avx512f"] == 0.0


def test_the_tasks_own_group_weighs_as_much_as_all_transferred_ones():
    here = make_task("qmatmul", "cpu:znver3", shape=SHAPE)
    other = make_task("qmatmul", "cpu:znver3", shape="m=20,k=40,n=24")
    ts = TrainingSet(here.op, here.device.name, "knobs", search_spaces.get, records.current_version, "1",
                     here.workload_key)
    ts.add(_recs(other, 30))
    assert ts.group_weights() == {}  # nothing of its own yet: nothing to weigh
    ts.add(_recs(here, 5))
    assert ts.group_weights() == {f"cpu:znver3|qmatmul|{here.workload_key}": 6.0}
    ts.add(_recs(here, 40, seed=1))
    assert ts.group_weights() == {f"cpu:znver3|qmatmul|{here.workload_key}": 1.0}  # never below the others
    assert _training(here).group_weights() == {}  # no task workload given


def test_other_operators_teach_only_through_program_features():
    here = make_task("qmatmul", "cpu:znver3", shape=SHAPE)
    other = make_task("quantize_rows", "cpu:znver3", shape=search_spaces.get("quantize_rows").TEST_SHAPE)
    with_features = _recs(other, 4, features={"p.sum.0": 1.0, "p.stores": 2.0})
    assert _training(here, "knobs").add(with_features) == 0
    assert _training(here, "all").add(_recs(other, 4)) == 0  # no program features: nothing to share
    ts = _training(here, "all")
    assert ts.add(with_features) == 4
    assert all("p.sum.0" in r and not any(k.startswith("k.qmatmul") for k in r) for r in ts.rows)


def test_stale_and_uninformative_records_are_skipped():
    here = make_task("qmatmul", "cpu:znver3", shape=SHAPE)
    cfg = here.space.default()
    recs = [here.record(cfg, costs=(1e-6,), template_version="0ld"), here.record(cfg, error_kind="harness"),
            here.record(cfg, error_kind="invalid"), here.record(cfg, error_kind="crash")]
    ts = _training(here)
    assert ts.add(recs) == 1 and ts.latencies == [float("inf")]  # a crash ranks last; the rest say nothing


def test_ranker_learns_a_knob_that_decides_speed_and_transfers_across_cpu_models():
    """Records of another CPU model, where `unroll` halves the latency, rank this model's configs first."""
    here, there = make_task("qmatmul", "cpu:znver3", shape=SHAPE), make_task("qmatmul", "cpu:emeraldrapids", shape=SHAPE)
    cfgs = random.Random(1).sample(list(there.space), 60)
    recs = [there.record(c, costs=(1e-6 * (1 if c.as_dict()["unroll"] else 2) * (1 + 0.01 * i),))
            for i, c in enumerate(cfgs)]
    ts = _training(here)
    ts.add(recs)
    ranker = Ranker(ts, TaskFeaturizer(here.op, here.workload, here.space, here.device.to_json(), "knobs"))
    assert not ranker.trained and not ranker.score(cfgs[:3]).any()
    ranker.fit()
    mine = random.Random(2).sample(list(here.space), 200)
    scores = ranker.score(mine)
    unrolled = np.array([c.as_dict()["unroll"] for c in mine])
    assert scores[unrolled].mean() > scores[~unrolled].mean()
    top = [mine[i] for i in np.argsort(-scores)[:20]]
    assert sum(c.as_dict()["unroll"] for c in top) >= 18


def _unroll_says(task, cfgs, factor, start=0):
    """Records where `unroll` multiplies the latency by `factor` (and a small rank-keeping ramp)."""
    return [task.record(c, costs=(1e-6 * (factor if c.as_dict()["unroll"] else 1) * (1 + 0.01 * (start + i)),))
            for i, c in enumerate(cfgs)]


def _task_ranker(here, transfer_as):
    ts = TrainingSet(here.op, here.device.name, "knobs", search_spaces.get, records.current_version, "1",
                     here.workload_key)
    return Ranker(ts, TaskFeaturizer(here.op, here.workload, here.space, here.device.to_json(), "knobs"),
                  transfer_as=transfer_as)


def test_the_prior_warms_the_task_and_its_own_records_correct_it():
    """Another shape says unroll halves the latency; this one's records say it doubles it."""
    here, there = make_task("qmatmul", "cpu:znver3", shape=SHAPE), make_task("qmatmul", "cpu:znver3", shape="m=20,k=40,n=24")
    ranker = _task_ranker(here, "prior")
    ranker.training.add(_unroll_says(there, random.Random(1).sample(list(there.space), 80), 0.5))
    ranker.fit()
    mine = random.Random(2).sample(list(here.space), 200)
    unrolled = np.array([c.as_dict()["unroll"] for c in mine])
    assert ranker.trained and not ranker.model.trained  # the prior alone ranks the first batch
    warm = ranker.score(mine)
    assert warm[unrolled].mean() > warm[~unrolled].mean()
    prior = ranker.prior.booster
    for k in range(4):  # four batches of this task's own records
        ranker.training.add(_unroll_says(here, random.Random(10 + k).sample(list(here.space), 8), 2.0, 8 * k))
        ranker.fit()
    assert ranker.prior.booster is prior  # fitted once on the transferred rows, not after every batch
    own = ranker.score(mine)
    assert own[unrolled].mean() < own[~unrolled].mean()
    assert sum(not c.as_dict()["unroll"] for c in [mine[i] for i in np.argsort(-own)[:20]]) >= 18


def test_without_transferred_rows_the_prior_is_never_fitted_and_pooled_stays_selectable():
    here = make_task("qmatmul", "cpu:znver3", shape=SHAPE)
    own = _unroll_says(here, random.Random(3).sample(list(here.space), 24), 2.0)
    for transfer_as in ("prior", "pooled"):
        ranker = _task_ranker(here, transfer_as)
        ranker.training.add(own)
        ranker.fit()
        assert ranker.transfer_as == transfer_as and ranker.model.trained and not ranker.prior.trained
    with pytest.raises(ValueError, match="transfer_as must be one of"):
        _task_ranker(here, "blend")
