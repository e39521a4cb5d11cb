"""Drop-in modules whose forward runs `torch.ops.autotune.*`: EmbeddingBag, DotInteraction, QuantLinear.

Each calls the custom operator, so a call without a fitting kernel still computes PyTorch's result (and warns
once); the modules themselves hold ordinary parameters and buffers (state dicts load as PyTorch's do).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import Tensor, nn

from . import ops  # noqa: F401  (registers torch.ops.autotune.*)

__all__ = ["DotInteraction", "EmbeddingBag", "QuantLinear", "quantize_rows"]


class EmbeddingBag(nn.EmbeddingBag):
    """`nn.EmbeddingBag` (same constructor, `from_pretrained`, weight Parameter, state dict) on tuned kernels.

    The forward runs `torch.ops.autotune.embedding_bag`; its backward is PyTorch's, so the module trains.
    What the kernels do not cover runs `nn.EmbeddingBag.forward` itself: `max_norm` (it renormalises rows in
    place), and sparse or frequency-scaled gradients while gradients are being taken. Inputs are made contiguous
    (a copy only when they are not); `validate=False` skips the checks of indices and offsets.
    """

    def __init__(self, *args: Any, validate: bool = True, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.validate = validate

    @classmethod
    def from_module(cls, module: nn.EmbeddingBag, validate: bool = True) -> "EmbeddingBag":
        """A tuned twin of `module` that shares its weight Parameter (optimizers holding it keep working)."""
        new = cls(module.num_embeddings, module.embedding_dim, max_norm=module.max_norm, norm_type=module.norm_type,
                  scale_grad_by_freq=module.scale_grad_by_freq, mode=module.mode, sparse=module.sparse,
                  _weight=module.weight.detach(), include_last_offset=module.include_last_offset,
                  padding_idx=module.padding_idx, validate=validate)
        new.weight = module.weight
        new.train(module.training)
        return new

    def _pytorch_path(self) -> bool:
        grads = torch.is_grad_enabled() and self.weight.requires_grad
        return self.max_norm is not None or (grads and (self.sparse or self.scale_grad_by_freq))

    def forward(self, input: Tensor, offsets: Optional[Tensor] = None,
                per_sample_weights: Optional[Tensor] = None) -> Tensor:
        if self._pytorch_path() or (input.dim() == 2) == (offsets is not None) or input.dim() not in (1, 2):
            return super().forward(input, offsets, per_sample_weights)  # PyTorch's result, or its error
        if input.dim() == 2:  # (bags, n): fixed-size bags, as nn.EmbeddingBag takes them
            offsets = torch.arange(0, input.numel(), input.shape[1], dtype=input.dtype, device=input.device)
            input = input.reshape(-1)
            if per_sample_weights is not None:
                per_sample_weights = per_sample_weights.reshape(-1)
        assert offsets is not None
        return torch.ops.autotune.embedding_bag(
            self.weight, input.contiguous(), offsets.contiguous(),
            None if per_sample_weights is None else per_sample_weights.contiguous(), self.mode,
            self.include_last_offset, self.padding_idx, self.validate)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", autotune"


class DotInteraction(nn.Module):
    """DLRM's dot interaction: `cat([x, tril(T T^T)])` with T the dense vector and the T embeddings of a sample.

    `ly` is the list of (batch, dim) embeddings DLRM passes (stacked here: one copy) or one (batch, tables, dim)
    tensor. `self_interaction` keeps the diagonal (DLRM's `arch_interaction_itself`).
    """

    def __init__(self, self_interaction: bool = False, validate: bool = True):
        super().__init__()
        self.self_interaction = self_interaction
        self.validate = validate

    @classmethod
    def from_module(cls, module: nn.Module, validate: bool = True) -> "DotInteraction":
        """For a model's own interaction module with the same semantics (its `self_interaction`, if it has one)."""
        return cls(bool(getattr(module, "self_interaction", False)), validate=validate)

    def forward(self, x: Tensor, ly: Tensor | Sequence[Tensor]) -> Tensor:
        stacked = ly if isinstance(ly, Tensor) else torch.stack(list(ly), dim=1)
        return torch.ops.autotune.interaction(x.contiguous(), stacked.contiguous(), self.self_interaction,
                                              self.validate)

    def extra_repr(self) -> str:
        return f"self_interaction={self.self_interaction}"


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric int8 per row: (round(x / scale) in [-127, 127], scale = max |x| / 127 per row)."""
    scale = x.abs().amax(dim=1).clamp_min(1e-12) / 127.0
    return torch.round(x / scale[:, None]).clamp_(-127, 127).to(torch.int8), scale


class QuantLinear(nn.Module):
    """An int8 `nn.Linear` for inference on tuned qmatmul kernels, optionally with the following ReLU fused.

    Weights are quantized per output channel once (`from_float`); in int8 mode activations are quantized per row
    at run time (symmetric, max-abs), in weight-only mode they stay float32. Its tensors are buffers: it has no
    gradients. Inputs may have any leading dimensions, as nn.Linear's.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, relu: bool = False,
                 mode: str = "int8", device: Any = None, validate: bool = True):
        super().__init__()
        if mode not in ("int8", "weight_only"):
            raise ValueError(f"QuantLinear: mode must be int8 or weight_only, got {mode!r}")
        self.in_features, self.out_features = in_features, out_features
        self.relu, self.mode, self.validate = relu, mode, validate
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8, device=device))
        self.register_buffer("w_scale", torch.ones(out_features, device=device))
        self.register_buffer("bias", torch.zeros(out_features, device=device) if bias else None)

    @classmethod
    def from_float(cls, linear: nn.Linear, relu: bool = False, mode: str = "int8",
                   validate: bool = True) -> "QuantLinear":
        """Quantize `linear`'s weight per output channel (symmetric, max-abs); the bias stays float32."""
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, relu=relu, mode=mode,
                  device=linear.weight.device, validate=validate)
        with torch.no_grad():
            q, scale = quantize_rows(linear.weight.detach().float())
            new.weight.copy_(q)
            new.w_scale.copy_(scale)
            if linear.bias is not None:
                new.bias.copy_(linear.bias.detach().float())
        return new

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        a = x.reshape(-1, self.in_features).float().contiguous()
        if self.mode == "int8":
            q, scale = quantize_rows(a)
            y = torch.ops.autotune.qmatmul(q, self.weight, scale, self.w_scale, self.bias, self.relu, self.validate)
        else:
            y = torch.ops.autotune.qmatmul(a, self.weight, None, self.w_scale, self.bias, self.relu, self.validate)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"relu={self.relu}, mode={self.mode}")
