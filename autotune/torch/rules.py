"""The graph rules `tune_model` runs, in one order, each `fuses` name checked.

Every operator declares its rules in its own package (`search_spaces/<op>/graph.py`, `graph_rules()`); oneDNN's
float32 Linear rules live in `dense.py`. Where they run relative to each other is one decision, made here: a
rule sees the graph as the rules before it left it, so fusions come before the rules they fuse (they take the
bags and the interaction together), a quantizing rule before its full-precision twin (it takes the layers its
precision may hold, the twin the rest), and the general Linear rules last.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import search_spaces
from search_spaces.template import GraphRule

from . import dense

__all__ = ["ORDER", "RuleError", "builtin_rules", "collect_rules"]

ORDER: tuple[str, ...] = (
    # the embedding bags and the interaction they feed as one kernel: int8 rows, the fp16 rung, fp32
    "embedding_interaction_int8", "embedding_interaction_fp16", "embedding_interaction",
    # a group of bags as one table-batched launch (int8 rows first), then the bags left alone
    "batched_embedding_bag_int8", "batched_embedding_bag", "embedding_bag",
    "interaction",
    # Linear layers: int8, then the bf16 rung and its chains, then float32 at float32 accuracy (AMX tiles,
    # judged against oneDNN's layers, which it fuses) and oneDNN's packed float32 GEMM for the rest
    "qmatmul", dense.RULE_BF16, dense.RULE_CHAIN, "split_linear", dense.RULE,
)


class RuleError(ValueError):
    """A rule set that cannot run: a rule without a place in ORDER, a name given twice, an unknown `fuses`."""


def builtin_rules() -> list[GraphRule]:
    """Every template's graph rules (templates without `graph_rules` have none) and oneDNN's, in ORDER."""
    found: list[GraphRule] = [*dense.RULES]
    for name in search_spaces.names():
        fn = getattr(search_spaces.get(name), "graph_rules", None)
        if fn is not None:
            found.extend(fn())
    unplaced = sorted(r.name for r in found if r.name not in ORDER)
    if unplaced:
        raise RuleError(f"graph rule(s) {', '.join(unplaced)} have no place in autotune.torch.rules.ORDER: "
                        "add each where it must run")
    return sorted(found, key=lambda r: ORDER.index(r.name))


def collect_rules(quantize: bool = True, extra: Iterable[GraphRule] = (),
                  rules: Iterable[GraphRule] | None = None) -> list[GraphRule]:
    """The rules a tune_model call runs, in order: the built-in ones (`rules`, in the order given, replaces
    them) then `extra`; those that change numerics (`quantizes`) only with `quantize`. Refuses a name given
    twice and a `fuses` naming no rule of the set (RuleError)."""
    chosen = [*(builtin_rules() if rules is None else rules), *extra]
    _check(chosen)
    return [r for r in chosen if quantize or not r.quantizes]


def _check(rules: Sequence[GraphRule]) -> None:
    names = [r.name for r in rules]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise RuleError(f"graph rule name(s) given twice: {', '.join(twice)}")
    for r in rules:
        unknown = [f for f in r.fuses if f not in names]
        if unknown:
            raise RuleError(f"graph rule {r.name!r} fuses {', '.join(map(repr, unknown))}, which no rule of this "
                            f"set is named; known: {', '.join(names)}")
        if r.name in r.fuses:
            raise RuleError(f"graph rule {r.name!r} names itself among the rules it fuses")
