"""The knob language: what a template may vary, and the configs the search moves between.

A knob is declared once, at module level in its template, with a docstring-like `doc` saying why it matters.
Knobs whose domain depends on the workload (a split of the embedding dimension, say) are declared without
their extent and bound with `.over(extent)` when the template builds its `Space`. Schedules read a config
with the knob object itself, `cfg[VECTOR]`, so a misspelt knob is a NameError, not a silent default.

A space may name *path* knobs: knobs whose values select different generated code (tensor cores, dp4a or
plain multiply-adds). Constraints make the paths' shares of the space very unequal, so uniform sampling would
rarely visit a small path; `sample` therefore picks a path first, and `spread` covers every path.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

__all__ = ["Choice", "Config", "InvalidConfig", "Knob", "Space", "Split", "Constraint"]


class InvalidConfig(ValueError):
    """A config the template cannot apply (a constraint the space could not express up front)."""


def _factorizations(extent: int, parts: int, pow2: bool) -> tuple[tuple[int, ...], ...]:
    """All ordered tuples of `parts` positive ints whose product is `extent` (powers of two if asked)."""
    divisors = [d for d in range(1, extent + 1) if extent % d == 0]
    if pow2:
        divisors = [d for d in divisors if d & (d - 1) == 0]

    def rec(rest: int, k: int) -> Iterator[tuple[int, ...]]:
        if k == 1:
            if not pow2 or rest & (rest - 1) == 0:
                yield (rest,)
            return
        for d in divisors:
            if rest % d == 0:
                for tail in rec(rest // d, k - 1):
                    yield (d, *tail)

    return tuple(rec(extent, parts))


@dataclass(frozen=True)
class Knob:
    """Base of all knobs: a name, the reason it exists, and a finite ordered domain."""

    name: str
    doc: str = field(default="", compare=False, kw_only=True)

    @property
    def values(self) -> tuple[Any, ...]:  # pragma: no cover - abstract
        raise NotImplementedError

    def encode(self, value: Any) -> list[float]:
        """Numeric features of a value, for the cost model."""
        raise NotImplementedError

    def to_json(self, value: Any) -> Any:
        return value

    def from_json(self, raw: Any) -> Any:
        return raw

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class Split(Knob):
    """Factorisation of a loop extent into `parts` factors (outer to inner); the product is the extent."""

    parts: int = 2
    extent: int | None = None
    pow2: bool = False

    def over(self, extent: int) -> "Split":
        """This split bound to a concrete extent (known only once the workload is)."""
        if extent < 1:
            raise ValueError(f"split {self.name}: extent must be positive, got {extent}")
        return replace(self, extent=extent)

    @property
    def values(self) -> tuple[tuple[int, ...], ...]:
        if self.extent is None:
            raise ValueError(f"split {self.name} is not bound to an extent; call .over(extent)")
        return _factorizations(self.extent, self.parts, self.pow2)

    def encode(self, value: tuple[int, ...]) -> list[float]:
        return [math.log2(v) for v in value]

    def to_json(self, value: tuple[int, ...]) -> list[int]:
        return list(value)

    def from_json(self, raw: Any) -> tuple[int, ...]:
        return tuple(int(v) for v in raw)

    def describe(self) -> str:
        kind = "power-of-two " if self.pow2 else ""
        return f"{kind}split of {self.extent if self.extent is not None else 'N'} into {self.parts} factors"


@dataclass(frozen=True)
class Choice(Knob):
    """One value out of an ordered list (numbers, strings or booleans)."""

    options: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if not self.options:
            raise ValueError(f"choice {self.name} has no options")

    def only(self, options: Iterable[Any]) -> "Choice":
        """This choice restricted to the options a workload allows, in declaration order."""
        allowed = set(options)
        kept = tuple(o for o in self.options if o in allowed)
        if not kept:
            raise ValueError(f"choice {self.name}: none of {sorted(map(str, allowed))} is an option")
        return replace(self, options=kept)

    def leading(self, option: Any) -> "Choice":
        """This choice with `option` first, the rest in declaration order: a workload's untuned default (the
        first valid config is the space's default, measured first by a tuning run)."""
        if option not in self.options:
            raise ValueError(f"choice {self.name}: {option!r} is not an option ({self.describe()})")
        return replace(self, options=(option,) + tuple(o for o in self.options if o != option))

    @property
    def values(self) -> tuple[Any, ...]:
        return self.options

    def encode(self, value: Any) -> list[float]:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return [float(self.options.index(value))]
        return [math.log2(value) if value > 0 else -1.0]

    def describe(self) -> str:
        return "one of " + ", ".join(map(str, self.options))


