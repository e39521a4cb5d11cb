"""The tuning log: one JSON object a line, append-only, locked, fsynced per batch, tolerant of damage.

A log is the project's memory: it resumes interrupted runs, trains the cost model, and names the kernel
to export. So a write must never lose earlier lines, and a damaged line must never stop a reader.
"""

from __future__ import annotations

import fcntl
import functools
import importlib.resources
import json
import math
import os
import statistics
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple

# 2: records carry `template_version`. Version-1 lines still load, with template_version "" (stale).
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)

# Error kinds a measurement can end in; None means the candidate ran and matched the reference.
# "harness": the measuring machinery failed (not the candidate), so resume measures the config again.
ERROR_KINDS = ("invalid", "build", "build_timeout", "crash", "timeout", "runtime", "wrong", "harness")


class CorruptLogWarning(UserWarning):
    pass


class TaskKey(NamedTuple):
    """One tuning task's identity, the same everywhere: a record's `task`, a `Task`'s `key`, a log's and the
    measurement cache's index, and `tune_model`'s tasks."""

    op: str
    workload_key: str
    device: str


@dataclass(frozen=True)
class Record:
    """One measured (or failed) candidate."""

    op: str
    workload: dict[str, Any]
    workload_key: str
    device: str
    target: dict[str, Any]
    config: dict[str, Any]
    config_key: str
    costs: tuple[float, ...] = ()
    error_kind: str | None = None
    error: str | None = None
    build_s: float = 0.0
    timestamp: float = field(default_factory=time.time)
    tvm_version: str = ""
    template_version: str = ""  # search_spaces.version.template_version of the code that made the kernel
    version: int = FORMAT_VERSION
    # cost_model.program features of the lowered kernel, and the PROGRAM_FEATURES_VERSION that computed them.
    # Optional: lines without them (older logs, candidates that did not lower) load with None and "".
    features: dict[str, float] | None = None
    features_version: str = ""

    @property
    def ok(self) -> bool:
        return self.error_kind is None and bool(self.costs)

    @property
    def latency(self) -> float:
        """Median seconds of one call; infinity for a failed candidate."""
        return statistics.median(self.costs) if self.ok else math.inf

    @property
    def task(self) -> TaskKey:
        return TaskKey(self.op, self.workload_key, self.device)

    def to_json(self) -> str:
        d = asdict(self)
        d["costs"] = list(self.costs)
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> "Record":
        d = json.loads(line)
        if not isinstance(d, dict) or d.get("version") not in READABLE_VERSIONS:
            raise ValueError(f"not a version-{'/'.join(map(str, READABLE_VERSIONS))} record")
        d["costs"] = tuple(float(c) for c in d.get("costs", ()))
        if d.get("error_kind") not in (None, *ERROR_KINDS):
            raise ValueError(f"unknown error kind {d.get('error_kind')!r}")
        feats = d.get("features")
        if feats is not None:
            if not isinstance(feats, dict) or not all(isinstance(v, (int, float)) for v in feats.values()):
                raise ValueError("features must map names to numbers")
            d["features"] = {str(k): float(v) for k, v in feats.items()}
        return cls(**d)


def append(path: str | os.PathLike[str], records: Iterable[Record]) -> None:
    """Append a batch under an exclusive lock and fsync it, so concurrent tuners and crashes lose nothing."""
    lines = "".join(r.to_json() + "\n" for r in records)
    if not lines:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            # A previous writer killed mid-line leaves no newline: start on a fresh line so only that one
            # line is lost, not ours too.
            if f.tell() > 0:
                with open(path, "rb") as r:
                    r.seek(-1, os.SEEK_END)
                    if r.read(1) != b"\n":
                        f.write("\n")
            f.write(lines)
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load(path: str | os.PathLike[str]) -> Iterator[Record]:
    """Every readable record of a log; a damaged line is skipped with a warning. A missing log is empty."""
    path = Path(path)
    if not path.exists():
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield Record.from_json(line)
            except (ValueError, TypeError, KeyError) as err:
                warnings.warn(f"{path}:{n}: skipping corrupt record ({err})", CorruptLogWarning, stacklevel=2)


def load_many(paths: Iterable[str | os.PathLike[str]]) -> list[Record]:
    return [r for p in paths for r in load(p)]


def for_task(records: Iterable[Record], op: str, workload_key: str, device: str) -> list[Record]:
    want = TaskKey(op, workload_key, device)
    return [r for r in records if r.task == want]


def best(records: Iterable[Record], op: str, workload_key: str, device: str) -> Record | None:
    """The fastest correct config for one (op, workload, device), or None: its latest record, carrying the
    costs of every measurement of that config, so its latency is their median.

    Pooling is what makes a re-measurement count: the fastest of many single measurements on a noisy machine
    is biased low (the winner's curse), and the tuner measures its leaders again before it stops."""
    pooled: dict[str, Record] = {}
    for r in for_task(records, op, workload_key, device):
        if r.ok:
            seen = pooled.get(r.config_key)
            pooled[r.config_key] = r if seen is None else replace(r, costs=seen.costs + r.costs)
    return min(pooled.values(), key=lambda r: r.latency) if pooled else None


