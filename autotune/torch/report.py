"""What `tune_model` hands back besides the model: each task's share, trials and kernel, what each rule replaced or
kept (and why), the whole-model verdicts, the accuracy contract's layers and both latencies."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from search_spaces.template import Kept

from ..records import TaskKey
from .accuracy import AccuracyReport
from .graph import Replaced
from .speed import ms

__all__ = ["TaskReport", "TuneModelReport", "cycle_text", "shape_text"]


@dataclass
class TaskReport:
    """One kernel to tune: what it is, how much of the eager time its sites take, and how tuning went."""

    key: TaskKey  # (op, workload key, device): the task's identity in its log and the package
    fields: dict[str, Any]
    share: float = 0.0  # of the eager model's time on the example inputs (its sites' nodes)
    sites: int = 0
    measured: int = 0  # configs measured by this call
    resumed: int = 0  # configs already in the log
    shipped: int = 0  # configs the shipped records of this CPU measured (they cover the task: not tuned again)
    tuning_s: float = 0.0  # seconds this call spent tuning it
    batches: int = 0  # tuning batches this call gave it (under a budget, the scheduler's picks)
    first_s: float | None = None  # its best after its first batch of this call: what tuning it further gained
    best_s: float | None = None
    source: str = ""  # "tuned" or "shipped record"
    why: str = ""  # why there is no kernel
    record: Any = field(default=None, repr=False)

    @property
    def op(self) -> str:
        return self.key.op

    def describe(self, tuned: bool = True) -> str:
        head = f"{self.op} {shape_text(self.fields)}: {self.share:.1%} of eager, {self.sites} site(s)"
        if not tuned:
            return head
        best = (f"best {self.best_s * 1e3:.4f} ms" + (f" ({self.source})" if self.source == "shipped record"
                                                       else "")) if self.best_s is not None else self.why
        done = (f"covered by {self.shipped} shipped records" if self.shipped else
                f"{self.measured} trials measured in {self.tuning_s:.0f} s, {self.resumed} resumed")
        gained = (f" ({self.first_s / self.best_s:.2f}x its first batch)" if self.first_s and self.best_s
                  and self.batches > 1 else "")
        return f"{head}; {done}; {best}{gained}"

    def __str__(self) -> str:
        return self.describe()


def shape_text(fields: dict[str, Any]) -> str:
    """`rows=1000,pooling=1-8,table_pooling=3+1-4`: a task's fields as `--shape` writes them (a pair as MIN-MAX,
    a list of pairs joined by +, a pair of equal ends as one number)."""
    def text(v: Any) -> str:
        if not isinstance(v, (list, tuple)):
            return str(v)
        if v and isinstance(v[0], (list, tuple)):
            return "+".join(str(p[0]) if len(set(p)) == 1 else text(p) for p in v)
        return "-".join(map(str, v))

    return ",".join(f"{k}={text(v)}" for k, v in fields.items())


@dataclass
class TuneModelReport:
    """What tune_model found, tuned, replaced and kept, and what it measured."""

    tasks: list[TaskReport] = field(default_factory=list)
    replaced: list[Replaced] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    eager_s: float | None = None
    optimized_s: float | None = None
    max_abs_diff: float | None = None
    package: Path | None = None
    exported: bool = False  # False: the package already held exactly these kernels (or none were needed)
    threads: dict[str, str] = field(default_factory=dict)
    whole_model: list[str] = field(default_factory=list)  # the whole-model checks' verdicts (whole_model.py)
    accuracy: AccuracyReport | None = None  # the contract, each int8 layer's precision, the measured error
    timing_batches: int = 1  # batches every timing cycled through (the example and fresh ones)
    budget_s: float | None = None  # the tuning budget the call was given (None: `trials` per task)
    note: str = ""

    @property
    def measured(self) -> int:
        """Configs measured by this call, over all tasks (0 when everything resumed from the logs)."""
        return sum(t.measured for t in self.tasks)

    @property
    def speedup(self) -> float | None:
        return self.eager_s / self.optimized_s if self.eager_s and self.optimized_s else None

    def __str__(self) -> str:
        spent = sum(t.tuning_s for t in self.tasks)
        budget = "" if self.budget_s is None else f" of a {self.budget_s:.0f} s budget" + (
            " (each task's first batch is given whatever is left)" if spent > self.budget_s else "")
        lines = [f"tune_model: {len(self.tasks)} tasks ({self.measured} trials measured in {spent:.0f} s{budget}), "
                 f"{len(self.replaced)} replaced, {len(self.kept)} kept" + (f": {self.note}" if self.note else "")]
        if self.tasks:
            lines.append("tasks (share of the eager time on the example inputs):")
            lines += [f"  {t}" for t in self.tasks]
        if self.package is not None:
            lines.append(f"package: {self.package} ({'exported' if self.exported else 'unchanged, not re-exported'})")
        lines += [f"replaced {r.where or '(model)'}: {r.what} (max |new - old| {r.max_error:.2g}"
                  + (f"; {ms(r.new_s)} vs PyTorch {ms(r.old_s)}" if r.old_s is not None and r.new_s is not None
                     else "") + ")"
                  for r in self.replaced]
        lines += [f"kept {k.where or '(model)'} [{k.rule}]: {k.why}" for k in self.kept]
        lines += [f"whole-model check, {line}" for line in self.whole_model]
        if self.accuracy is not None:
            lines += self.accuracy.lines()
        if self.eager_s is not None and self.optimized_s is not None:
            lines.append(f"latency, {cycle_text(self.timing_batches)}: eager {self.eager_s * 1e3:.3f} ms, optimized "
                         f"{self.optimized_s * 1e3:.3f} ms: {self.speedup:.2f}x")
        if self.max_abs_diff is not None:
            lines.append(f"max |optimized - eager| on the example inputs: {self.max_abs_diff:.3g}")
        if self.threads:
            lines.append("threads: " + ", ".join(f"{k}={v}" for k, v in self.threads.items()))
        return "\n".join(lines)


def cycle_text(batches: int) -> str:
    return "one batch repeated" if batches == 1 else f"a cycle of {batches} batches"
