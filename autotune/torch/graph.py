"""A model's captured graph, and the engine that rewrites it with the operators' graph rules.

`capture` runs torch.export (ATen ops, parameters as get_attr nodes sharing the model's tensors, the batch and
the number of indices dynamic), so a rule sees every embedding bag, interaction and Linear of the model whatever
Python wrote it, and the rewritten GraphModule runs at any batch size, under torch.compile(fullgraph=True) and
inference_mode. The operators' rules (`GraphRule`, search_spaces/<op>/graph.py) find sites by structure; the
engine checks every replacement by numbers before it keeps it:

    discover: each rule's `find` on the captured graph -> the matches (and the tasks their kernels need) and
              the look-alikes refused by structure (`Kept`), before anything is tuned;
    rewrite:  per rule, in their order (rules.py), on the graph as earlier rules left it: find again, `replace` each
              match (new nodes inserted, not wired), run the graph once on the example inputs computing old and
              new values together, rewire the outputs of the matches whose new values agree within their
              tolerance (and, with `speed`, whose new nodes run faster than the old ones: `speed.py`), erase
              the others' new nodes, drop dead code.

Both take `floors`: node name -> the coarsest precision (template.PRECISIONS) that node may run in, which
tune_model's accuracy contract raises for the layers that break its tolerance; a quantizing rule of a coarser
precision leaves such a node alone (at "fp32", every quantizing rule does); the other rules may still take it.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from search_spaces.template import PRECISIONS, GraphMatch, GraphRule, Kept, Reduced

from . import speed as _speed
from .capture import CaptureError, capture, flat_inputs, module_path, simplify
from .speed import SpeedCheck

__all__ = ["CaptureError", "Discovery", "Replaced", "Rewrite", "SpeedCheck", "capture", "discover",
           "example_values", "flat_inputs", "module_path", "rewrite"]


# ---- example values -----------------------------------------------------------------------------------------
class _Failed:
    """The value of a node that raised (or whose input did) in a check run."""

    def __init__(self, why: str):
        self.why = why


def example_values(gm: fx.GraphModule, example_inputs: Any) -> dict[str, Any]:
    """{node name: its value} on the example inputs (every node, kept: the rules read shapes and constants)."""
    interp = fx.Interpreter(gm, garbage_collect_values=False)
    with torch.no_grad():
        interp.run(*flat_inputs(gm, example_inputs))
    return {n.name: v for n, v in interp.env.items()}


class _CheckRun(fx.Interpreter):
    """One run computing the model's values and the pending replacements' together: a new node that raises (or
    would run PyTorch's implementation instead of a kernel) marks its match refused, not the run."""

    def __init__(self, gm: fx.GraphModule, new_nodes: set[fx.Node]):
        super().__init__(gm, garbage_collect_values=False)
        self.new_nodes = new_nodes

    def run_node(self, n: fx.Node) -> Any:
        if n not in self.new_nodes:
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        failed = next((v for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, _Failed)), None)
        if failed is not None:
            return failed
        why = _no_kernel(n, args, kwargs)
        if why:
            return _Failed(why)
        try:
            return getattr(self, n.op)(n.target, args, kwargs)
        except Exception as err:  # noqa: BLE001 -- the replacement's failure refuses it
            return _Failed(f"the replacement raised {type(err).__name__}: {err}")


