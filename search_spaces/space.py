"""The knob language: what a template may vary, and the configs the search moves between.

A knob is declared once, at module level in its template, with a docstring-like `doc` saying why it matters.
Knobs whose domain depends on the workload (a split of the embedding dimension, say) are declared without
their extent and bound with `.over(extent)` when the template builds its `Space`. Schedules read a config
with the knob object itself, `cfg[VECTOR]`, so a misspelt knob is a NameError, not a silent default.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator, Sequence

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


class Space:
    """A finite set of configs: the product of knob domains, filtered by constraints."""

    def __init__(self, knobs: Sequence[Knob], constraints: Sequence[Constraint] = ()):
        names = [k.name for k in knobs]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate knob names in {names}")
        self.knobs: tuple[Knob, ...] = tuple(knobs)
        self.constraints: tuple[Constraint, ...] = tuple(constraints)
        self._domains = [k.values for k in self.knobs]
        for knob, dom in zip(self.knobs, self._domains):
            if not dom:
                raise ValueError(f"knob {knob.name} has an empty domain")

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
        """Number of valid configs (enumerates; spaces here are thousands, not billions)."""
        return sum(1 for _ in self)

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

    def sample(self, rng: random.Random, tries: int = 1000) -> Config:
        """A uniformly random valid config (rejection sampling over the knob product)."""
        names = [k.name for k in self.knobs]
        for _ in range(tries):
            cfg = Config(tuple((n, rng.choice(d)) for n, d in zip(names, self._domains)))
            if self.is_valid(cfg):
                return cfg
        valid = list(self)
        if not valid:
            raise ValueError("the space has no valid config")
        return rng.choice(valid)

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
