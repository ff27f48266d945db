"""fp8 (e4m3) queries in ``fwd`` and ``fwd_varlen``: when q may be e4m3, the output dtype such
a call writes, and the checks of q_scale, before anything reaches the device.

q holds e4m3 values (float8_e4m3fn, or uint8 codes with ``q_dtype="fp8_e4m3"``) standing for
``q_scale * q``. Both products then run in e4m3 on Hopper's tensor cores, so K and V must be
e4m3 too (ckfmha.fp8_kv's rules and scales); the output is fp16 or bf16 (``out_dtype``, bf16
by default), which is the C problem's ``dtype``. q_scale is a number or a device fp32 array
of 1 or nhead_q values; the C problem has one per-head flag (``kv_scale_per_head``) for all
three scales, so per-head device scales come for q, k and v together.

Per-block scales (``fp8_block_scales``): q_scale, k_scale and v_scale all 3-D fp32 arrays,
one scale per block of ``CKFMHA_FP8_SCALE_BLOCK`` (128) tokens of each head:
[batch, nhead_q, ceil(seqlen_q / 128)] for q, [batch, nhead_k, ceil(seqlen_k / 128)] for k and
v (fwd_varlen: one row per sequence, blocks from each sequence's first token, max_seqlen_q/k).
A block's outliers then cost only its own tokens their precision. The mode is one flag of the
C problem for all three scales, so they come 3-D together; they need fp8 queries, since the
kernels that read K/V alone (fp16/bf16 q) take one scale per tensor or head. The C library
checks the rest (head dims, masks, features, the arch); ``_fp8_kv.pyx`` fills the C structs.
"""

from __future__ import annotations

from typing import Any

from ckfmha import _dtypes
from ckfmha.fp8_kv import (
    KV_QUANT_FP8_E4M3,
    KV_QUANT_NONE,
    invalid_argument,
    is_scale_value,
    scale_value,
)

# fp8 queries write these; bf16 when out_dtype is not given (its range holds any
# dequantised product, where fp16 may overflow).
OUT_DTYPES = (_dtypes.FP16, _dtypes.BF16)
DEFAULT_OUT_DTYPE = _dtypes.BF16

_FP8 = _dtypes.NAMES[_dtypes.FP8_E4M3]
_HOW = (
    "pass q as a float8_e4m3fn array (torch, ml_dtypes), or as uint8 e4m3 codes with "
    f"q_dtype='{_FP8}'"
)


def check_q_scale_arg(q_scale: Any) -> None:
    """What can be checked of q_scale before any array is read: a number is positive and
    finite; an array's length is checked against nhead_q when it is viewed."""
    if is_scale_value(q_scale):
        scale_value(q_scale, "q_scale", "q")
    elif isinstance(q_scale, (bool, str, bytes)):
        raise invalid_argument(
            f"q_scale must be a float, or an fp32 array of 1 or nhead_q values; got {q_scale!r}"
        )


def q_quant_of(q_dtype: int, k_dtype: int, v_dtype: int, *, q_scale_given: bool) -> int:
    """The C problem's q_quant from the arrays' dtype codes: fp8 e4m3 when q is, which needs
    k and v in e4m3 too. Raises InvalidArgumentError for uint8 q not declared e4m3, fp8 q
    over K/V that are not fp8, and q_scale for a q that is not fp8."""
    names = _dtypes.NAMES
    if q_dtype == _dtypes.UINT8:
        raise invalid_argument(
            f"q is uint8: if it holds e4m3 codes, say so with q_dtype='{_FP8}' "
            "(float8_e4m3fn arrays need no such hint)"
        )
    if q_dtype != _dtypes.FP8_E4M3:
        if q_scale_given:
            raise invalid_argument(
                f"q_scale is given, but q is {names[q_dtype]}: it dequantises fp8 queries only "
                f"({_HOW})"
            )
        return KV_QUANT_NONE
    if not k_dtype == v_dtype == _dtypes.FP8_E4M3:
        raise invalid_argument(
            f"q is {_FP8} but k and v are {names[k_dtype]} and {names[v_dtype]}: fp8 queries "
            f"need fp8 K/V (k and v both {_FP8}, kv_dtype='{_FP8}' for uint8 codes), as both "
            "products run in e4m3"
        )
    return KV_QUANT_FP8_E4M3