def _no_kernel(n: fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """Why a `torch.ops.autotune.<op>` call on these values would run PyTorch's implementation ("" if a loaded
    kernel serves it): a replacement that only falls back is no gain, and it is refused."""
    from .ops import BINDINGS
    from .registry import REGISTRY, device_key

    qualified = getattr(n.target, "_qualified_op_name", None) or getattr(n.target, "_name", "")
    namespace, _, name = str(qualified).partition("::")
    if n.op != "call_function" or namespace != "autotune":
        return ""
    binding = BINDINGS.get(name)
    if binding is None:
        return ""
    try:
        bound = inspect.signature(binding.op).bind(*args, **kwargs)
    except TypeError as err:
        return f"torch.ops.autotune.{name} called with arguments it does not take: {err}"
    bound.apply_defaults()
    call = tuple(bound.arguments.values())
    route = binding.route(*call)
    if isinstance(route, str):
        return f"torch.ops.autotune.{name} would run PyTorch's implementation: {route}"
    if route.size < 1:
        return ""
    tensor = next((v for v in pytree.tree_leaves(call) if isinstance(v, torch.Tensor)), None)
    dev = device_key(tensor.device) if tensor is not None else "cpu"
    if REGISTRY.plan(name, dev, route.signature, route.size) is None:
        return f"no loaded {name} kernel for {binding.describe(route.signature)} on {dev}"
    return ""


def _check_run(gm: fx.GraphModule, example_inputs: Any, new_nodes: set[fx.Node]) -> dict[fx.Node, Any]:
    interp = _CheckRun(gm, new_nodes)
    with torch.no_grad(), warnings.catch_warnings():
        from .ops import NoTunedKernelWarning

        warnings.simplefilter("ignore", NoTunedKernelWarning)  # _no_kernel refused those calls already
        interp.run(*flat_inputs(gm, example_inputs))
    return dict(interp.env)


def _disagreement(old: Any, new: Any, tolerance: tuple[float, float]) -> tuple[str, float]:
    """(why the new value does not reproduce the old one, or "", max |new - old|)."""
    if isinstance(new, _Failed):
        return new.why, float("nan")
    if isinstance(old, torch.Tensor) != isinstance(new, torch.Tensor):
        return f"the replacement gives {type(new).__name__} where the model has {type(old).__name__}", float("nan")
    if not isinstance(old, torch.Tensor):
        return ("" if old == new else f"the replacement gives {new!r} where the model has {old!r}"), 0.0
    if old.shape != new.shape or old.dtype != new.dtype:
        return (f"the replacement gives {new.dtype}{list(new.shape)} where the model has "
                f"{old.dtype}{list(old.shape)}"), float("nan")
    if old.numel() == 0:
        return "", 0.0
    err = float((new.double() - old.double()).abs().nan_to_num(float("inf")).max()) if old.is_floating_point() \
        else float((new.long() - old.long()).abs().max())
    rtol, atol = tolerance
    if not torch.allclose(new, old, rtol=rtol, atol=atol, equal_nan=True):
        return (f"the replacement disagrees on the example inputs: max |new - old| = {err:.3g} (tolerance "
                f"rtol={rtol:g}, atol={atol:g})"), err
    return "", err


# ---- rules --------------------------------------------------------------------------------------------------
def _find(rule: GraphRule, gm: fx.GraphModule, values: dict[str, Any], claimed: set[fx.Node],
          floors: Mapping[str, str] = {}) -> Iterable[GraphMatch | Kept]:
    """The rule's finds; each match's nodes join `claimed` as it comes, and a match overlapping an earlier one is
    refused (a rule's bug must not rewrite a node twice). A quantizing rule also sees the nodes whose floor is
    finer than its precision as claimed, and so leaves them alone."""
    blocked = {n for n in gm.graph.nodes if _below(rule, floors.get(n.name))} if rule.quantizes else set()
    seen = claimed | blocked  # what the rule may not take
    for found in rule.find(gm, values, seen):
        if isinstance(found, GraphMatch):
            if seen.intersection(found.nodes):
                yield Kept(found.rule or rule.name, found.where, "overlaps nodes an earlier match took")
                continue
            seen.update(found.nodes)
            claimed.update(found.nodes)
        yield found


def _below(rule: GraphRule, floor: str | None) -> bool:
    """Whether `rule`'s precision is coarser than a node's floor (None: no floor)."""
    return floor is not None and PRECISIONS.index(rule.precision) < PRECISIONS.index(floor)


@dataclass
class Discovery:
    """What the rules find on the captured graph before anything is tuned."""

    matches: list[GraphMatch] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    alternatives: list[GraphMatch] = field(default_factory=list)  # what the other rules find where a fusing
    #   rule's matches (GraphRule.fuses) took nodes: their kernels are tuned too, to be compared with it


def discover(gm: fx.GraphModule, example_inputs: Any, rules: Sequence[GraphRule],
             floors: Mapping[str, str] = {}) -> Discovery:
    """Every rule's matches on the captured graph (each node claimed by one match at most) and its refusals,
    and the alternatives to the fusing rules' matches; the quantizing rules leave alone the nodes whose floor is
    finer than their precision."""
    values = example_values(gm, example_inputs)
    out = Discovery()
    claimed: set[fx.Node] = set()
    for rule in rules:
        for found in _find(rule, gm, values, claimed, floors):
            (out.matches if isinstance(found, GraphMatch) else out.kept).append(found)
    out.alternatives = _alternatives(gm, values, rules, out.matches, floors)
    return out


def _alternatives(gm: fx.GraphModule, values: dict[str, Any], rules: Sequence[GraphRule],
                  matches: Sequence[GraphMatch], floors: Mapping[str, str]) -> list[GraphMatch]:
    """What the other rules find where the fusing rules' matches took nodes, the rules run again without the
    fusing rules (e.g. the batched bags, fp32 or int8, and the interaction where the fused kernel took them)."""
    fusing = {r.name for r in rules if r.fuses}
    taken = {n for m in matches if m.rule in fusing for n in m.nodes}
    if not taken:
        return []
    out: list[GraphMatch] = []
    claimed: set[fx.Node] = set()
    for rule in rules:
        if rule.name in fusing:
            continue
        for found in _find(rule, gm, values, claimed, floors):
            if isinstance(found, GraphMatch) and taken.intersection(found.nodes):
                out.append(found)
    return out


@dataclass(frozen=True)
class Replaced:
    """A match whose replacement reproduced the model's values (and, when timed, ran faster) and was wired in."""

    rule: str
    what: str
    where: str
    max_error: float
    old_s: float | None = None  # the replaced code's and the replacement's seconds on the example inputs,
    new_s: float | None = None  # when the rewrite timed them (`speed`)
    reduced: tuple[Reduced, ...] = ()  # its layers in reduced precision (GraphMatch.reduced)


@dataclass
class Rewrite:
    replaced: list[Replaced] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)


