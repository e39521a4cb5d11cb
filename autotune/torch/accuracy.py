"""tune_model's accuracy contract: the error allowed on a model's outputs, and which int8 layers stay fp32 to hold it.

A `Tolerance` bounds each output tensor of the rewritten model against the eager model on the same batch:
|optimized - eager| <= max(atol, rtol * max|eager|). It is checked on the example inputs and on held-out
batches (the caller's `check_inputs`, else one drawn like the example: `draw_like`). Int8 error scales with
the range of the values quantized (per-row and per-channel scales), so the bound scales with the output's
range; `atol` is its floor, the absolute error allowed where outputs are small. Defaults:
  - fp32 (`quantize=False`): `FP32_EXACT`, max(1e-4, 1e-4 x max|eager|): the kernels and oneDNN sum in
    another order than PyTorch, nothing more;
  - int8 (`quantize=True`): `INT8`, max(1e-2, 1e-2 x max|eager|): 1e-2 absolute on probabilities (outputs
    within [-1, 1]), 1% of the output's range on logits or scores (a logit error of d moves a probability by
    at most d / 4, so probabilities computed from those logits stay within 1e-2 while the logits stay within 4).

Each layer a quantizing rule runs in reduced precision (`search_spaces.template.Reduced`) carries an eager
simulation of its numerics. `layer_shares` measures each layer's share of the error: the model's output error,
on the check batches, with that layer alone simulated. `plan` then keeps layers in fp32 one at a time
(`next_to_fall_back`: the cheapest layer whose share covers the excess, else the largest share) until the
simulated model holds the tolerance; tune_model confirms that on the rewritten model with its real kernels and
moves more layers to a finer precision, chosen the same way from the measured error, while it breaks it.
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from search_spaces.template import PRECISIONS, Reduced

from .capture import as_args, flat_inputs
from .draw import draw_like

__all__ = ["Batch", "BatchError", "FP32_EXACT", "INT8", "LayerPrecision", "Tolerance", "AccuracyReport",
           "check", "check_batches", "default_tolerance", "draw_like", "layer_costs", "layer_shares",
           "next_to_fall_back", "plan", "timing_batches"]


@dataclass(frozen=True)
class Tolerance:
    """The error allowed on each output tensor: |optimized - eager| <= max(atol, rtol * max|eager|), max|eager|
    over that tensor on the same batch. `math.inf` allows anything (no contract)."""

    atol: float = 0.0
    rtol: float = 0.0

    def __post_init__(self) -> None:
        for name in ("atol", "rtol"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or math.isnan(v) or v < 0:
                raise ValueError(f"Tolerance.{name} must be a number >= 0 (math.inf: no bound), got {v!r}")

    def allowed(self, eager: torch.Tensor) -> float:
        """The error allowed on this output tensor (its eager values)."""
        scale = float(eager.detach().abs().max()) if eager.numel() and eager.is_floating_point() else 0.0
        return max(self.atol, self.rtol * scale)

    def __str__(self) -> str:
        if not self.rtol:
            return f"{self.atol:g}"
        if not self.atol:
            return f"{self.rtol:g} x max|eager|"
        return f"max({self.atol:g}, {self.rtol:g} x max|eager|)"


FP32_EXACT = Tolerance(atol=1e-4, rtol=1e-4)
INT8 = Tolerance(atol=1e-2, rtol=1e-2)


def default_tolerance(tolerance: Tolerance | float | None, quantize: bool) -> Tolerance:
    """`tune_model(tolerance=)` as a Tolerance: None -> the default for `quantize`; a number -> that absolute
    error (atol); a Tolerance as it is. Anything else raises ValueError saying what it takes."""
    if tolerance is None:
        return INT8 if quantize else FP32_EXACT
    if isinstance(tolerance, Tolerance):
        return tolerance
    if isinstance(tolerance, numbers.Real) and not isinstance(tolerance, bool):
        return Tolerance(atol=float(tolerance))  # validated there
    raise ValueError(f"tune_model: tolerance must be a number (the absolute error allowed on the outputs), an "
                     f"autotune.torch.Tolerance(atol=, rtol=) or None (the default), got {tolerance!r}")


# ---- batches ------------------------------------------------------------------------------------------------
@dataclass
class Batch:
    """Inputs the contract is checked on, and the eager model's outputs on them."""

    name: str  # "example", "check_inputs[0]", "held-out (drawn like the example)"
    args: tuple[Any, ...]
    eager: Any


