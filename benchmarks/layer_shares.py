"""Each int8 layer's share of the DLRM's error, before anything is tuned: what tune_model's accuracy contract
plans with (`accuracy.layer_shares`: the model's error on the check batches with that layer alone in reduced
precision, over the allowed error), with smoothing as it ships and with smoothing off, and the share of the
model with every layer and table in reduced precision together. Layers after a ReLU take uint8 activations on
hosts with VNNI, as tune_model runs them.
Usage:
    python -m benchmarks.layer_shares --pooling 8
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

import search_spaces.qmatmul.graph as qgraph
from benchmarks.lib import example
from search_spaces.template import Reduced


def layers_of(model: torch.nn.Module, args: tuple[Any, ...], smoothing: bool) -> tuple[Any, list[Reduced]]:
    """The captured graph and its reduced-precision layers as tune_model's rules find them."""
    from autotune.torch.graph import capture, discover
    from autotune.torch.ladder import reduced_layers
    from autotune.torch.rules import collect_rules

    default = qgraph.SMOOTH_GAIN
    qgraph.SMOOTH_GAIN = default if smoothing else 0.0
    try:
        gm = capture(model, args)
        found = discover(gm, args, collect_rules(True, (), None))
    finally:
        qgraph.SMOOTH_GAIN = default
    return gm, reduced_layers([*found.matches, *found.alternatives])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pooling", type=int, default=8, help="indices per bag (default 8)")
    p.add_argument("--batch", type=int, default=2048)
    args = p.parse_args(argv)
    from autotune.torch import accuracy
    from autotune.torch.capture import as_args

    dlrm = example.dlrm()
    torch.manual_seed(0)
    model = dlrm.DLRM(tuple(min(r, 200_000) for r in dlrm.CRITEO_KAGGLE_ROWS)).eval()
    inputs = as_args(dlrm.make_batch(model, args.batch, (args.pooling, args.pooling), 0))
    contract = accuracy.default_tolerance(None, True)
    checks = accuracy.check_batches(model, inputs, None)
    variants = {"not smoothed": layers_of(model, inputs, False), "smoothed": layers_of(model, inputs, True)}
    for name, (gm, layers) in variants.items():
        shares = accuracy.layer_shares(gm, checks, layers, contract)
        linears = {layer.where.split(",")[0]: round(shares[layer.node], 3) for layer in layers
                   if layer.what.startswith("Linear")}
        together = accuracy.simulated_ratio(gm, checks, layers, contract)
        print(f"{name}: {linears}; every layer and table together {together:.3f}")


if __name__ == "__main__":
    main()
