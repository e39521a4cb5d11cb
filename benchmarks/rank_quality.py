"""Which feature set ranks held-out configs best: `python -m benchmarks.rank_quality LOG [LOG...]`.

For each operator and device in the logs, and each feature set (`cost_model.FEATURE_SETS`), an XGBoost ranker
is trained on part of the records and asked to rank the rest, two ways:
- `configs`: a random 30% of each shape's configs held out (repeated with `--repeats` seeds): how well the
  model ranks unmeasured configs of shapes it has seen, which is what the search asks during a run;
- `new shape`: every shape held out in turn, trained on the others: transfer to a shape never measured.
Figures, per held-out shape: pairwise accuracy (share of config pairs with different latencies put in the
right order) and top-k recall (share of the truly fastest 10%, at least 1, found in the predicted top 10%).
Only records that carry program features are used, so every feature set sees the same records.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import random
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from autotune import records
from cost_model import FEATURE_SETS, TrainingSet, XGBCostModel
from cost_model.program import PROGRAM_FEATURES_VERSION


def pairwise_accuracy(pred: np.ndarray, lat: np.ndarray) -> float:
    """Share of pairs with different latencies that `pred` (higher = faster) orders correctly."""
    i, j = np.triu_indices(len(lat), 1)
    differ = lat[i] != lat[j]
    if not differ.any():
        return math.nan
    right = (pred[i] > pred[j]) == (lat[i] < lat[j])
    return float(right[differ].mean())


def top_k_recall(pred: np.ndarray, lat: np.ndarray, share: float = 0.1) -> float:
    k = max(1, int(round(len(lat) * share)))
    truth = set(np.argsort(lat, kind="stable")[:k])
    return len(truth & set(np.argsort(-pred, kind="stable")[:k])) / k


def _rows(recs: Sequence[records.Record], op: str, device: str, feature_set: str, include_stale: bool):
    import search_spaces

    version = (lambda o, d: None) if include_stale else records.current_version
    ts = TrainingSet(op, device, feature_set, search_spaces.get, version, PROGRAM_FEATURES_VERSION)
    kept = [r for r in recs if ts.add([r])]
    return ts, kept


def usable(recs: Sequence[records.Record]) -> list[records.Record]:
    """The records every feature set can learn from: measured, with program features of the current version."""
    return [r for r in recs if r.ok and r.features and r.features_version == PROGRAM_FEATURES_VERSION]


def evaluate(recs: Sequence[records.Record], op: str, device: str, repeats: int = 5,
             include_stale: bool = False, feature_sets: Sequence[str] = FEATURE_SETS) -> dict[str, Any]:
    """Figures of each feature set (every one by default) on one operator's records of one device (see the
    module doc); deterministic for given records (seeded splits, a seeded single-threaded XGBoost)."""
    kept_records = usable(recs)
    out: dict[str, Any] = {"op": op, "device": device, "records": len(kept_records), "shapes": 0, "sets": {}}
    for fs in feature_sets:
        ts, kept = _rows(kept_records, op, device, fs, include_stale)
        if len(kept) < 10:
            continue
        columns, x = ts.matrix()
        lat = np.asarray(ts.latencies)
        groups = np.asarray(ts.groups)
        shapes = sorted(set(groups))
        out["shapes"] = len(shapes)
        res: dict[str, list[float]] = collections.defaultdict(list)
        for seed in range(repeats):  # held-out configs of seen shapes
            rng = random.Random(seed)
            test = np.zeros(len(lat), dtype=bool)
            for g in shapes:
                idx = np.flatnonzero(groups == g)
                pick = rng.sample(list(idx), max(1, int(round(0.3 * len(idx))))) if len(idx) >= 4 else []
                test[pick] = True
            _score(x, lat, groups, ~test, test, seed, res, "configs")
        for g in shapes if len(shapes) > 1 else []:  # a new shape
            test = groups == g
            _score(x, lat, groups, ~test, test, 0, res, "new shape")
        out["sets"][fs] = {k: float(np.nanmean(v)) if v else math.nan for k, v in res.items()}
    return out


def _score(x, lat, groups, train, test, seed, res, split):
    model = XGBCostModel(seed=seed)
    model.update(x[train], lat[train], groups[train])
    if not model.trained:
        return
    pred = model.predict(x[test])
    for g in set(groups[test]):
        m = groups[test] == g
        if m.sum() >= 4:
            res[f"{split} pairwise"].append(pairwise_accuracy(pred[m], lat[test][m]))
            res[f"{split} top10%"].append(top_k_recall(pred[m], lat[test][m]))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("logs", nargs="+")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--include-stale", action="store_true", help="also records of older template versions")
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args(argv)
    by: dict[tuple[str, str], list[records.Record]] = collections.defaultdict(list)
    for log in a.logs:
        for r in records.load(log):
            by[(r.op, r.device)].append(r)
    results = []
    for (op, device), recs in sorted(by.items()):
        res = evaluate(recs, op, device, a.repeats, a.include_stale)
        results.append(res)
        print(f"\n{op} on {device}: {res['records']} records with program features, {res['shapes']} shape(s)")
        if not res["sets"]:
            print("  too few usable records (run `autotune featurize LOG` to add program features)")
            continue
        metrics = sorted({k for s in res["sets"].values() for k in s})
        print(f"  {'features':10s}" + "".join(f"{m:>20s}" for m in metrics))
        for fs, figs in res["sets"].items():
            print(f"  {fs:10s}" + "".join(f"{figs.get(m, math.nan):20.3f}" for m in metrics))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