def _eager(model: torch.nn.Module, args: tuple[Any, ...]) -> Any:
    with torch.inference_mode():
        return model(*args)


def check_batches(model: torch.nn.Module, args: tuple[Any, ...], check_inputs: Sequence[Any] | None,
                  seed: int = 1) -> list[Batch]:
    """The example and the held-out (validation) batches, with the eager outputs: the caller's `check_inputs` (a
    list of batches, each given as the example inputs are), else one drawn like the example (`draw_like`; none,
    with a warning, when the model rejects every draw)."""
    batches = [Batch("example", args, _eager(model, args))]
    if check_inputs is not None:
        return batches + given_batches(model, check_inputs, "check_inputs")
    drawn = _drawn(model, args, seed)
    if drawn is None:
        warnings.warn("tune_model: the model rejected every batch drawn like the example inputs, so the accuracy "
                      "contract is checked on the example inputs only; pass check_inputs=[...] to check it on "
                      "held-out batches", stacklevel=3)
    else:
        batches.append(Batch("held-out (drawn like the example)", drawn[0], drawn[1]))
    return batches


def given_batches(model: torch.nn.Module, inputs: Sequence[Any], name: str) -> list[Batch]:
    """The caller's batches (`name`: the argument they came as), each with the eager outputs; a clear error for a
    value that is no list of batches, or a batch the model rejects."""
    if not isinstance(inputs, (list, tuple)):
        raise ValueError(f"tune_model: {name} must be a list of batches, each given as example_inputs is, got "
                         f"{type(inputs).__name__}")
    out = []
    for i, given in enumerate(inputs):
        batch = as_args(given)
        try:
            out.append(Batch(f"{name}[{i}]", batch, _eager(model, batch)))
        except Exception as err:  # noqa: BLE001 -- say which batch, keep the model's error
            raise ValueError(f"tune_model: the model raised {type(err).__name__} on {name}[{i}] ({err}); {name} is "
                             "a list of batches, each given as example_inputs is") from err
    return out


def test_batches(model: torch.nn.Module, args: tuple[Any, ...], test_inputs: Sequence[Any] | None,
                 seed: int = 500) -> list[Batch]:
    """Batches no decision sees, to report the rewritten model's error on: the caller's `test_inputs` (as
    `check_inputs` takes them), else one drawn like the example with another seed than the validation draw's
    (none, silently, where the model rejects every draw: the validation warning says so already)."""
    if test_inputs is not None:
        return given_batches(model, test_inputs, "test_inputs")
    drawn = _drawn(model, args, seed)
    return [] if drawn is None else [Batch("test (drawn like the example)", drawn[0], drawn[1])]


def timing_batches(model: torch.nn.Module, checks: Sequence[Batch], count: int, seed: int = 1000) \
        -> list[tuple[Any, ...]]:
    """`count` batches to time a model on, cycled: the check batches (the example first), then batches drawn
    like the example (fresh rows: `draw_like`) until there are `count`."""
    out = [b.args for b in checks][:count]
    while len(out) < count:
        drawn = _drawn(model, checks[0].args, seed + len(out))
        if drawn is None:
            break  # the model rejects drawn batches: time the ones there are
        out.append(drawn[0])
    return out