def rewrite(gm: fx.GraphModule, example_inputs: Any, rules: Sequence[GraphRule],
            ready: Callable[[GraphMatch], str | None] = lambda m: None,
            speed: SpeedCheck | None = None, unchecked: frozenset[str] = frozenset(),
            floors: Mapping[str, str] = {}, timing_inputs: Sequence[Any] = (),
            timings: _speed.Timings | None = None) -> Rewrite:
    """Rewrite `gm` in place, rule by rule (see the module docstring); `ready(match)` says why a match must be
    kept before it is tried (e.g. its kernel was not tuned), or None. With `speed`, a replacement that agrees
    is also timed against the code it replaces and kept out unless it is faster by `speed.margin`, except
    those of the rules named in `unchecked` (tune_model's whole-model check wires them in to time the model);
    each side's calls cycle through its values on the example inputs and on each batch of `timing_inputs`
    (fresh batches: rows a repeated batch would keep in cache are not all there, as in a model). The quantizing
    rules leave alone the nodes whose floor is finer than their precision. `timings`: the replacements timed by
    earlier rewrites of the same model (`speed.Timings`), not timed again."""
    out = Rewrite()
    claimed: set[fx.Node] = set()  # nodes of committed matches
    values: dict[str, Any] | None = None  # the graph's example values, run again only after a rule changed it
    for rule in rules:
        if values is None:
            values = example_values(gm, example_inputs)
        if _rewrite_rule(gm, example_inputs, values, rule, ready, claimed, out,
                         None if rule.name in unchecked else speed, floors, timing_inputs, timings):
            values = None
    return out


@dataclass
class _Pending:
    match: GraphMatch
    new: tuple[fx.Node, ...]
    added: list[fx.Node]