def current_version(op: str, device: str) -> str | None:
    """The template version records of `op` on `device` must carry to count (search_spaces.version); None if
    this installation has no such template, so its records cannot be shown current."""
    import search_spaces
    from search_spaces.version import template_version

    try:
        template = search_spaces.get(op)
    except (LookupError, ImportError):
        return None
    return template_version(template, device)


def current(records: Iterable[Record], include_stale: bool = False) -> list[Record]:
    """The records measured with the template code this installation has (all of them with `include_stale`)."""
    if include_stale:
        return list(records)
    versions: dict[tuple[str, str], str | None] = {}
    out = []
    for r in records:
        key = (r.op, r.device)
        if key not in versions:
            versions[key] = current_version(*key)
        if r.template_version == versions[key]:
            out.append(r)
    return out


def stale(path: str | os.PathLike[str]) -> list[Record]:
    """The records of a log that no code of this installation measured (another template version, or a template
    it lacks): what `current` ignores. A shipped log holds none (tests/test_records.py)."""
    recs = list(load(path))
    keep = {id(r) for r in current(recs)}
    return [r for r in recs if id(r) not in keep]


def drop_stale(path: str | os.PathLike[str]) -> int:
    """Rewrite a log without its stale records (atomically; lines that do not parse are kept byte for byte);
    returns how many were dropped. For maintainers pruning the shipped logs, never while a tuner writes to it."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    gone = {r.to_json() for r in stale(path)}
    out = []
    for line in lines:
        try:
            if Record.from_json(line).to_json() in gone:
                continue
        except (ValueError, TypeError, KeyError):
            pass
        out.append(line)
    rewrite(path, out)
    return len(lines) - len(out)


def retag(path: str | os.PathLike[str], op: str, device_kind: str, version: str | None = None,
          from_version: str | None = None) -> int:
    """Mark `op`'s records of one device kind ("cpu", "cuda") in `path` as measured with template `version`
    (default: the current one), rewriting the log atomically; returns how many were retagged. `from_version`
    retags only the records of that version (those the refactor's old code was current for), not older ones.

    For maintainers, after proving a refactor leaves the generated code unchanged; never while a tuner writes
    to the log. Other records, and lines that do not parse, are kept byte for byte.
    """
    def retagged(r: Record) -> Record | None:
        if r.device.split(":")[0] != device_kind or from_version not in (None, r.template_version):
            return None
        tag = version if version is not None else current_version(r.op, r.device)
        if tag is None:
            raise LookupError(f"no template {op!r} here to take the version from; pass version=")
        return replace(r, template_version=tag, version=FORMAT_VERSION)

    return _rewrite_records(path, op, retagged)


def add_knobs(path: str | os.PathLike[str], op: str, values: dict[str, Any]) -> int:
    """Give `op`'s records in `path` the knobs of `values` they lack (knobs that joined the space, at the values
    that generate the code the records measured), their config keys made again, rewriting the log atomically;
    returns how many changed. For maintainers, before proving with `autotune.lowered` that the records' code is
    unchanged and retagging them (`retag`); never while a tuner writes to the log. Other records, and lines that
    do not parse, are kept byte for byte."""
    def completed(r: Record) -> Record | None:
        missing = {k: v for k, v in values.items() if k not in r.config}
        if not missing:
            return None
        config = {**r.config, **missing}
        return replace(r, config=config, config_key=json.dumps(config, sort_keys=True, separators=(",", ":")),
                       version=FORMAT_VERSION)

    return _rewrite_records(path, op, completed)


def _rewrite_records(path: str | os.PathLike[str], op: str, change: Callable[[Record], Record | None]) -> int:
    """The log rewritten with `change(record)` (a new record, or None to keep the line) applied to `op`'s records."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    out, n = [], 0
    for line in lines:
        try:
            r = Record.from_json(line)
        except (ValueError, TypeError, KeyError):
            out.append(line)
            continue
        changed = change(r) if r.op == op else None
        if changed is None:
            out.append(line)
            continue
        out.append(changed.to_json() + "\n")
        n += 1
    rewrite(path, out)
    return n


def rewrite(path: str | os.PathLike[str], lines: Iterable[str]) -> None:
    """Replace a log's content with `lines` atomically: readers see the old log or the new one, never half,
    and the file keeps its permissions. Never while a tuner appends to it (its lines would be lost)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


@functools.cache
def _shipped_root() -> Path:
    """Where the shipped records are installed: package data `autotune._shipped_logs` (pyproject maps it to
    the repository's logs/), found through the import system so wheel and editable installs both work; the
    repository's logs/ for a source tree run without installing."""
    try:
        root = importlib.resources.files(f"{__package__}._shipped_logs")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / "logs"
    return Path(str(root.joinpath("README.md"))).parent


def shipped_logs(op: str, device: str) -> list[Path]:
    """Pre-tuned logs shipped with the project, logs/<device kind>/<op>.jsonl, like TVM's TopHub."""
    path = _shipped_root() / device.split(":")[0] / f"{op}.jsonl"
    return [path] if path.exists() else []
