"""Each int8 layer's share of the DLRM's error, before anything is tuned: what tune_model's accuracy contract
plans with (`accuracy.layer_shares`: the model's error on the check batches with that layer alone in reduced
precision, over the allowed error), with smoothing as it ships and with smoothing off, and the share of the
model with every layer and table in reduced precision together.

`--unsigned-after-relu` adds a what-if no kernel runs yet: the layers whose input comes out of a ReLU quantized
to [0, 255] (uint8) instead of [-127, 127], in the layers' eager simulations only.
Usage:
    python -m benchmarks.layer_shares --pooling 8 [--unsigned-after-relu]
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Sequence

import torch

import search_spaces.qmatmul.graph as qgraph
from benchmarks.lib import example
from search_spaces.quantize_rows.workload import quantize_rows
from search_spaces.template import Reduced


def unsigned_linear(smooth: torch.Tensor | None) -> Any:
    """An int8 layer's eager twin with its (non-negative) activations quantized per row to [0, 255]."""

    def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        w = w.detach().float()
        if smooth is not None:
            x, w = x * (1 / smooth), w * smooth
        wq, w_scale = quantize_rows(w)
        scale = x.abs().amax(1).clamp_min(1e-12) / 255
        q = torch.round(x / scale[:, None]).clamp(0, 255)
        return torch.nn.functional.linear(q * scale[:, None], wq.float() * w_scale[:, None], b)

    return linear


def layers_of(model: torch.nn.Module, args: tuple[Any, ...], smoothing: bool) -> tuple[Any, list[Reduced]]:
    """The captured graph and its reduced-precision layers as tune_model's rules find them."""
    from autotune.torch.graph import capture
    from autotune.torch.tune_model import _reduced, collect_rules, discover

    default = qgraph.SMOOTH_GAIN
    qgraph.SMOOTH_GAIN = default if smoothing else 0.0
    try:
        gm = capture(model, args)
        found = discover(gm, args, collect_rules(True, (), None))
    finally:
        qgraph.SMOOTH_GAIN = default
    return gm, _reduced([*found.matches, *found.alternatives])


def after_relu(gm: Any, layers: Sequence[Reduced]) -> list[Reduced]:
    """`layers` with those whose linear reads a ReLU's output simulated on uint8 activations."""
    nodes = {n.name: n for n in gm.graph.nodes}
    out = []
    for layer in layers:
        x = nodes[layer.node].args[0] if layer.node in nodes and nodes[layer.node].args else None
        relu = getattr(x, "target", None) in qgraph.RELUS and "int8 (8-bit" in layer.what
        smooth = next((c.cell_contents for c in (layer.simulate.__closure__ or ())
                       if isinstance(c.cell_contents, torch.Tensor)), None)
        out.append(dataclasses.replace(layer, simulate=unsigned_linear(smooth)) if relu else layer)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pooling", type=int, default=8, help="indices per bag (default 8)")
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--unsigned-after-relu", action="store_true", help="add the uint8 what-if (see above)")
    args = p.parse_args(argv)
    from autotune.torch import accuracy
    from autotune.torch.graph import _as_args

    dlrm = example.dlrm()
    torch.manual_seed(0)
    model = dlrm.DLRM(tuple(min(r, 200_000) for r in dlrm.CRITEO_KAGGLE_ROWS)).eval()
    inputs = _as_args(dlrm.make_batch(model, args.batch, (args.pooling, args.pooling), 0))
    contract = accuracy.default_tolerance(None, True)
    checks = accuracy.check_batches(model, inputs, None)
    variants = {"not smoothed": layers_of(model, inputs, False), "smoothed": layers_of(model, inputs, True)}
    if args.unsigned_after_relu:
        gm, layers = variants["smoothed"]
        variants["smoothed, uint8 after a ReLU"] = (gm, after_relu(gm, layers))
    for name, (gm, layers) in variants.items():
        shares = accuracy.layer_shares(gm, checks, layers, contract)
        linears = {layer.where.split(",")[0]: round(shares[layer.node], 3) for layer in layers
                   if layer.what.startswith("Linear")}
        together = accuracy.simulated_ratio(gm, checks, layers, contract)
        print(f"{name}: {linears}; every layer and table together {together:.3f}")


if __name__ == "__main__":
    main()