def _rewrite_rule(gm: fx.GraphModule, example_inputs: Any, values: dict[str, Any], rule: GraphRule,
                  ready: Callable[[GraphMatch], str | None], claimed: set[fx.Node], out: Rewrite,
                  speed: SpeedCheck | None, floors: Mapping[str, str], timing_inputs: Sequence[Any],
                  timings: _speed.Timings | None) -> bool:
    """One rule's pass over `gm` (`values`: its example values now); whether it replaced anything (else the
    graph computes what it did, and its values stand for the next rule)."""
    attrs, replaced_before = _attr_names(gm), len(out.replaced)
    pending: list[_Pending] = []
    for found in _find(rule, gm, values, set(claimed), floors):
        if isinstance(found, Kept):
            out.kept.append(found)
            continue
        why = ready(found)
        if why:
            out.kept.append(Kept(found.rule, found.where, why))
            continue
        p = _replace(gm, found)
        if isinstance(p, str):
            out.kept.append(Kept(found.rule, found.where, p))
        else:
            pending.append(p)
    if not pending:
        return False
    added = {n for p in pending for n in p.added}
    env = _check_run(gm, example_inputs, added)
    verdicts = {id(p): _agrees(p, env) for p in pending}
    timed = _timed(gm, [p for p in pending if not verdicts[id(p)][0]], env, added, timing_inputs, timings) \
        if speed is not None else {}
    for p in pending:
        why, err = verdicts[id(p)]
        times: tuple[float, float] | tuple[None, None] = (None, None)
        slower = False
        if not why and speed is not None:
            why, times = _pays(timed[id(p)], speed, timings)
            slower = times[0] is not None and bool(why)
        if why:
            out.kept.append(Kept(p.match.rule, p.match.where, why, slower))
            _erase(gm, p.added)
        else:
            _commit(p)
            claimed.update(p.match.nodes)
            out.replaced.append(Replaced(p.match.rule, p.match.what, p.match.where, err, *times, p.match.reduced))
    gm.graph.eliminate_dead_code(is_impure_node=_impure)
    _drop_unused_attrs(gm, attrs)
    changed = len(out.replaced) > replaced_before
    if changed:
        simplify(gm)  # what a rewrite left to look through (the batched launch's per-table views re-joined)
    gm.graph.lint()
    gm.recompile()
    return changed


def _agrees(p: _Pending, env: dict[fx.Node, Any]) -> tuple[str, float]:
    """(why the match's new values do not reproduce its old ones, or "", max |new - old|) on the check run."""
    why, err = "", 0.0
    for old, new in zip(p.match.outputs, p.new):
        why, e = _disagreement(env[old], env.get(new, _Failed("the new node did not run")), p.match.tolerance)
        err = max(err, e) if e == e else err
        if why:
            break
    return why, err


@dataclass
class _Pair:
    """A match's old and new code as subgraphs, and its key in the call's `Timings` (None: no Timings kept)."""

    old: _speed.Subgraph
    new: _speed.Subgraph
    key: Any = None


def _timed(gm: fx.GraphModule, pending: list[_Pending], env: dict[fx.Node, Any], added: set[fx.Node],
           timing_inputs: Sequence[Any], timings: _speed.Timings | None) -> dict[int, _Pair | str]:
    """Per match, its old and new code as subgraphs on the check run's values, each cycling through its inputs'
    values on every batch of `timing_inputs` too unless `timings` has them timed already (or why they cannot be
    built)."""
    out: dict[int, _Pair | str] = {}
    for p in pending:
        try:
            pair = _Pair(_speed.subgraph(gm, p.match.nodes, p.match.outputs, env),
                         _speed.subgraph(gm, p.added, p.new, env))
            if timings is not None:
                pair.key = timings.key(p.match, pair.old, pair.new)
            out[id(p)] = pair
        except Exception as err:  # noqa: BLE001 -- a replacement that cannot be timed is not shown to pay
            out[id(p)] = f"timing the replacement raised {type(err).__name__}: {err}"
    pairs = [sub for v in out.values() if isinstance(v, _Pair) and (timings is None or timings.get(v.key) is None)
             for sub in (v.old, v.new)]
    if pairs and timing_inputs:
        needed = {n for sub in pairs for n in sub.inputs}
        computed = {n for n in added if n.op not in _speed.INPUTS}  # a new get_attr (a packed weight) is an input
        batches = [_values_of(gm, batch, needed, computed) for batch in timing_inputs]
        for sub in pairs:
            sub.cycle_through(batches)
    return out


class _ModelOnly(fx.Interpreter):
    """The graph's own nodes on some inputs, skipping pending replacements' computing nodes (not wired)."""

    def __init__(self, gm: fx.GraphModule, skip: set[fx.Node]):
        super().__init__(gm, garbage_collect_values=False)
        self.skip = skip

    def run_node(self, n: fx.Node) -> Any:
        return None if n in self.skip else super().run_node(n)


