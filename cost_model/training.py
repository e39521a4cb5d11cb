"""Which measured records teach the cost model of a task, and as what rows: the transfer policy in one place.

A task learns from every comparable record, not only its own:
- its own records and those of other shapes of the same operator (the workload features tell them apart);
- the same operator measured on other models of the same device kind (`cpu:emeraldrapids` records warm a
  `cpu:znver4` task; the device features tell them apart);
- other operators, through program features only (their knobs mean nothing here), when the feature set
  uses program features and the record carries them.
Each (device, operator, workload) is one ranking group: latencies are compared only within it. Records of
older template code rank configs of code we no longer generate, so they count only with `include_stale`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np

from search_spaces import InvalidConfig
from search_spaces.template import target_from_json

from .features import Columns, row, uses_knobs, uses_program

SKIPPED_ERRORS = ("invalid", "harness")  # say nothing about a candidate's speed


class TrainingSet:
    """Rows, latencies and ranking groups of the records that teach a task's model (see the module doc).

    `template(op)` returns an operator's template module; `version(op, device)` the template version
    records must carry (None: accept any); `program_version` the program-feature version rows may use;
    `workload_key` the task's own workload, whose group `group_weights` weighs up (see there)."""

    def __init__(self, op: str, device: str, feature_set: str, template: Callable[[str], Any],
                 version: Callable[[str, str], str | None], program_version: str = "",
                 workload_key: str | None = None):
        self.op, self.device, self.kind = op, device, device.split(":")[0]
        self.task_group = f"{device}|{op}|{workload_key}" if workload_key is not None else None
        self.feature_set = feature_set
        self.template, self.version, self.program_version = template, version, program_version
        self.rows: list[dict[str, float]] = []
        self.latencies: list[float] = []
        self.groups: list[str] = []
        self.own = 0  # rows of this task's own device and operator
        self.own_task = 0  # rows of its own group (device, operator and workload)
        self._spaces: dict[tuple[str, str, str], Any] = {}
        self._versions: dict[tuple[str, str], str | None] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, records: Iterable[Any]) -> int:
        """Add the records that can teach this task; returns how many were taken."""
        taken = 0
        for r in records:
            fields = self._row(r)
            if fields is None:
                continue
            self.rows.append(fields)
            self.latencies.append(r.latency)
            self.groups.append(f"{r.device}|{r.op}|{r.workload_key}")
            self.own += r.device == self.device and r.op == self.op
            self.own_task += self.groups[-1] == self.task_group
            taken += 1
        return taken

    def _row(self, r: Any) -> dict[str, float] | None:
        if r.error_kind in SKIPPED_ERRORS or r.device.split(":")[0] != self.kind:
            return None
        key = (r.op, r.device)
        if key not in self._versions:
            self._versions[key] = self.version(r.op, r.device)
        if self._versions[key] is not None and r.template_version != self._versions[key]:
            return None
        program = r.features if (r.features and r.features_version == self.program_version) else None
        same_op = r.op == self.op
        if not same_op and not (uses_program(self.feature_set) and program):
            return None  # another operator's knobs mean nothing to this one's model
        try:
            workload, space = self._space(r)
            cfg = space.from_json(r.config) if (same_op and uses_knobs(self.feature_set)) else None
        except (InvalidConfig, ValueError, TypeError, KeyError, LookupError):
            return None  # a record of an older space: not comparable, not fatal
        return row(r.op, workload, space if same_op else None, cfg, r.target, program, self.feature_set)

    def _space(self, r: Any) -> tuple[Any, Any]:
        key = (r.op, r.workload_key, r.device)
        if key not in self._spaces:
            template = self.template(r.op)
            workload = template.Workload.from_json(r.workload)
            space = template.space(workload, target_from_json(r.target)) if r.op == self.op else None
            self._spaces[key] = (workload, space)
        return self._spaces[key]

    def group_weights(self) -> dict[str, float]:
        """The task's own ranking group weighs as much as every transferred group together.

        A ranking loss sums over the rows of every group, so after one batch of its own (8 rows) a task warmed
        by a few hundred transferred rows would still be ranked as the other shapes rank it, and what its own
        measurements say (this shape's table misses the cache; that one's fits) would barely move the model."""
        own = self.own_task
        if not own or own == len(self.groups):
            return {}
        return {self.task_group: max(1.0, (len(self.groups) - own) / own)}  # type: ignore[dict-item]

    def matrix(self, columns: Columns | None = None) -> tuple[Columns, np.ndarray]:
        columns = columns or Columns.union(self.rows)
        return columns, columns.matrix(self.rows)

