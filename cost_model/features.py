"""Candidates -> named feature rows, the cost model's view of a (device, operator, workload, config).

A row is a dict of named numbers, so rows of different operators, devices and feature sets share one model:
the matrix's columns are the union of the names, and a name a row lacks is missing (NaN), which XGBoost
routes on its own. Names say where a number comes from:

- `w.*` the workload (rows, dim, batch, ...), `op.<name>` which operator: shapes of one operator share a model;
- `d.*` the device (cores, vector extensions; SMs and compute capability on GPUs): CPU models share one;
- `k.<op>.*` the config's knob encodings: meaningful only within one operator;
- `p.*` features of the lowered, scheduled program (`cost_model.program`, computed in the build workers):
  the only part operators have in common, so other operators' logs teach the model through it.

The feature sets are `knobs` (w, op, d, k), `program` (w, op, d, p) and `all` (everything).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from search_spaces import Config, Space

@dataclass(frozen=True)
class FeatureSet:
    """A feature set, declared once: the cost model, `tune`, the CLI and the benchmarks read it from here."""

    name: str
    knobs: bool  # k.<op>.* knob encodings
    program: bool  # p.* features of the lowered program
    doc: str


FEATURE_SETS: dict[str, FeatureSet] = {f.name: f for f in (
    FeatureSet("knobs", knobs=True, program=False, doc="knob encodings"),
    FeatureSet("program", knobs=False, program=True, doc="program features of the lowered code"),
    FeatureSet("all", knobs=True, program=True, doc="both"),
)}
AUTO = "auto"
AUTO_FEATURES = "all"  # what `features="auto"` means: the set that ranked best (benchmarks/rank_quality.py)
TUNE_FEATURE_SETS = (AUTO, *FEATURE_SETS)  # what tune(features=...) and `autotune tune --features` take
_CPU_EXTENSIONS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vnni", "avxvnni", "amx-int8")


def uses_knobs(feature_set: str) -> bool:
    return feature_set in FEATURE_SETS and FEATURE_SETS[feature_set].knobs


def uses_program(feature_set: str) -> bool:
    return feature_set in FEATURE_SETS and FEATURE_SETS[feature_set].program


def check_feature_set(feature_set: str) -> str:
    if feature_set not in FEATURE_SETS:
        raise ValueError(f"unknown feature set {feature_set!r}; known: {', '.join(FEATURE_SETS)}")
    return feature_set


def resolve_feature_set(feature_set: str) -> str:
    """What tune's `features` names: a feature set, or "auto" for AUTO_FEATURES."""
    if feature_set == AUTO:
        return AUTO_FEATURES
    if feature_set not in FEATURE_SETS:
        raise ValueError(f"unknown feature set {feature_set!r}; known: {', '.join(TUNE_FEATURE_SETS)}")
    return feature_set


def describe_feature_sets() -> str:
    """One line for --help: each name tune takes and what it means."""
    return "; ".join([f"{AUTO}: {AUTO_FEATURES} (the set that ranked best)",
                      *(f"{f.name}: {f.doc}" for f in FEATURE_SETS.values())])


def workload_features(op: str, workload: Any) -> dict[str, float]:
    return {f"op.{op}": 1.0, **{f"w.{k}": float(v) for k, v in workload.numeric_features().items()}}


def device_features(target: Mapping[str, Any]) -> dict[str, float]:
    """What of a device's target (as records store it) bears on which config is fastest."""
    return dict(_device_features(json.dumps(dict(target), sort_keys=True)))


@functools.cache
def _device_features(target_json: str) -> tuple[tuple[str, float], ...]:
    target = json.loads(target_json)
    if target.get("kind") == "cuda":
        arch = str(target.get("arch", "sm_0")).removeprefix("sm_")
        digits = "".join(ch for ch in arch if ch.isdigit()) or "0"
        out = {"d.gpu": 1.0, "d.sm": float(digits), "d.threads_per_block": float(target.get("max_num_threads", 0))}
        return tuple(out.items())
    out = {"d.gpu": 0.0, "d.cores": float(target.get("num-cores", 0))}
    mcpu = target.get("mcpu")
    if mcpu:
        import tvm
        from tvm.target import codegen

        tgt = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
        for ext in _CPU_EXTENSIONS:
            out[f"d.{ext}"] = float(bool(codegen.target_has_features([ext], tgt)))
    return tuple(out.items())