def _drawn(model: torch.nn.Module, args: tuple[Any, ...], seed: int) -> tuple[tuple[Any, ...], Any] | None:
    """(a batch drawn like `args`, the eager outputs on it): fresh rows first, else a reshuffle; None if the
    model rejects both (e.g. integer inputs whose sums must match other inputs' lengths)."""
    for fresh in (True, False):
        batch = draw_like(args, seed, fresh)
        try:
            return batch, _eager(model, batch)
        except Exception:  # noqa: BLE001 -- the model's inputs have constraints a draw cannot know
            continue
    return None


# ---- errors -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BatchError:
    """The rewritten model's output error on one check batch, and what the tolerance allowed there."""

    batch: str
    error: float  # max |optimized - eager| over the output tensors
    allowed: float  # the bound of the output tensor that came closest to its own
    ratio: float  # the worst output's error / its bound (<= 1: within the tolerance)

    @property
    def holds(self) -> bool:
        return self.ratio <= 1.0

    def __str__(self) -> str:
        return f"{self.batch}: max |optimized - eager| {self.error:.2g} (allowed {self.allowed:.2g})"


def output_error(batch: str, out: Any, eager: Any, tolerance: Tolerance) -> BatchError:
    """`out` against `eager` (the same structure of outputs) under `tolerance`."""
    a, b = pytree.tree_leaves(eager), pytree.tree_leaves(out)
    if len(a) != len(b):
        return BatchError(batch, math.inf, 0.0, math.inf)
    worst = BatchError(batch, 0.0, 0.0, 0.0)
    error = 0.0
    for ref, got in zip(a, b):
        if not isinstance(ref, torch.Tensor):
            e, allowed = (0.0 if ref == got else math.inf), 0.0
        elif not isinstance(got, torch.Tensor) or got.shape != ref.shape:
            e, allowed = math.inf, 0.0
        else:
            e = float((got.double() - ref.double()).abs().nan_to_num(math.inf).max()) if ref.numel() else 0.0
            allowed = tolerance.allowed(ref)
        ratio = e / allowed if allowed > 0 else (0.0 if e == 0 else math.inf)
        error = max(error, e)
        if ratio >= worst.ratio:
            worst = BatchError(batch, error, allowed, ratio)
    return BatchError(batch, error, worst.allowed, worst.ratio)


def check(model: Any, batches: Sequence[Batch], tolerance: Tolerance) -> list[BatchError]:
    """The rewritten `model`'s output error on each check batch."""
    with torch.inference_mode():
        return [output_error(b.name, model(*b.args), b.eager, tolerance) for b in batches]


# ---- each layer's share of the error (simulated) ------------------------------------------------------------
class _Simulated(fx.Interpreter):
    """The captured graph with some nodes computed by their layers' reduced-precision simulations."""

    def __init__(self, gm: fx.GraphModule, layers: Sequence[Reduced]):
        super().__init__(gm)
        self.layers = {layer.node: layer for layer in layers}

    def run_node(self, n: fx.Node) -> Any:
        layer = self.layers.get(n.name)
        if layer is None:
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        return layer.simulate(*args, **kwargs)


def simulated_ratio(gm: fx.GraphModule, batches: Sequence[Batch], layers: Sequence[Reduced],
                    tolerance: Tolerance) -> float:
    """The worst error / allowed over the batches, with `layers` in reduced precision (simulated) and the rest
    of the captured graph `gm` as the model runs it."""
    worst = 0.0
    with torch.inference_mode():
        for b in batches:
            out = _Simulated(gm, layers).run(*flat_inputs(gm, b.args))  # the outputs flat: compared leaf by leaf
            worst = max(worst, output_error(b.name, out, b.eager, tolerance).ratio)
    return worst


def layer_shares(gm: fx.GraphModule, batches: Sequence[Batch], layers: Sequence[Reduced],
                 tolerance: Tolerance) -> dict[str, float]:
    """{layer node: the model's error / allowed, worst over the batches, with that layer alone in reduced
    precision}: each layer's share of the error."""
    return {layer.node: simulated_ratio(gm, batches, [layer], tolerance) for layer in layers}