@dataclass(frozen=True)
class Constraint:
    """A predicate every config of the space satisfies; `why` is shown to users."""

    why: str
    holds: Callable[["Config"], bool] = field(compare=False)


@dataclass(frozen=True)
class Config:
    """A frozen, hashable point of a space: knob name -> value, in the space's knob order."""

    items: tuple[tuple[str, Any], ...]

    def __getitem__(self, knob: Knob) -> Any:
        for name, value in self.items:
            if name == knob.name:
                return value
        raise KeyError(f"config has no knob {knob.name!r} (it has {', '.join(n for n, _ in self.items)})")

    def as_dict(self) -> dict[str, Any]:
        return dict(self.items)

    def to_json(self) -> dict[str, Any]:
        return {name: list(v) if isinstance(v, tuple) else v for name, v in self.items}

    def key(self) -> str:
        """Canonical text of the config: equal configs give equal keys (used for resume and dedup)."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    def __str__(self) -> str:
        return " ".join(f"{n}={'x'.join(map(str, v)) if isinstance(v, tuple) else v}" for n, v in self.items)


SPREAD_CRITERIA = ("distance", "coverage")  # how Space.spread spreads a first batch (see there)


class Space:
    """A finite set of configs: the product of knob domains, filtered by constraints.

    `paths` names the knobs whose values select different generated code (a path is the tuple of their
    values, `path_of`); sampling is uniform over the paths that have a valid config, then uniform within one.
    """

    def __init__(self, knobs: Sequence[Knob], constraints: Sequence[Constraint] = (), paths: Sequence[str] = ()):
        names = [k.name for k in knobs]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate knob names in {names}")
        self.knobs: tuple[Knob, ...] = tuple(knobs)
        self.constraints: tuple[Constraint, ...] = tuple(constraints)
        self._names = tuple(names)
        self._domains = [k.values for k in self.knobs]
        for knob, dom in zip(self.knobs, self._domains):
            if not dom:
                raise ValueError(f"knob {knob.name} has an empty domain")
        paths = (paths,) if isinstance(paths, str) else tuple(paths)
        unknown = [p for p in paths if p not in names]
        if unknown:
            raise ValueError(f"unknown path knob(s) {unknown}: the space's knobs are {names}")
        if len(set(paths)) != len(paths):
            raise ValueError(f"path knobs named twice in {list(paths)}")
        self.paths: tuple[str, ...] = paths
        self._path_index = tuple(names.index(p) for p in paths)
        self._present: tuple[tuple[Any, ...], ...] | None = None  # paths_present(), found once
        self._valid: dict[tuple[Any, ...], list[Config]] = {}  # a path's valid configs, when rejection fails
        self._unit: tuple[np.ndarray, np.ndarray] | None = None  # per-column (low, span) of the encodings
        self._len: int | None = None  # len(self), found once

    # ---- construction and validation -------------------------------------------------------------
    def make(self, values: dict[str, Any]) -> Config:
        """A config from knob values; raises InvalidConfig if a value is unknown or a constraint fails."""
        missing = [k.name for k in self.knobs if k.name not in values]
        extra = sorted(set(values) - {k.name for k in self.knobs})
        if missing or extra:
            raise InvalidConfig(f"config knobs do not match the space: missing {missing}, unknown {extra}")
        items = []
        for knob, dom in zip(self.knobs, self._domains):
            value = knob.from_json(values[knob.name])
            if value not in dom:
                raise InvalidConfig(f"{knob.name}={value!r} is not in its domain ({knob.describe()})")
            items.append((knob.name, value))
        cfg = Config(tuple(items))
        for c in self.constraints:
            if not c.holds(cfg):
                raise InvalidConfig(f"{cfg} violates: {c.why}")
        return cfg

    def from_json(self, raw: dict[str, Any]) -> Config:
        return self.make(raw)

    def is_valid(self, cfg: Config) -> bool:
        return all(c.holds(cfg) for c in self.constraints)

    def __contains__(self, cfg: Config) -> bool:
        try:
            return self.make(cfg.as_dict()) == cfg
        except InvalidConfig:
            return False

    # ---- enumeration and sampling ------------------------------------------------------------------
    @property
    def raw_size(self) -> int:
        """Size of the knob product before constraints."""
        return math.prod(len(d) for d in self._domains)

    def __len__(self) -> int:
        """Number of valid configs (enumerates the whole product once, then cached: a fused embedding space has
        millions of combinations, ~30 s; `size_up_to` answers "at least n?" without that)."""
        if self._len is None:
            self._len = sum(1 for _ in self)
        return self._len

    def size_up_to(self, limit: int) -> int:
        """The number of valid configs, counted no further than `limit` (min(len(self), limit)): whether the space
        holds a run's trials, found from its first valid configs instead of all of them."""
        if self._len is not None:
            return min(self._len, limit)
        return sum(1 for _ in itertools.islice(self, max(0, limit)))

    def __iter__(self) -> Iterator[Config]:
        names = [k.name for k in self.knobs]
        for combo in itertools.product(*self._domains):
            cfg = Config(tuple(zip(names, combo)))
            if self.is_valid(cfg):
                yield cfg

    def default(self) -> Config:
        """The first valid config in declaration order: templates list their safe untuned choice first."""
        for cfg in self:
            return cfg
        raise ValueError("the space has no valid config")

    # ---- code paths ------------------------------------------------------------------------------
    def path_of(self, cfg: Config) -> tuple[Any, ...]:
        """The code path a config takes: the values of the path knobs, in `paths` order (() without paths)."""
        values = dict(cfg.items)
        try:
            return tuple(values[p] for p in self.paths)
        except KeyError:
            raise ValueError(f"config {cfg} lacks the path knobs {list(self.paths)}") from None

    def paths_present(self) -> tuple[tuple[Any, ...], ...]:
        """The paths with at least one valid config, in declaration order; found once, then cached."""
        if self._present is None:
            probe = random.Random(0)  # private: what sample() draws must not depend on what is cached yet
            self._present = tuple(
                path for path in itertools.product(*(self._domains[i] for i in self._path_index))
                if self._draw(path, probe, 200) is not None or next(self._iter_path(path), None) is not None)
        return self._present

    def configs_of_path(self, path: tuple[Any, ...]) -> Iterator[Config]:
        """The valid configs of one code path (`path_of`), in declaration order."""
        if len(path) != len(self.paths):
            raise ValueError(f"a path names {len(self.paths)} values ({list(self.paths)}), got {path!r}")
        return self._iter_path(tuple(path))

    def _iter_path(self, path: tuple[Any, ...]) -> Iterator[Config]:
        """The valid configs of one path, in declaration order (the product of the other knobs' domains)."""
        domains = list(self._domains)
        for i, value in zip(self._path_index, path):
            domains[i] = (value,)
        for combo in itertools.product(*domains):
            cfg = Config(tuple(zip(self._names, combo)))
            if self.is_valid(cfg):
                yield cfg

    def _draw(self, path: tuple[Any, ...], rng: random.Random, tries: int) -> Config | None:
        """Rejection sampling within a path (its knobs fixed, the others drawn in knob order), or None.

        Without paths every knob is drawn, exactly as before paths existed: seeded runs repeat."""
        fixed = dict(zip(self._path_index, path))
        for _ in range(tries):
            cfg = Config(tuple((name, fixed[i] if i in fixed else rng.choice(dom))
                               for i, (name, dom) in enumerate(zip(self._names, self._domains))))
            if self.is_valid(cfg):
                return cfg
        return None

    def sample(self, rng: random.Random, tries: int = 1000, path: tuple[Any, ...] | None = None) -> Config:
        """A random valid config: a path uniformly among those present (or the given `path`), then a uniform
        config within it (rejection sampling, falling back to the path's enumerated valid configs, cached)."""
        if path is not None:
            if len(path) != len(self.paths):
                raise ValueError(f"a path names {len(self.paths)} values ({list(self.paths)}), got {path!r}")
            path = tuple(path)
        elif self.paths:
            present = self.paths_present()
            if not present:
                raise ValueError("the space has no valid config")
            path = rng.choice(present)
        else:
            path = ()
        cfg = self._draw(path, rng, tries)
        if cfg is not None:
            return cfg
        if path not in self._valid:
            self._valid[path] = list(self._iter_path(path))
        if not self._valid[path]:
            raise ValueError("the space has no valid config")
        return rng.choice(self._valid[path])

    def spread(self, n: int, rng: random.Random, first: Sequence[Config] = (),
               criterion: str = "distance") -> list[Config]:
        """n distinct valid configs spread over the space, for a first batch that no model has chosen.

        Starts with `first` (the default config, say), then picks greedily out of a pool of max(64, 16 n)
        samples, paths missing from the picks first, by `criterion`:
        - "distance": the config farthest (maximin Euclidean distance over the knob encodings, each column
          scaled to [0, 1] by its domain) from those already picked. Far apart means the corners of the space,
          which are mostly slow;
        - "coverage": the config with the most (knob, value) pairs not yet picked (a new round once every
          value the pool has is in), ties to the earlier drawn: each knob's values are tried about equally
          often, as in a stratified design, and the picks are as typical as random ones."""
        if criterion not in SPREAD_CRITERIA:
            raise ValueError(f"spread: criterion must be one of {', '.join(SPREAD_CRITERIA)}, not {criterion!r}")
        if n < 0:
            raise ValueError(f"spread: n must be >= 0, got {n}")
        chosen = list(first)
        if len(chosen) > n:
            raise ValueError(f"spread: {len(chosen)} first configs given for n={n}")
        if len(set(chosen)) != len(chosen):
            raise ValueError("spread: the first configs repeat a config")
        bad = [str(c) for c in chosen if c not in self]
        if bad:
            raise ValueError(f"spread: first configs not in this space: {bad}")
        need, taken = n - len(chosen), set(chosen)
        if need == 0:
            return chosen
        pool = [c for c in dict.fromkeys(self.sample(rng) for _ in range(max(64, 16 * n))) if c not in taken]
        if len(pool) < need:  # a small space (or a huge n): take all that is left
            pool = [c for c in self if c not in taken]
            rng.shuffle(pool)
            if len(pool) < need:
                raise ValueError(f"spread: {n} distinct configs asked for, but the space has only "
                                 f"{len(pool) + len(taken)} valid configs")
        if criterion == "distance":
            points = self._unit_rows(pool)
            nearest = np.full(len(pool), np.inf)  # distance of each pool config to the nearest pick so far
            for row in self._unit_rows(chosen):
                nearest = np.minimum(nearest, np.sqrt(((points - row) ** 2).sum(axis=1)))
        else:
            pairs = [set(c.items) for c in pool]
            every = set().union(*pairs)
            covered = set().union(*(c.items for c in chosen)) & every
        kinds = list(dict.fromkeys(self.path_of(c) for c in pool))
        path_ids = np.array([kinds.index(self.path_of(c)) for c in pool])
        uncovered = np.ones(len(kinds), dtype=bool)
        for c in chosen:
            if self.path_of(c) in kinds:
                uncovered[kinds.index(self.path_of(c))] = False
        free = np.ones(len(pool), dtype=bool)
        for _ in range(need):
            allowed = free & uncovered[path_ids] if uncovered.any() else free
            if criterion == "distance":
                j = int(np.argmax(np.where(allowed, nearest, -np.inf)))
                nearest = np.minimum(nearest, np.sqrt(((points - points[j]) ** 2).sum(axis=1)))
            else:
                if covered >= every:
                    covered = set()
                gain = np.array([len(p - covered) for p in pairs], dtype=float)
                j = int(np.argmax(np.where(allowed, gain, -np.inf)))
                covered |= pairs[j]
            chosen.append(pool[j])
            free[j] = False
            uncovered[path_ids[j]] = False
        return chosen

    def _unit_rows(self, configs: Sequence[Config]) -> np.ndarray:
        """Encodings of configs with each column scaled to [0, 1] over its knob's domain (so that no knob
        weighs more in a distance for its units: log2 of a tile against an option index)."""
        if self._unit is None:
            lows, highs = [], []
            for knob, dom in zip(self.knobs, self._domains):
                enc = np.array([knob.encode(v) for v in dom], dtype=float)
                lows += list(enc.min(axis=0))
                highs += list(enc.max(axis=0))
            low, high = np.array(lows), np.array(highs)
            self._unit = low, np.where(high > low, high - low, 1.0)
        low, span = self._unit
        rows = np.array([self.encode(c) for c in configs], dtype=float).reshape(len(configs), len(low))
        return (rows - low) / span

    def neighbour(self, cfg: Config, rng: random.Random, tries: int = 100) -> Config:
        """A valid config differing from `cfg` in one knob, moved to an adjacent value (or any, at random)."""
        movable = [i for i, d in enumerate(self._domains) if len(d) > 1]
        if not movable:
            return cfg
        for _ in range(tries):
            i = rng.choice(movable)
            dom = self._domains[i]
            pos = dom.index(cfg.items[i][1])
            if rng.random() < 0.7:  # a small step keeps annealing local; a jump escapes plateaus
                pos = min(len(dom) - 1, max(0, pos + rng.choice((-1, 1))))
            else:
                pos = rng.randrange(len(dom))
            items = list(cfg.items)
            items[i] = (items[i][0], dom[pos])
            cand = Config(tuple(items))
            if cand != cfg and self.is_valid(cand):
                return cand
        return cfg

    # ---- features ---------------------------------------------------------------------------------
    def feature_names(self) -> list[str]:
        names = []
        for knob, dom in zip(self.knobs, self._domains):
            width = len(knob.encode(dom[0]))
            names += [knob.name] if width == 1 else [f"{knob.name}.{i}" for i in range(width)]
        return names

    def encode(self, cfg: Config) -> list[float]:
        out: list[float] = []
        for knob, (_, value) in zip(self.knobs, cfg.items):
            out += knob.encode(value)
        return out

    def describe(self) -> list[str]:
        return [f"{k.name}: {k.describe()}. {k.doc}".rstrip() for k in self.knobs]
