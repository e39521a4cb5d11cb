"""How far DLRMv2's output moves when its cross network's state is stored in 16 bits (an accuracy question to
settle before a kernel stores it so).

Each cross layer of TorchRec's LowRankCrossNet reads x0 and x_l and writes x_{l+1}, all float32 (batch x 3456):
the traffic that bounds the int8 model's cross layers (benchmarks/WHOLE_MODEL.md, twenty-fourth session). Here
x0 and every x_l are rounded to bfloat16 or float16 as they would be stored, the products and the tail computed
in float32, and the model's output compared with eager on batches drawn as examples/torchrec_dlrm.py draws them
(its model, randomly initialised as TorchRec initialises it; a trained model's ranges may differ).

    python -m benchmarks.cross_state_precision [--max-rows 100000] [--batch 1024] [--batches 2]
"""

from __future__ import annotations

import argparse
from typing import Any, Callable, Sequence

import torch

from benchmarks.lib.example import torchrec_dlrm


def stored_as(dtype: torch.dtype) -> Callable[..., torch.Tensor]:
    """LowRankCrossNet's forward with x0 and each layer's output rounded to `dtype` as stored."""
    def forward(self: Any, input: torch.Tensor) -> torch.Tensor:
        def store(t: torch.Tensor) -> torch.Tensor:
            return t.to(dtype).float()

        x0 = store(input)
        x = x0
        for layer in range(self._num_layers):
            y = torch.nn.functional.linear(torch.nn.functional.linear(x, self.V_kernels[layer]),
                                           self.W_kernels[layer])
            x = store(x0 * (y + self.bias[layer]) + x)
        return x

    return forward


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-rows", type=int, default=100_000, help="cap on a table's rows")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--batches", type=int, default=2)
    args = p.parse_args(argv)
    if min(args.max_rows, args.batch, args.batches) < 1:
        p.error("--max-rows, --batch and --batches take values >= 1")
    from torchrec.modules.crossnet import LowRankCrossNet

    ex = torchrec_dlrm()
    torch.manual_seed(0)
    model, rows = ex.build("dcn", args.max_rows)
    batches = [ex.make_batch(rows, ex.MLPERF_POOLING, args.batch, seed) for seed in range(1, args.batches + 1)]
    with torch.no_grad():
        want = [model(*b) for b in batches]
    scale = max(float(w.abs().max()) for w in want)
    original = LowRankCrossNet.forward
    try:
        for dtype in (torch.bfloat16, torch.float16):
            LowRankCrossNet.forward = stored_as(dtype)  # type: ignore[method-assign]
            with torch.no_grad():
                error = max(float((model(*b) - w).abs().max()) for b, w in zip(batches, want))
            print(f"cross state stored as {str(dtype).split('.')[-1]}: max |out - eager| {error:.2e} "
                  f"(max |eager out| {scale:.3g}; {args.batches} batches of {args.batch})")
    finally:
        LowRankCrossNet.forward = original  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
