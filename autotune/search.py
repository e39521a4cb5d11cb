"""Search strategies: each is one function that proposes the next batch of unmeasured configs.

`random_search` is the baseline. `model_search` (strategy "xgb") asks the cost model:
- with no trained model (a new task with nothing to transfer from) it proposes a spread-out design (the
  default config, then configs that try each knob's values about equally often, every code path covered)
  instead of plain random: what a model needs first is every value's effect, and maximin distance (the
  `distance` design) picks the space's corners, which are mostly slow (benchmarks/SEARCH_QUALITY.md);
- otherwise it scores every unmeasured config when the space is small enough to enumerate (all our spaces
  are: thousands to tens of thousands of configs, scored in tens of milliseconds), or runs simulated
  annealing on the scores (AutoTVM's SA optimiser) when it is not;
- with `rerank` (the program-feature model, which needs each candidate lowered) the cheap model shortlists
  `pool` times the batch and the program model picks from the shortlist;
- with `diversity` r > 1 (as AutoTVM's `diversity_filter_ratio`; 3 by default, 1 turns it off) the model's
  batch is taken from its r * n best in the model's order, skipping near-copies of configs already taken, not
  n variants of one guess. That matters most when the model was trained on other shapes: their optimum is
  near, not at, this one's (benchmarks/SEARCH_QUALITY.md);
- an `epsilon` share of every batch is random, so a wrong model cannot trap the search.
"""

from __future__ import annotations

import functools
import heapq
import inspect
import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from search_spaces import Config, Space
from search_spaces.space import SPREAD_CRITERIA

Scorer = Callable[[Sequence[Config]], np.ndarray]  # higher = predicted faster


def _random_unseen(space: Space, seen: set[Config], n: int, rng: random.Random) -> list[Config]:
    if n <= 0:  # nothing asked: never the enumeration below (a fused embedding space: ~20 s of combinations)
        return []
    out: list[Config] = []
    picked = set(seen)
    for _ in range(n * 50):
        if len(out) == n:
            return out
        cfg = space.sample(rng)
        if cfg not in picked:
            picked.add(cfg)
            out.append(cfg)
    # sampling keeps hitting seen configs: the space is nearly exhausted, so enumerate what is left
    rest = [c for c in space if c not in picked]
    rng.shuffle(rest)
    return out + rest[: n - len(out)]


def random_search(space: Space, seen: set[Config], n: int, rng: random.Random,
                  score: Scorer | None = None, elites: Sequence[Config] = (), *,
                  default_first: bool = False) -> list[Config]:
    """n distinct unmeasured configs, uniformly at random. With `default_first` the template's default config
    comes first while it is unmeasured, as in model_search's first batch: the baseline that isolates what the
    model adds where the default is near the best."""
    if not isinstance(default_first, bool):
        raise ValueError(f"default_first must be true or false, got {default_first!r}")
    first = [d for d in (space.default(),) if d not in seen][:n] if default_first else []
    return first + _random_unseen(space, seen | set(first), n - len(first), rng)


DESIGNS = SPREAD_CRITERIA  # what a first batch no model chose spreads over


def spread_design(space: Space, seen: set[Config], n: int, rng: random.Random,
                  criterion: str = "coverage") -> list[Config]:
    """n unmeasured configs spread over the space, the default first (what to measure knowing nothing)."""
    first = [c for c in (space.default(),) if c not in seen][:n]
    try:
        picks = [c for c in space.spread(n, rng, first=first, criterion=criterion) if c not in seen]
    except ValueError:  # fewer valid configs than n: what is left, at random
        picks = first
    return picks + _random_unseen(space, seen | set(picks), n - len(picks), rng)


def _top_unseen(cands: Sequence[Config], scores: np.ndarray, seen: set[Config], k: int) -> list[Config]:
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    out = []
    for i in order:
        if len(out) == k:
            break
        if cands[i] not in seen:
            out.append(cands[i])
    return out


