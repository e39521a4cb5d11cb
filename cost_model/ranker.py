"""The model a search consults: trained on a TrainingSet, scoring one task's candidates.

It keeps the training matrix between updates (rows are only appended during a run, so after each batch only
the new rows are converted) and refits the ranker on all of it, the task's own group weighed as much as all
transferred groups together (`TrainingSet.group_weights`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from search_spaces import Config

from .features import Columns, TaskFeaturizer
from .training import TrainingSet
from .xgb import XGBCostModel


class Ranker:
    def __init__(self, training: TrainingSet, featurizer: TaskFeaturizer, seed: int = 0, threads: int = 1):
        self.training, self.featurizer = training, featurizer
        self.model = XGBCostModel(seed=seed, threads=threads)
        self.columns: Columns | None = None
        self._x = np.zeros((0, 0), dtype=np.float32)

    @property
    def trained(self) -> bool:
        return self.model.trained

    def fit(self) -> None:
        """Refit on every row of the training set (does nothing until it holds a success to rank)."""
        rows = self.training.rows
        if not rows:
            return
        names = set(self.featurizer.names())
        for r in rows[len(self._x):] if self.columns is not None else rows:
            names.update(r)
        if self.columns is None or not names <= set(self.columns.names):
            self.columns = Columns(names | set(self.columns.names if self.columns else ()))
            self._x = self.columns.matrix(rows)
        elif len(self._x) < len(rows):
            self._x = np.concatenate([self._x, self.columns.matrix(rows[len(self._x):])])
        self.model.update(self._x, self.training.latencies, self.training.groups, self.training.group_weights())

    def score(self, cfgs: Sequence[Config]) -> np.ndarray:
        """Higher = predicted faster; zeros until trained."""
        if not self.trained or self.columns is None:
            return np.zeros(len(cfgs))
        return self.model.predict(self.featurizer.matrix(self.columns, cfgs))
