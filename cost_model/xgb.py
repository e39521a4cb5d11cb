"""An XGBoost ranker of configs, trained on measured records with a pairwise ranking loss (as AutoTVM).

Ranking, not regression: the search needs to know which candidates are faster, and latencies of different
shapes differ by orders of magnitude. Each workload is one ranking group; failed candidates rank last.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np


class XGBCostModel:
    def __init__(self, objective: str = "rank:pairwise", rounds: int = 80, seed: int = 0,
                 threads: int = 1):
        self.objective = objective
        self.rounds = rounds
        self.seed = seed
        self.threads = threads
        self.booster = None  # xgboost.Booster once trained
        self.num_features: int | None = None

    @property
    def trained(self) -> bool:
        return self.booster is not None

    def _params(self) -> dict:
        return {"objective": self.objective, "eta": 0.2, "max_depth": 6, "min_child_weight": 1,
                "subsample": 0.9, "colsample_bytree": 0.9, "lambda": 1.0, "seed": self.seed,
                "nthread": self.threads, "verbosity": 0}

    def update(self, features: np.ndarray, latencies: Sequence[float], groups: Sequence[str],
               group_weights: dict[str, float] | None = None, base_margin: np.ndarray | None = None) -> None:
        """Retrain on all data seen so far. `latencies` are seconds (inf for failures); `groups` workloads;
        `group_weights` a weight per group (XGBoost weighs ranking groups, not rows), 1 where not given;
        `base_margin` a prior score per row that the trees learn to correct (pass the same to `predict`)."""
        import xgboost as xgb

        lat = np.asarray(latencies, dtype=np.float64)
        grp = np.asarray(groups)
        if len(lat) < 2 or not np.isfinite(lat).any():
            return
        order = np.argsort(grp, kind="stable")  # xgboost wants each query group contiguous
        features, lat, grp = features[order], lat[order], grp[order]
        base_margin = None if base_margin is None else np.asarray(base_margin, dtype=np.float32)[order]
        labels = np.zeros(len(lat), dtype=np.float32)
        for g in np.unique(grp):
            ok = (grp == g) & np.isfinite(lat)
            if ok.any():  # relevance = best / latency in (0, 1]; failures keep 0, below any success
                labels[ok] = lat[ok].min() / lat[ok]
        names, qid = np.unique(grp, return_inverse=True)
        dtrain = xgb.DMatrix(features, label=labels, qid=qid, base_margin=base_margin)
        if group_weights:
            dtrain.set_weight(np.array([group_weights.get(str(g), 1.0) for g in names], dtype=np.float32))
        self.booster = xgb.train(self._params(), dtrain, num_boost_round=self.rounds)
        self.num_features = features.shape[1]

    def predict(self, features: np.ndarray, base_margin: np.ndarray | None = None) -> np.ndarray:
        """Scores, higher = predicted faster (margins: what another model's `base_margin` takes). Untrained:
        `base_margin` or zeros (the search then follows the prior, or behaves randomly)."""
        if self.booster is None:
            return np.zeros(len(features)) if base_margin is None else np.asarray(base_margin, dtype=np.float64)
        import xgboost as xgb

        return self.booster.predict(xgb.DMatrix(features, base_margin=base_margin), output_margin=True)

    def save(self, path: str | Path) -> None:
        """XGBoost's own JSON model format, with our settings as attributes: no pickle anywhere."""
        if self.booster is None:
            raise ValueError("cannot save an untrained cost model")
        self.booster.set_attr(autotune=json.dumps({"objective": self.objective, "rounds": self.rounds,
                                                   "seed": self.seed, "num_features": self.num_features}))
        path = str(path)
        if not path.endswith(".json"):
            raise ValueError("cost models are saved as .json")
        self.booster.save_model(path)

    @classmethod
    def load(cls, path: str | Path) -> "XGBCostModel":
        import xgboost as xgb

        booster = xgb.Booster()
        booster.load_model(str(path))
        meta = json.loads(booster.attr("autotune") or "{}")
        model = cls(objective=meta.get("objective", "rank:pairwise"), rounds=meta.get("rounds", 80),
                    seed=meta.get("seed", 0))
        model.booster = booster
        model.num_features = meta.get("num_features")
        return model
