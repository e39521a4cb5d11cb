"""What teaches a task's cost model: the transfer policy of cost_model.training, and the ranker over it."""

import random

import numpy as np
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