def out_dtype_of(q_dtype: int, q_quant: int, out_dtype: Any) -> int:
    """The output's dtype code (the C problem's dtype): ``out_dtype`` (fp16 or bf16) or bf16
    for fp8 queries; q's own dtype otherwise, which ``out_dtype`` may only repeat."""
    names = _dtypes.NAMES
    if out_dtype is None:
        return DEFAULT_OUT_DTYPE if q_quant != KV_QUANT_NONE else q_dtype
    code = _dtypes.dtype_code(out_dtype)
    if q_quant != KV_QUANT_NONE:
        if code not in OUT_DTYPES:
            raise invalid_argument(
                f"out_dtype is {names[code]}, but fp8 queries write fp16 or bf16 (the "
                "problem's dtype)"
            )
        return code
    if code != q_dtype:
        raise invalid_argument(
            f"out_dtype is {names[code]} but q is {names[q_dtype]}: the output has q's dtype "
            f"unless q is {_FP8} ({_HOW})"
        )
    return code


def check_q_scale_heads(q_count: int, nhead_q: int, kv_per_head: bool) -> None:
    """A device q_scale of ``q_count`` values agrees with the K/V scales: the C problem's one
    per-head flag means nhead_q q scales exactly when k_scale and v_scale hold nhead_k."""
    q_per_head = q_count > 1
    if q_per_head and not kv_per_head:
        raise invalid_argument(
            f"q_scale holds nhead_q={nhead_q} values (one per query head), but k_scale and "
            "v_scale are not per-head device arrays: one flag says whether all three scales "
            "are per head, so pass k_scale and v_scale as fp32 arrays of nhead_k values too"
        )
    if kv_per_head and not q_per_head:
        raise invalid_argument(
            f"k_scale and v_scale hold one value per K/V head, so a device q_scale holds one "
            f"per query head: nhead_q={nhead_q} values, got {q_count} (or pass q_scale as a "
            "number)"
        )


def scale_shape(scale: Any) -> tuple[int, ...]:
    """A scale's shape, read without viewing (or staging) it: () for numbers and None."""
    return tuple(int(n) for n in getattr(scale, "shape", ()))


def _is_block_scale(scale: Any) -> bool:
    """A 3-D scale array: per-block scales (numbers and 1-D arrays have fewer axes)."""
    return len(scale_shape(scale)) == 3


def _scale_form(scale: Any) -> str:
    if scale is None:
        return "is not given"
    if is_scale_value(scale):
        return "is a number"
    return f"has shape {scale_shape(scale)}"


def uses_block_scales(q_dtype: int, q_scale: Any, k_scale: Any, v_scale: Any) -> bool:
    """Whether a call's scales are per block: q_scale, k_scale and v_scale all 3-D arrays.
    Runs before q_quant_of, so that 3-D scales over fp16/bf16 q are refused for what they
    are; uint8 q is left to q_quant_of, which asks for q_dtype. Raises InvalidArgumentError
    for 3-D scales over q that is not fp8, and for 3-D scales mixed with other kinds (the C
    problem's one flag covers all three)."""
    scales = (("q_scale", q_scale), ("k_scale", k_scale), ("v_scale", v_scale))
    blocks = [name for name, scale in scales if _is_block_scale(scale)]
    if not blocks:
        return False
    named = f"{' and '.join(blocks)} {'is' if len(blocks) == 1 else 'are'} 3-D (per-block scales)"
    if q_dtype not in (_dtypes.FP8_E4M3, _dtypes.UINT8):
        raise invalid_argument(
            f"{named}, but q is {_dtypes.NAMES[q_dtype]}: per-block scales need fp8 queries "
            f"({_HOW}); fp8 K/V under fp16/bf16 q take k_scale and v_scale as numbers or fp32 "
            "arrays of 1 or nhead_k values"
        )
    if len(blocks) < len(scales):
        others = ", ".join(f"{name} {_scale_form(s)}" for name, s in scales if name not in blocks)
        raise invalid_argument(
            f"{named} but {others}: per-block scales come for q, k and v together (q_scale, "
            "k_scale and v_scale all 3-D fp32 arrays), or not at all (numbers, or arrays of 1 "
            "or nhead values)"
        )
    return True


def block_scale_shape(name: str, shape: tuple[int, ...], expected: tuple[int, int, int],
                      heads: str, seqlen: str, block: int) -> None:  # fmt: skip
    """A per-block scale array's shape, checked before it is viewed or staged: ``expected``
    is (batch, heads, blocks), and ``heads`` and ``seqlen`` name the counts it comes from as
    the caller knows them ("nhead_q", and "seqlen_q" for fwd or "max_seqlen_q" for
    fwd_varlen, whose batch counts sequences)."""
    if tuple(shape) != tuple(expected):
        raise invalid_argument(
            f"{name} must have shape [batch, {heads}, ceil({seqlen} / {block})] = "
            f"{tuple(expected)} (one fp32 scale per {block}-token block of each head), got "
            f"shape {tuple(shape)}"
        )
