"""Hugging Face transformers integration: ckfmha as an attention implementation.

    import ckfmha.transformers
    ckfmha.transformers.register()          # adds "ckfmha" to transformers' interfaces
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="ckfmha")
    model.set_attn_implementation("ckfmha")   # or switch a loaded model

What a transformers attention call becomes (``ckfmha.torch.attention`` arguments):

- no mask: ``causal=True, causal_alignment="bottom_right"`` for causal modules (the queries
  are the last positions of the keys: prefill, and decode steps against a KV cache), nothing
  for bidirectional ones; ``sliding_window=W`` adds ``window=(W - 1, 0)`` (a query sees
  itself and the W - 1 keys before it, as transformers' sliding-window mask does), dropped
  where it excludes no key;
- a mask: the mask function registered with the attention function asks transformers for
  no mask where the batch has no padding and the pattern is plain causal (or a sliding
  window that excludes nothing), as its flash-attention path does. A mask that reaches the
  attention function and equals a pattern the kernels have (causal aligned bottom-right or
  top-left, with the layer's window, or all keys) runs as that pattern; any other mask
  (padding, packed sequences, image-token overlays, a static cache's empty slots) becomes
  an additive ``bias`` (bool False -> -inf, float masks as they are). Correct, but slower:
  the bias is read for every (query, key) pair and runs on the sm80 template;
- ``scaling`` -> ``scale``, ``softcap`` -> ``softcap``, ``s_aux`` (gpt-oss sinks) ->
  ``sink``, ``dropout`` -> ``dropout_p`` while the module trains, ``position_bias`` (T5)
  -> part of ``bias``. K/V heads are passed as they are (GQA runs natively).

transformers takes any registered name for any model, also for models that run their own
attention code on the masks they get (Bloom, for one): such a model gets eager's masks and
its own attention, so it stays correct (and does not use ckfmha). Masks are skipped only
for models whose class declares that its attention goes through the interface
(``_supports_attention_backend``) or whose attention has already reached ckfmha once.

Unsupported requests (``output_attentions``, flex-attention block masks, head dims or dtypes
no kernel covers) raise ``ckfmha.UnsupportedError`` naming what is unsupported, rather than
falling back to another implementation: a silent fallback would hide a slow path and mix two
implementations' numerics in one model. Use ``attn_implementation="sdpa"`` (or "eager")
for such models.

Importing this package imports torch and transformers; ``import ckfmha`` alone does neither.
"""

from __future__ import annotations

from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from ckfmha.transformers.attention import KernelOptions, ckfmha_attention_forward, kernel_options
from ckfmha.transformers.masks import ckfmha_mask, mask_is_native

__all__ = [
    "KernelOptions",
    "ckfmha_attention_forward",
    "ckfmha_mask",
    "kernel_options",
    "mask_is_native",
    "register",
]

# Names transformers itself gives meaning to; registering over them would change every
# model in the process that uses them.
_RESERVED_NAMES = frozenset({"eager", "sdpa", "flex_attention"})


def register(name: str = "ckfmha") -> str:
    """Register ckfmha's attention function and its mask function with transformers under
    ``name`` (idempotent) and return the name, for ``attn_implementation=name``."""
    if name in _RESERVED_NAMES or "|" in name or "/" in name:
        raise ValueError(f"{name!r} is taken by transformers or has its syntax; pick another name")
    current = AttentionInterface._global_mapping.get(name)
    if current is not None and current is not ckfmha_attention_forward:
        raise ValueError(f"attention implementation {name!r} is already registered to {current}")
    AttentionInterface.register(name, ckfmha_attention_forward)
    AttentionMaskInterface.register(name, ckfmha_mask)
    return name