def plan(gm: fx.GraphModule, batches: Sequence[Batch], layers: Sequence[Reduced], tolerance: Tolerance,
         shares: dict[str, float], costs: dict[str, float] | None = None) -> list[str]:
    """The layers to keep in fp32, in the order they were taken (`next_to_fall_back` on the simulated error),
    until the simulated model holds `tolerance`."""
    held: list[str] = []
    while True:
        rest = [layer for layer in layers if layer.node not in held]
        ratio = simulated_ratio(gm, batches, rest, tolerance) if rest else 0.0
        if ratio <= 1.0:
            return held
        held.append(next_to_fall_back(ratio, {layer.node: shares[layer.node] for layer in rest}, costs))


def next_to_fall_back(ratio: float, shares: dict[str, float], costs: dict[str, float] | None = None) -> str:
    """The layer (of `shares`: node -> its share of the error) to move to a finer precision while the model's
    error is `ratio` x the allowed: the cheapest (`costs`, from `layer_costs`) of those whose share alone covers
    the excess, ratio - 1 (errors add at most, so one such step may suffice: of top.0 and top.2 with like
    shares, the one that gives up less speed); where none does, or without costs, the largest share, the
    longest step towards it. Ties: the first, in graph order."""
    enough = [node for node, share in shares.items() if share >= ratio - 1.0]
    if costs and enough:
        return min(enough, key=lambda node: (costs.get(node, math.inf), -shares[node]))
    return max(shares, key=lambda node: shares[node])


def layer_costs(layers: Sequence[Reduced], times: dict[str, float]) -> dict[str, float] | None:
    """{layer node: its eager seconds} (`times`: profiling.node_times), what running it in reduced precision saves
    grows with; None unless every layer has a time above zero."""
    costs = {layer.node: times.get(layer.node, 0.0) for layer in layers}
    return costs if all(t > 0 for t in costs.values()) else None


# ---- the report ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerPrecision:
    """One layer a quantizing rule could run in reduced precision: where it ended up, and why."""

    where: str
    what: str
    precision: str  # of template.PRECISIONS: "int8", "bf16" or "fp32"
    share: float  # the model's error / allowed with this layer alone in reduced precision (simulated, worst
    #               check batch): its share of the error
    why: str = ""  # why it is fp32: the tolerance, or its match's own reason (slower, no kernel, ...)

    def __str__(self) -> str:
        alone = f"{self.share:.2g}x the allowed error alone in reduced precision"
        return f"{self.where or '(model)'} {self.what}: {self.precision} ({alone}" + \
            (f"; {self.why})" if self.why else ")")


@dataclass
class AccuracyReport:
    """The contract, each reduced-precision layer's precision, and the rewritten model's measured error."""

    tolerance: Tolerance
    errors: list[BatchError] = field(default_factory=list)  # on the batches the decisions were taken on
    layers: list[LayerPrecision] = field(default_factory=list)
    tests: list[BatchError] = field(default_factory=list)  # on test batches no decision saw: the honest figure

    @property
    def holds(self) -> bool:
        return all(e.holds for e in self.errors)

    @property
    def max_error(self) -> float | None:
        return max((e.error for e in self.errors), default=None)

    def lines(self) -> list[str]:
        verdict = "holds" if self.holds else "BROKEN"
        out = [f"accuracy: |optimized - eager| <= {self.tolerance} per output, {verdict} on "
               f"{len(self.errors)} batch(es)"]
        out += [f"  {e}" for e in self.errors]
        if self.tests:
            verdict = "holds" if all(e.holds for e in self.tests) else "BROKEN"
            out.append(f"on test batches no decision saw, the tolerance {verdict}:")
            out += [f"  {e}" for e in self.tests]
        if self.layers:
            counts = {p: sum(layer.precision == p for layer in self.layers) for p in PRECISIONS}
            out.append("reduced-precision layers: " + ", ".join(f"{n} {p}" for p, n in counts.items()
                                                                if n or p != "bf16"))
            out += [f"  {layer}" for layer in self.layers]
        return out
