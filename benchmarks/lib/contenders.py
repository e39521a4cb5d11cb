"""Ways to tune, compared by the search benchmarks: a strategy with tune's batch, feature set and strategy options
(`LABEL=STRATEGY[:key=value,...]`), and the transfer logs that warm a contender's model."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from autotune import records
from autotune.search import STRATEGIES
from autotune.task import Task
from autotune.tuner import check_strategy_options, strategy_named
from cost_model import TRANSFER_AS, TUNE_FEATURE_SETS
from cost_model.features import AUTO

FEATURE_SETS = TUNE_FEATURE_SETS  # what tune(features=...) takes
DEFAULT_CONTENDERS = ("xgb=xgb", "random=random")
TRANSFER_LABEL = "xgb+transfer"
WARM = "<--transfer>"  # a contender's transfer log before --transfer names it



@dataclass(frozen=True)
class Contender:
    """One way to tune: a strategy with tune's batch size, feature set and strategy options."""

    label: str
    strategy: str
    batch: int | None = None  # None: tune's default
    features: str | None = None  # None: tune's default
    options: dict[str, Any] = field(default_factory=dict)
    transfer: tuple[str, ...] = ()  # logs warming the model; () = cold
    transfer_as: str | None = None  # how the model combines them with the task's own (None: tune's default)


def _value(text: str) -> Any:
    """An option's value: int, float, bool (true/false) or the text itself."""
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def parse_contender(spec: str) -> Contender:
    """`LABEL=STRATEGY[:key=value,...]`: keys `batch`, `features` and `transfer_as` are tune's, `transfer=true`
    warms the contender by --transfer's log; any other key is a strategy option."""
    label, eq, rest = spec.partition("=")
    label = label.strip()
    if not eq or not label or not re.fullmatch(r"[\w.+-]+", label):
        raise ValueError(f"contender {spec!r}: expected LABEL=STRATEGY[:key=value,...] with a label of letters, "
                         "digits and _.+-")
    strategy, colon, opts = rest.partition(":")
    try:
        strategy_named(strategy)
    except ValueError as err:
        raise ValueError(f"contender {spec!r}: {err}") from None
    batch, features, options, transfer, transfer_as = None, None, {}, (), None
    for item in filter(None, opts.split(",")):
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key or not text:
            raise ValueError(f"contender {spec!r}: option {item!r} is not key=value")
        if key in options or (key == "batch" and batch is not None) or (key == "features" and features is not None) \
                or (key == "transfer" and transfer) or (key == "transfer_as" and transfer_as):
            raise ValueError(f"contender {spec!r}: {key!r} given twice")
        if key == "batch":
            if not text.isdigit() or int(text) < 1:
                raise ValueError(f"contender {spec!r}: batch must be a whole number >= 1, not {text!r}")
            batch = int(text)
        elif key == "features":
            if text not in FEATURE_SETS:
                raise ValueError(f"contender {spec!r}: features must be one of {', '.join(FEATURE_SETS)}, "
                                 f"not {text!r}")
            features = text
        elif key == "transfer":
            if text.lower() not in ("true", "false"):
                raise ValueError(f"contender {spec!r}: transfer must be true or false, not {text!r}")
            transfer = (WARM,) if text.lower() == "true" else ()
        elif key == "transfer_as":
            if text not in TRANSFER_AS:
                raise ValueError(f"contender {spec!r}: transfer_as must be one of {', '.join(TRANSFER_AS)}, "
                                 f"not {text!r}")
            transfer_as = text
        else:
            options[key] = _value(text)
    if colon and not opts.strip(","):
        raise ValueError(f"contender {spec!r}: nothing after ':'")
    return Contender(label, strategy, batch, features, options, transfer, transfer_as)


def contender_help() -> str:
    """--contenders' help, from the strategies' declarations (`autotune.search.STRATEGIES`)."""
    return ("LABEL=STRATEGY[:key=value,...]; keys batch, features (" + ", ".join(FEATURE_SETS) + "), transfer, "
            "transfer_as, or a strategy's option: " + "; ".join(
                f"{s.name}: {', '.join(s.options) or 'none'}" for s in STRATEGIES.values()))


def check_contenders(contenders: Sequence[Contender], space: Any) -> None:
    """Raise ValueError naming the contender if a strategy option is not declared or its value is bad, before
    anything is measured."""
    for c in contenders:
        try:
            check_strategy_options(c.strategy, c.options, space)
        except ValueError as err:
            raise ValueError(f"contender {c.label}: {err}") from None


def parse_contenders(specs: Sequence[str]) -> list[Contender]:
    out = [parse_contender(s) for s in specs]
    labels = [c.label for c in out]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ValueError(f"contender label given twice: {', '.join(dup)}")
    return out


def tune_kwargs(c: Contender) -> dict[str, Any]:
    """tune's keywords for one contender (those it leaves at None keep tune's defaults)."""
    out: dict[str, Any] = {"transfer": list(c.transfer), "features": c.features or AUTO,
                           "options": dict(c.options) or None}
    if c.batch is not None:
        out["batch_size"] = c.batch
    if c.transfer_as is not None:
        out["transfer_as"] = c.transfer_as
    return out


def filter_transfer(src: str | Path, task: Task, out: Path) -> tuple[int, int, dict[str, int]]:
    """Write `src` less the records of `task`'s own workload (any device: the answer must not be in the
    warm-up) to `out`; returns (kept, dropped, kept count by 'op shape @ device')."""
    if not Path(src).exists():
        raise ValueError(f"transfer log {src} does not exist")
    kept, dropped, by = [], 0, {}
    for r in records.load(src):
        if r.op == task.op and r.workload_key == task.workload_key:
            dropped += 1
            continue
        kept.append(r)
        shape = ",".join(f"{k}={v}" for k, v in sorted(r.workload.items()))
        name = f"{r.op} {shape} @ {r.device}"
        by[name] = by.get(name, 0) + 1
    records.append(out, kept)
    return len(kept), dropped, by


def warm_contenders(contenders: Sequence[Contender], log: str | Path, task: Task,
                    tmp: Path) -> tuple[list[Contender], dict[str, Any]]:
    """`contenders` with those asking for `transfer=true` warmed by `log` less `task`'s own workload (written
    under `tmp`), plus the `xgb+transfer` contender; and what the warm-up kept, as printed."""
    warm = tmp / "transfer.jsonl"
    kept, dropped, by = filter_transfer(log, task, warm)
    print(f"transfer from {log}: {kept} records kept, {dropped} of this workload dropped")
    for where, n in sorted(by.items()):
        print(f"  {n:6d}  {where}")
    out = [replace(c, transfer=(str(warm),)) if c.transfer else c for c in contenders]
    out.append(Contender(TRANSFER_LABEL, "xgb", transfer=(str(warm),)))
    return out, {"log": str(log), "kept": kept, "dropped_own_workload": dropped, "by": by}