def diverse_pick(ranked: Sequence[Config], n: int) -> list[Config]:
    """n of `ranked` (best first), in the model's order but skipping near-copies of configs already taken (those
    differing in fewer than a third of the knobs, at least 2): a batch that hedges where the model is unsure
    instead of n variants of one guess. Short of n, the best skipped ones fill up."""
    if not ranked:
        return []
    apart = max(2, len(ranked[0].items) // 3)
    out: list[Config] = []
    for cfg in ranked:
        if len(out) == n:
            return out
        if all(sum(a != b for a, b in zip(cfg.items, o.items)) >= apart for o in out):
            out.append(cfg)
    taken = set(out)
    return out + [c for c in ranked if c not in taken][: n - len(out)]


def annealing_search(space: Space, seen: set[Config], n: int, rng: random.Random,
                     score: Scorer | None = None, elites: Sequence[Config] = (),
                     epsilon: float = 0.1, population: int = 64, steps: int = 60,
                     temperature: tuple[float, float] = (1.0, 0.0)) -> list[Config]:
    """n distinct unmeasured configs: the cost model's best found by simulated annealing, plus random."""
    if score is None:
        return _random_unseen(space, seen, n, rng)
    n_random = _n_random(n, epsilon)
    chosen = _anneal(space, seen, n - n_random, rng, score, elites, population, steps, temperature)
    return chosen + _random_unseen(space, seen | set(chosen), n - len(chosen), rng)


def _n_random(n: int, epsilon: float) -> int:
    if not isinstance(epsilon, (int, float)) or not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be a number in [0, 1], got {epsilon!r}")
    return max(1, int(round(n * epsilon))) if n > 1 and epsilon > 0 else 0


def _anneal(space: Space, seen: set[Config], k: int, rng: random.Random, score: Scorer,
            elites: Sequence[Config], population: int, steps: int,
            temperature: tuple[float, float]) -> list[Config]:
    """The k best-scored unseen configs simulated annealing visits."""
    points = list(elites)[: population // 2]
    points += [space.sample(rng) for _ in range(population - len(points))]
    scores = score(points)
    best: list[tuple[float, int, Config]] = []  # min-heap of the k best unseen configs by score
    in_best: set[Config] = set()
    tiebreak = 0

    def offer(cfg: Config, s: float) -> None:
        nonlocal tiebreak
        if cfg in seen or cfg in in_best or k <= 0:
            return
        tiebreak += 1
        if len(best) < k:
            heapq.heappush(best, (s, tiebreak, cfg))
            in_best.add(cfg)
        elif s > best[0][0]:
            _, _, old = heapq.heapreplace(best, (s, tiebreak, cfg))
            in_best.discard(old)
            in_best.add(cfg)

    for cfg, s in zip(points, scores):
        offer(cfg, float(s))
    t0, t1 = temperature
    spread = float(np.std(scores)) or 1.0
    for step in range(steps):
        t = (t0 + (t1 - t0) * step / max(1, steps - 1)) * spread
        moved = [space.neighbour(p, rng) for p in points]
        new_scores = score(moved)
        for i, (cfg, s) in enumerate(zip(moved, new_scores)):
            offer(cfg, float(s))
            delta = float(s) - float(scores[i])
            if delta >= 0 or (t > 0 and rng.random() < math.exp(delta / t)):
                points[i], scores[i] = cfg, s
    return [cfg for _, _, cfg in sorted(best, reverse=True)]


def model_search(space: Space, seen: set[Config], n: int, rng: random.Random,
                 score: Scorer | None = None, elites: Sequence[Config] = (), *,
                 candidates: Sequence[Config] | None = None, rerank: Scorer | None = None,
                 epsilon: float = 0.1, pool: int = 4, diversity: float = 3.0, design: str = "coverage",
                 population: int = 64, steps: int = 60,
                 temperature: tuple[float, float] = (1.0, 0.0)) -> list[Config]:
    """n distinct unmeasured configs chosen by the cost model (see the module doc).

    `candidates`: the whole space, enumerated once by the caller, to score exhaustively (else annealing);
    `rerank`: a second scorer for the shortlist of `pool * n` the first one picks."""
    if design not in DESIGNS:
        raise ValueError(f"design must be one of {', '.join(DESIGNS)}, got {design!r}")
    if not isinstance(pool, int) or pool < 1:
        raise ValueError(f"pool must be a whole number >= 1, got {pool!r}")
    if not isinstance(diversity, (int, float)) or diversity < 1:
        raise ValueError(f"diversity must be a number >= 1, got {diversity!r}")
    n_model = n - _n_random(n, epsilon)
    if score is None:
        return spread_design(space, seen, n, rng, design)
    n_ranked = max(n_model, int(round(n_model * diversity)))
    k = n_ranked * (pool if rerank is not None else 1)
    if candidates is not None:
        unseen = [c for c in candidates if c not in seen]
        shortlist = _top_unseen(unseen, score(unseen), seen, k) if unseen else []
    else:
        shortlist = _anneal(space, seen, k, rng, score, elites, population, steps, temperature)
    ranked = _top_unseen(shortlist, rerank(shortlist), seen, n_ranked) if rerank is not None and shortlist \
        else shortlist[:n_ranked]
    chosen = diverse_pick(ranked, n_model) if n_ranked > n_model else ranked
    return chosen + _random_unseen(space, seen | set(chosen), n - len(chosen), rng)


@dataclass(frozen=True)
class Strategy:
    """A search strategy, declared once: `tune`, the CLI and the benchmarks read its name, one-line doc,
    default batch, whether it needs a cost model and its options from here. An option's default is the
    keyword default of `propose` (one home, so calling the function directly agrees)."""

    name: str
    propose: Callable[..., list[Config]]
    doc: str
    default_batch: int = 16
    needs_model: bool = False
    options: Mapping[str, str] = field(default_factory=dict)  # option name -> what it does

    def __post_init__(self) -> None:
        params = inspect.signature(self.propose).parameters
        missing = [o for o in self.options if o not in params or params[o].default is inspect.Parameter.empty]
        if missing:
            raise TypeError(f"strategy {self.name}: options {missing} are not keyword arguments with a default "
                            f"of {self.propose.__name__}")
        if not isinstance(self.default_batch, int) or self.default_batch < 1:
            raise ValueError(f"strategy {self.name}: default_batch must be a whole number >= 1")

    def __call__(self, *args: Any, **kwargs: Any) -> list[Config]:
        return self.propose(*args, **kwargs)

    @property
    def defaults(self) -> dict[str, Any]:
        """Each option's default value."""
        params = inspect.signature(self.propose).parameters
        return {o: params[o].default for o in self.options}

    def describe(self, options: bool = True) -> str:
        """One line for --help: the doc, the default batch and (with `options`) the options' defaults."""
        opts = ", ".join(f"{o}={v!r}" for o, v in self.defaults.items()) if options else ""
        return f"{self.name}: {self.doc} (batch {self.default_batch}{'; options ' + opts if opts else ''})"

    def check_options(self, options: Mapping[str, Any]) -> None:
        """Raise ValueError naming the declared options if `options` has one that is not (a typo is an error)."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise ValueError(f"strategy options {unknown} are not options of {self.propose.__name__}; "
                             f"{self.name}'s options: {', '.join(self.options) or 'none'}")

    def bind(self, options: Mapping[str, Any]) -> Callable[..., list[Config]]:
        """`propose` with `options` bound, after checking they are declared."""
        self.check_options(options)
        return functools.partial(self.propose, **options) if options else self.propose


_SEARCH_OPTIONS = {
    "epsilon": "share of each batch proposed at random (0 to 1)",
    "population": "annealing: points walked at once",
    "steps": "annealing: steps per proposal",
    "temperature": "annealing: (start, end) temperature, in units of the scores' spread",
}

# xgb refits its model every 4 trials: early on each measurement moves it most, and a refit plus scoring the
# whole space takes a fraction of a second against a second or more per measured trial (benchmarks/SEARCH_QUALITY.md)
STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("xgb", model_search, "the cost model scores the whole space", default_batch=4, needs_model=True,
             options={"epsilon": _SEARCH_OPTIONS["epsilon"],
                      "pool": "with program features: the knob model shortlists pool * batch for the program model",
                      "diversity": "the batch is picked from the model's diversity * batch best, skipping "
                                   "near-copies (1: off)",
                      "design": "what the first, model-less batch spreads over: " + ", ".join(DESIGNS),
                      **{k: v for k, v in _SEARCH_OPTIONS.items() if k != "epsilon"}}),
    Strategy("annealing", annealing_search, "the cost model guides simulated annealing", default_batch=16,
             needs_model=True, options=dict(_SEARCH_OPTIONS)),
    Strategy("random", random_search, "uniformly at random, no model", default_batch=16,
             options={"default_first": "the template's default config first"}),
)}
"""The strategies by name; register one by adding a `Strategy` here."""