def knob_features(op: str, space: Space, cfg: Config) -> dict[str, float]:
    return {f"k.{op}.{n}": v for n, v in zip(space.feature_names(), space.encode(cfg))}


def row(op: str, workload: Any, space: Space | None, cfg: Config | None, target: Mapping[str, Any],
        program: Mapping[str, float] | None, feature_set: str) -> dict[str, float]:
    """One candidate's features in `feature_set` (knob features need `space` and `cfg`)."""
    out = workload_features(op, workload)
    out.update(device_features(target))
    if uses_knobs(feature_set) and space is not None and cfg is not None:
        out.update(knob_features(op, space, cfg))
    if uses_program(feature_set) and program:
        out.update(program)
    return out


class Columns:
    """An ordered set of feature names: rows -> a float32 matrix, NaN where a row lacks a name."""

    def __init__(self, names: Iterable[str]):
        self.names: tuple[str, ...] = tuple(sorted(set(names)))
        self.index = {n: i for i, n in enumerate(self.names)}

    @classmethod
    def union(cls, rows: Iterable[Mapping[str, float]]) -> "Columns":
        names: set[str] = set()
        for r in rows:
            names.update(r)
        return cls(names)

    def __len__(self) -> int:
        return len(self.names)

    def matrix(self, rows: Sequence[Mapping[str, float]]) -> np.ndarray:
        out = np.full((len(rows), len(self.names)), np.nan, dtype=np.float32)
        for i, r in enumerate(rows):
            for name, value in r.items():
                j = self.index.get(name)
                if j is not None:
                    out[i, j] = value
        return out


class TaskFeaturizer:
    """Feature matrices for one task's candidates, as the search asks for thousands of them per batch.

    The workload and device part is the same for every candidate and each config's knob encoding is computed
    once, so scoring the whole space again after each batch costs a gather, not a Python loop over knobs."""

    def __init__(self, op: str, workload: Any, space: Space, target: Mapping[str, Any], feature_set: str):
        self.op, self.workload, self.space, self.feature_set = op, workload, space, check_feature_set(feature_set)
        self.base = row(op, workload, None, None, target, None, feature_set)
        self._knobs: dict[Config, list[float]] = {}
        self.program: dict[Config, dict[str, float]] = {}  # program features of configs built or lowered so far
        self._knob_names = [f"k.{op}.{n}" for n in space.feature_names()]

    def names(self) -> set[str]:
        """The names this task's rows can have (program names are known once a program is featurized)."""
        out = set(self.base)
        if uses_knobs(self.feature_set):
            out.update(self._knob_names)
        for p in list(self.program.values())[:1]:
            out.update(p)
        return out

    def row(self, cfg: Config) -> dict[str, float]:
        out = dict(self.base)
        if uses_knobs(self.feature_set):
            out.update(zip(self._knob_names, self._encoded(cfg)))
        if uses_program(self.feature_set):
            out.update(self.program.get(cfg, {}))
        return out

    def _encoded(self, cfg: Config) -> list[float]:
        enc = self._knobs.get(cfg)
        if enc is None:
            enc = self._knobs[cfg] = self.space.encode(cfg)
        return enc

    def matrix(self, columns: Columns, cfgs: Sequence[Config]) -> np.ndarray:
        """Rows of `cfgs` in `columns`' order; fast for knob features (no per-name dict work per config)."""
        out = np.full((len(cfgs), len(columns)), np.nan, dtype=np.float32)
        for name, value in self.base.items():
            j = columns.index.get(name)
            if j is not None:
                out[:, j] = value
        if uses_knobs(self.feature_set) and cfgs:
            cols = [columns.index.get(n) for n in self._knob_names]
            keep = [i for i, j in enumerate(cols) if j is not None]
            if keep:
                enc = np.asarray([self._encoded(c) for c in cfgs], dtype=np.float32)
                out[:, [cols[i] for i in keep]] = enc[:, keep]
        if uses_program(self.feature_set):
            for i, cfg in enumerate(cfgs):
                for name, value in self.program.get(cfg, {}).items():
                    j = columns.index.get(name)
                    if j is not None:
                        out[i, j] = value
        return out