def _values_of(gm: fx.GraphModule, inputs: Any, needed: set[fx.Node], skip: set[fx.Node]) -> dict[fx.Node, Any]:
    """The values of the `needed` nodes on `inputs` (one batch), the rest dropped as soon as the run ends."""
    interp = _ModelOnly(gm, skip)
    with torch.no_grad():
        interp.run(*flat_inputs(gm, inputs))
    return {n: interp.env[n] for n in needed}


def _pays(pair: _Pair | str, check: SpeedCheck, timings: _speed.Timings | None
          ) -> tuple[str, tuple[float, float] | tuple[None, None]]:
    """(why the replacement does not pay, or "", (old, new) seconds): the match's whole group of old nodes
    against all its new ones (`_timed`), in inference mode as the rewritten model serves; once per call where
    `timings` keeps them."""
    if isinstance(pair, str):
        return pair, (None, None)
    known = timings.get(pair.key) if timings is not None else None
    if known is not None:
        old_s, new_s = known
    else:
        try:
            with torch.inference_mode():
                old_s, new_s = _speed.time_pair(pair.old, pair.new, check)
        except Exception as err:  # noqa: BLE001 -- a replacement that cannot be timed is not shown to pay
            return f"timing the replacement raised {type(err).__name__}: {err}", (None, None)
        if timings is not None:
            timings.put(pair.key, (old_s, new_s))
    return _speed.slower(old_s, new_s, check), (old_s, new_s)


def _replace(gm: fx.GraphModule, match: GraphMatch) -> _Pending | str:
    """The match's new nodes inserted (not wired), or why not (they are erased again)."""
    before = set(gm.graph.nodes)
    try:
        new = tuple(match.replace(gm))
    except Exception as err:  # noqa: BLE001 -- a rule's failure keeps the model's code
        _erase(gm, [n for n in gm.graph.nodes if n not in before])
        return f"the replacement could not be built: {type(err).__name__}: {err}"
    added = [n for n in gm.graph.nodes if n not in before]
    if len(new) != len(match.outputs) or not all(isinstance(n, fx.Node) for n in new):
        _erase(gm, added)
        return f"the rule gave {len(new)} new nodes for {len(match.outputs)} outputs"
    return _Pending(match, new, added)


def _commit(p: _Pending) -> None:
    """Rewire the old outputs' users to the new nodes; new nodes without a module path take the match's."""
    added = set(p.added)
    stack = _common_stack(p.match.nodes)
    for n in p.added:
        if not n.meta.get("nn_module_stack"):
            n.meta["nn_module_stack"] = dict(stack)
    for old, new in zip(p.match.outputs, p.new):
        old.replace_all_uses_with(new, delete_user_cb=lambda user: user not in added)


def _common_stack(nodes: Iterable[fx.Node]) -> dict[str, Any]:
    """An nn_module_stack naming the deepest module path the nodes share (for profiles of the rewritten model)."""
    paths = [module_path(n).split(".") for n in nodes if module_path(n)]
    if not paths:
        return {}
    common: list[str] = []
    for parts in zip(*paths):
        if len(set(parts)) > 1:
            break
        common.append(parts[0])
    return {".".join(common): (".".join(common), "autotune")} if common else {}


def _erase(gm: fx.GraphModule, added: list[fx.Node]) -> None:
    for n in reversed(added):
        if not n.users:
            gm.graph.erase_node(n)


def _impure(node: fx.Node) -> bool:
    """What dead-code elimination must keep: export's `_guards_fn` (a call_module without users), any other
    module call, and whatever fx calls impure (mutating ops, placeholders, the output)."""
    return node.op == "call_module" or node.is_impure()


def _attr_names(gm: fx.GraphModule) -> set[str]:
    return set(gm._buffers) | set(gm._parameters) | set(gm._modules) | set(vars(gm))


def _drop_unused_attrs(gm: fx.GraphModule, before: set[str]) -> None:
    """Attributes a refused replacement registered (e.g. a fused table) go again once nothing reads them."""
    used = {str(n.target).split(".")[0] for n in gm.graph.nodes if n.op in ("get_attr", "call_module")}
    for name in _attr_names(gm) - before - used:
        if name in gm._buffers or name in gm._parameters or isinstance(getattr(gm, name, None), torch.Tensor):
            delattr(gm, name)
