"""Masks as the kernels take them: an additive bias whose rows run along the keys."""

from __future__ import annotations

import torch


def keys_contiguous(bias: torch.Tensor) -> torch.Tensor:
    """``bias`` with a contiguous key axis: the kernels read bias rows along the keys."""
    return bias if bias.stride(-1) == 1 else bias.contiguous()


def additive_bias(mask: torch.Tensor, dtype: torch.dtype, seqlen_k: int | None = None
                  ) -> torch.Tensor:  # fmt: skip
    """The additive bias a mask stands for, in ``dtype``: a boolean mask gives 0 where it is
    True (attend) and -inf where False; a float mask is the bias itself (still differentiable).
    A key axis that broadcasts (size 1) is expanded to ``seqlen_k``: the kernels broadcast a
    bias over batch, heads and query rows, not over keys."""
    if mask.dtype == torch.bool:
        zero = torch.zeros((), dtype=dtype, device=mask.device)
        blocked = torch.full((), float("-inf"), dtype=dtype, device=mask.device)
        bias = torch.where(mask, zero, blocked)
    else:
        bias = mask.to(dtype)
    if seqlen_k is not None and bias.shape[-1] != seqlen_k:
        bias = bias.expand(*bias.shape[:-1], seqlen_k)
    return keys_contiguous(bias)
