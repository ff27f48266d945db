"""PyTorch integration: custom ops, autograd and an SDPA-shaped entry.

    import ckfmha.torch
    o = ckfmha.torch.attention(q, k, v, causal=True, softcap=30.0, sink=sinks)
    o = ckfmha.torch.sdpa(q, k, v, is_causal=True)      # F.scaled_dot_product_attention's call
    y = ckfmha.torch.conv2d(x, w, padding=1, groups=32)  # F.conv2d's call, channels_last out
    compiled = torch.compile(model, fullgraph=True)      # no graph break at attention

Importing this package registers the ``torch.ops.ckfmha`` operators (``fwd``, ``bwd``,
``fwd_varlen``, ``bwd_varlen``, ``fwd_paged``, ``append_kv``, ``conv_fwd``, ``conv_bwd_data``,
``conv_bwd_weight``) with fake implementations and autograd formulas. Importing it imports
torch; ``import ckfmha`` alone never does.
"""

from __future__ import annotations

from ckfmha.torch.conv_ops import conv2d, conv3d
from ckfmha.torch.functional import append_kv, attention, attention_varlen, fwd_paged
from ckfmha.torch.sdpa import sdpa

__all__ = ["append_kv", "attention", "attention_varlen", "conv2d", "conv3d", "fwd_paged",
           "sdpa"]
