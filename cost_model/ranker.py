"""The model a search consults: trained on a TrainingSet, scoring one task's candidates.

Transferred records (other shapes, CPU models, operators) and the task's own measurements are combined one of
two ways (`TRANSFER_AS`):
- `pooled` (the default): one model on every row, the task's own ranking group weighed as much as all
  transferred groups together (`TrainingSet.group_weights`), refitted after every batch.
- `prior` (AutoTVM's base model): a prior model is fitted once on the transferred rows; its score, halved for
  every `PRIOR_HALF_LIFE` rows of the task's own, is the base margin from which a second model, fitted on the
  task's own rows alone, learns the corrections. Only that small model is refitted after a batch.
On the simulator (benchmarks.search_sim) the two reach 5% of the best alike, whatever the half-life, so pooled
stayed the default (benchmarks/SEARCH_QUALITY.md).
It keeps the training matrix between updates (rows are only appended during a run, so after each batch only
the new rows are converted).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from search_spaces import Config

from .features import Columns, TaskFeaturizer
from .training import TrainingSet
from .xgb import XGBCostModel

TRANSFER_AS = ("prior", "pooled")
PRIOR_HALF_LIFE = 64  # own rows after which the prior's margin counts half (AutoTVM: 2 ** (-n / 64))


class Ranker:
    def __init__(self, training: TrainingSet, featurizer: TaskFeaturizer, seed: int = 0, threads: int = 1,
                 transfer_as: str = "pooled"):
        if transfer_as not in TRANSFER_AS:
            raise ValueError(f"transfer_as must be one of {', '.join(TRANSFER_AS)}, got {transfer_as!r}")
        self.training, self.featurizer = training, featurizer
        self.transfer_as = transfer_as if training.task_group is not None else "pooled"
        self.model = XGBCostModel(seed=seed, threads=threads)
        self.prior = XGBCostModel(seed=seed, threads=threads)
        self.columns: Columns | None = None
        self._x = np.zeros((0, 0), dtype=np.float32)
        self._prior_columns: list[int] = []  # the columns the prior was fitted on, as indices of self.columns
        self._prior_rows = 0  # transferred rows it was fitted on
        self._own = 0  # the task's own rows the model was fitted on

    @property
    def trained(self) -> bool:
        return self.model.trained or self.prior.trained

    def fit(self) -> None:
        """Refit on the training set (does nothing until it holds a success to rank)."""
        rows = self.training.rows
        if not rows:
            return
        names = set(self.featurizer.names())
        for r in rows[len(self._x):] if self.columns is not None else rows:
            names.update(r)
        if self.columns is None or not names <= set(self.columns.names):
            old = self.columns
            self.columns = Columns(names | set(old.names if old else ()))
            self._x = self.columns.matrix(rows)
            if old is not None:  # columns only grow: the prior's keep their names
                self._prior_columns = [self.columns.index[old.names[j]] for j in self._prior_columns]
        elif len(self._x) < len(rows):
            self._x = np.concatenate([self._x, self.columns.matrix(rows[len(self._x):])])
        lat, groups = np.asarray(self.training.latencies), np.asarray(self.training.groups)
        if self.transfer_as == "pooled":
            self.model.update(self._x, lat, groups, self.training.group_weights())
            return
        own = groups == self.training.task_group
        if (~own).sum() != self._prior_rows:  # fitted once per transfer set, not after every batch
            self._prior_columns = list(range(len(self.columns)))
            self.prior = XGBCostModel(seed=self.model.seed, threads=self.model.threads)
            self.prior.update(self._x[~own], lat[~own], groups[~own])
            self._prior_rows = int((~own).sum())
        self._own = int(own.sum())
        self.model.update(self._x[own], lat[own], groups[own], base_margin=self._margin(self._x[own]))

    def _margin(self, x: np.ndarray) -> np.ndarray | None:
        """The prior's discounted score of rows `x` (in self.columns), or None without a prior."""
        if not self.prior.trained:
            return None
        return 2.0 ** (-self._own / PRIOR_HALF_LIFE) * self.prior.predict(x[:, self._prior_columns])

    def score(self, cfgs: Sequence[Config]) -> np.ndarray:
        """Higher = predicted faster; zeros until trained."""
        if not self.trained or self.columns is None:
            return np.zeros(len(cfgs))
        x = self.featurizer.matrix(self.columns, cfgs)
        return self.model.predict(x, base_margin=self._margin(x))
