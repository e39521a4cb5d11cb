"""The cost model scored on real records: held-out records measured on several CPUs (tests/cost_model/records: the
shipped CPU logs as they stood at commit 779b821, records of older template versions included) ranked by
benchmarks/rank_quality.py.

Everything else tests the model on synthetic rows; this fails when featurizing, training or ranking real records
gets worse (a feature that stops being filled, a broken matrix, a ranker that learns nothing: each ranks at
about chance, 0.5).
"""

from __future__ import annotations

import collections
from pathlib import Path

from autotune import records
from autotune.tuner import AUTO_FEATURES
from benchmarks import rank_quality as rq

RECORDS = Path(__file__).resolve().parent / "records"

# Operator and device groups of the records with enough records to score: 150 usable records (over 2+
# shapes, ~30% held out per shape) put a few hundred pairs in each held-out shape.
MIN_RECORDS, MIN_GROUPS = 150, 3
# Floors on pairwise accuracy (share of held-out config pairs put in the right order; chance is 0.5), for the
# feature set `tune` uses (AUTO_FEATURES, "all"), with 3 seeded repeats. Measured with the shipped logs at
# commit c438f98 (XGBoost rank:pairwise, seeded, one thread, so the figures are the same on every run):
#   embedding_bag cpu:znver4 (201 records, 3 shapes)        configs 0.684, new shape 0.677
#   interaction cpu:emeraldrapids (192 records, 2 shapes)   configs 0.679, new shape 0.670
#   qmatmul cpu:emeraldrapids (192 records, 2 shapes)       configs 0.773, new shape 0.726
# mean of the groups' configs figure 0.712. The floors leave ~0.07 of margin for XGBoost versions and model
# changes, and stay well above chance.
FLOOR = {"configs pairwise": 0.60, "new shape pairwise": 0.60}
MEAN_FLOOR = 0.65


def test_the_cost_model_ranks_held_out_shipped_records_above_a_floor():
    by: dict[tuple[str, str], list[records.Record]] = collections.defaultdict(list)
    for log in sorted(RECORDS.glob("*.jsonl")):
        for r in records.load(log):
            by[(r.op, r.device)].append(r)
    groups = {k: recs for k, recs in sorted(by.items()) if len(rq.usable(recs)) >= MIN_RECORDS}
    assert len(groups) >= MIN_GROUPS, (
        f"only {sorted(groups)} of {RECORDS} have {MIN_RECORDS}+ records with current program features "
        f"(a bumped PROGRAM_FEATURES_VERSION? `autotune featurize {RECORDS}/*.jsonl`)")
    scores, low = {}, []
    for (op, device), recs in groups.items():
        # Records of older template versions too: each record's features and latency belong to one program, so
        # they score the ranker as well as current ones (most of these predate the current templates).
        res = rq.evaluate(recs, op, device, repeats=3, include_stale=True, feature_sets=[AUTO_FEATURES])
        figures = res["sets"].get(AUTO_FEATURES, {})
        assert res["shapes"] >= 2 and set(FLOOR) <= set(figures), (op, device, res)
        scores[(op, device)] = figures
        low += [f"{op} on {device}: {m} {figures[m]:.3f} < {floor}" for m, floor in FLOOR.items()
                if not figures[m] >= floor]
    assert not low, "the cost model ranks held-out shipped records worse than its floor:\n" + "\n".join(low)
    mean = sum(f["configs pairwise"] for f in scores.values()) / len(scores)
    assert mean >= MEAN_FLOOR, f"mean held-out pairwise accuracy {mean:.3f} < {MEAN_FLOOR}: {scores}"
