"""Program features for records that lack them: logs written before the build workers computed them, or by
another PROGRAM_FEATURES_VERSION. `autotune featurize LOG...` runs it.

Each record is lowered for its own target (the one it was measured on, rebuilt from the record's target
JSON), not this machine's. Only records of the template code installed here are featurized unless
`include_stale`: a stale record's kernel came from other code, so today's lowering would describe a program
that was never measured. A config that no longer lowers keeps its line as it is.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from typing import Any

import search_spaces

from . import records
from .build import Builder
from .targets import GPUS, Device, GpuSpec
from .task import Task


def record_device(name: str, target: dict[str, Any]) -> Device:
    """The Device a record was measured on, from its `device` name and `target` JSON (Device.to_json)."""
    if not isinstance(target, dict) or "kind" not in target:
        raise ValueError(f"record target {target!r} is not a TVM target JSON object")
    pairs = tuple((k, json.dumps(v) if k == "host" else tuple(v) if isinstance(v, list) else v)
                  for k, v in target.items())  # hashable, as Device keeps it
    gpu = None
    if target["kind"] == "cuda":
        arch = str(target.get("arch", ""))
        gpu = GPUS.get(arch) or GpuSpec(card=name, arch=arch, sms=0)
    return Device(name=name, target_json=pairs, cores=int(target.get("num-cores", 0) or 0), gpu=gpu)


def add_program_features(path: str | os.PathLike[str], builder: Builder | None = None,
                         include_stale: bool = False) -> int:
    """Add program features to the records of the log at `path` that lack them or carry another
    features_version, rewriting it atomically; returns how many records gained them. Every other line is
    kept byte for byte; a featurized line the tuner wrote (compact, sorted keys) differs only by the two new
    fields. Never while a tuner appends to the log."""
    from cost_model.program import PROGRAM_FEATURES_VERSION

    lines = open(path, encoding="utf-8").read().splitlines(keepends=True)
    todo: dict[tuple[str, str, str, str], dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    parsed: dict[int, records.Record] = {}
    for i, line in enumerate(lines):
        try:
            r = records.Record.from_json(line)
        except (ValueError, TypeError, KeyError):
            continue
        if r.features and r.features_version == PROGRAM_FEATURES_VERSION:
            continue
        if not include_stale and r.template_version != records.current_version(r.op, r.device):
            continue
        parsed[i] = r
        task_key = (r.op, json.dumps(r.workload, sort_keys=True), r.device, json.dumps(r.target, sort_keys=True))
        todo[task_key][json.dumps(r.config, sort_keys=True)].append(i)  # the config itself, not its key field
    if not todo:
        return 0
    own = builder is None
    builder = builder or Builder(workers=min(2, os.cpu_count() or 1))
    n = 0
    try:
        for (op, _, device, target), by_config in todo.items():
            first = parsed[next(iter(by_config.values()))[0]]
            try:
                template = search_spaces.get(op)
                task = Task(op, template.Workload.from_json(first.workload), record_device(device, json.loads(target)))
                space = task.space
            except Exception:  # an operator not installed here, or a workload it no longer takes: left as is
                continue
            configs, where = [], []
            for idx in by_config.values():
                try:
                    configs.append(space.from_json(parsed[idx[0]].config))
                except Exception:  # a config of an older space
                    continue
                where.append(idx)
            for idx, feats in zip(where, builder.featurize(task, configs)):
                if not feats:
                    continue
                for i in idx:
                    lines[i] = _with_features(lines[i], feats, PROGRAM_FEATURES_VERSION)
                    n += 1
    finally:
        if own:
            builder.close()
    if n:
        records.rewrite(path, lines)
    return n


def _with_features(line: str, features: dict[str, float], version: str) -> str:
    """The line with `features` and `features_version` set, every other field as it was: edited as JSON,
    not re-serialized from a Record, so fields the Record would normalise stay untouched."""
    d = json.loads(line)
    d["features"], d["features_version"] = features, version
    end = line[len(line.rstrip("\r\n")):] or "\n"
    return json.dumps(d, sort_keys=True, separators=(",", ":")) + end
