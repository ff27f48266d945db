"""fp8 (e4m3) K/V caches in the forward runners: which arrays may be fp8, and the checks of the
dequantisation scales, before anything reaches the device. Appends (``ckfmha.append_kv``)
write such caches with the same scales and checks.

k and v hold e4m3 values (float8_e4m3fn, or uint8 codes with ``kv_dtype="fp8_e4m3"``) that
stand for ``k_scale * k`` and ``v_scale * v``; q and the output stay fp16 or bf16 (unless q is
fp8 too: ckfmha.fp8_attention). A scale is a Python float (read when the call is made: a
captured CUDA graph keeps that value) or a device fp32 array of 1 or nhead_k values (read by
the kernels: a graph follows its updates); with fp8 queries, 3-D arrays of one value per
128-token block of each head (ckfmha.fp8_attention). The C library checks the rest (q's dtype,
page layouts, strides) when the problem is validated; the Cython side (``_fp8_kv.pyx``) fills
the C structs.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

from ckfmha import _dtypes
from ckfmha.errors import InvalidArgumentError

# C enum ckfmha_kv_quant.
KV_QUANT_NONE = 0
KV_QUANT_FP8_E4M3 = 1

_FP8 = _dtypes.NAMES[_dtypes.FP8_E4M3]
_HOW = (
    "pass k and v as float8_e4m3fn arrays (torch, ml_dtypes), or as uint8 e4m3 codes with "
    f"kv_dtype='{_FP8}'"
)


def invalid_argument(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, 1)  # CKFMHA_ERROR_INVALID_ARGUMENT


def is_scale_value(scale: Any) -> bool:
    """A scale given as a number (float, int, NumPy scalar), not as an array."""
    return isinstance(scale, Real) and not isinstance(scale, bool)


def scale_value(scale: Any, name: str, scaled: str = "K/V") -> float:
    """A number scale as the fp32 the problem holds: positive and finite. ``scaled`` names
    what it dequantises in the message ("K/V", "q")."""
    value = float(scale)
    if not (value > 0.0 and math.isfinite(value)):
        raise invalid_argument(
            f"{name} is {value!r}; fp8 {scaled} stands for {name} * value, so the scale must be "
            "positive and finite"
        )
    # fp32 is what the kernels multiply by: a finite double may still overflow or vanish.
    if not 1.1754943508222875e-38 <= value <= 3.4028234663852886e38:
        raise invalid_argument(f"{name} is {value!r}, outside the positive normal fp32 range")
    return value


def check_scale_args(k_scale: Any, v_scale: Any) -> None:
    """What can be checked of k_scale and v_scale before any array is read: numbers are
    positive and finite, and device scales come as a pair (the kernels read both or
    neither)."""
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if is_scale_value(scale):
            scale_value(scale, name)
        elif isinstance(scale, (bool, str, bytes)):
            raise invalid_argument(
                f"{name} must be a float, or an fp32 array of 1 or nhead_k values; got {scale!r}"
            )
    kinds = [_scale_kind(k_scale), _scale_kind(v_scale)]
    if "an array" in kinds and kinds[0] != kinds[1]:
        raise invalid_argument(
            f"k_scale is {kinds[0]} and v_scale {kinds[1]}: pass both as fp32 device arrays "
            "(read by the kernels, so a captured CUDA graph follows their updates) or neither "
            "(numbers, or None for 1.0)"
        )


def _scale_kind(scale: Any) -> str:
    if scale is None:
        return "not given"
    return "a number" if is_scale_value(scale) else "an array"


def kv_quant_of(
    q_dtype: int,
    k_dtype: int,
    v_dtype: int,
    *,
    scales_given: bool,
    k_name: str = "k",
    v_name: str = "v",
) -> int:
    """The ckfmha_kv_quant of a call from its arrays' dtype codes: K/V in q's dtype, or both
    fp8 e4m3 (with q in fp16 or bf16, which the C problem check states). Raises
    InvalidArgumentError for fp8 q, one of k and v fp8, uint8 K/V not declared e4m3, and
    scales given for K/V that are not fp8."""
    names = _dtypes.NAMES
    # fwd and fwd_varlen settle fp8 queries first (ckfmha.fp8_attention) and pass the output
    # dtype as q's; an fp8 q here is one of a runner that reads none (fwd_paged).
    if q_dtype in (_dtypes.FP8_E4M3, _dtypes.UINT8):
        raise invalid_argument(
            f"q is {names[q_dtype]}, but fp8 queries are read by fwd and fwd_varlen over "
            f"contiguous K/V only: here q and the output stay fp16 or bf16 ({_HOW})"
        )
    quant = cache_quant_of(
        k_dtype, v_dtype, scales_given=scales_given, k_name=k_name, v_name=v_name
    )
    if quant == KV_QUANT_FP8_E4M3:
        return quant
    if not q_dtype == k_dtype == v_dtype:
        raise invalid_argument(
            f"q, {k_name} and {v_name} must have one dtype (or {k_name} and {v_name} both "
            f"{_FP8}), got {names[q_dtype]}, {names[k_dtype]}, {names[v_dtype]}"
        )
    return KV_QUANT_NONE


def cache_quant_of(
    k_dtype: int, v_dtype: int, *, scales_given: bool, k_name: str = "k", v_name: str = "v"
) -> int:
    """The ckfmha_kv_quant of a K/V pair's dtype codes alone: fp8 e4m3 when both are, else
    none. Raises InvalidArgumentError for uint8 not declared e4m3, one of the two fp8, and
    scales given for K/V that are not fp8."""
    names = _dtypes.NAMES
    for name, code in ((k_name, k_dtype), (v_name, v_dtype)):
        if code == _dtypes.UINT8:
            raise invalid_argument(
                f"{name} is uint8: if it holds e4m3 codes, say so with kv_dtype='{_FP8}' "
                "(float8_e4m3fn arrays need no such hint)"
            )
    k_fp8, v_fp8 = k_dtype == _dtypes.FP8_E4M3, v_dtype == _dtypes.FP8_E4M3
    if k_fp8 != v_fp8:
        raise invalid_argument(
            f"{k_name} is {names[k_dtype]} but {v_name} is {names[v_dtype]}: fp8 K/V needs both "
            f"{k_name} and {v_name} in e4m3 ({_HOW}), q in fp16 or bf16"
        )
    if k_fp8:
        return KV_QUANT_FP8_E4M3
    if scales_given:
        raise invalid_argument(
            f"k_scale/v_scale are given, but {k_name} and {v_name} are {names[k_dtype]}: the "
            f"scales dequantise fp8 K/V only ({_HOW})"
        )
    return KV_QUANT_NONE


def append_quant_of(
    k_new_dtype: int, v_new_dtype: int, k_cache_dtype: int, v_cache_dtype: int, *,
    scales_given: bool, vectorized: bool,
) -> int:  # fmt: skip
    """The cache_quant of an append (``ckfmha.append_kv``) from its arrays' dtype codes: the
    caches in the new tokens' dtype, or both e4m3, written as e4m3(x / scale) from fp16 or bf16
    tokens into linear caches. Raises InvalidArgumentError otherwise, naming why."""
    names = _dtypes.NAMES
    for name, code in (("k_new", k_new_dtype), ("v_new", v_new_dtype)):
        if code in (_dtypes.FP8_E4M3, _dtypes.UINT8):
            raise invalid_argument(
                f"{name} is {names[code]}, but the new tokens come in fp16 or bf16: the append "
                f"quantises them into fp8 caches (k_cache, v_cache in {_FP8})"
            )
    quant = cache_quant_of(
        k_cache_dtype, v_cache_dtype, scales_given=scales_given, k_name="k_cache",
        v_name="v_cache",
    )  # fmt: skip
    if quant == KV_QUANT_NONE:
        if not k_new_dtype == v_new_dtype == k_cache_dtype == v_cache_dtype:
            raise invalid_argument(
                f"k_new, v_new, k_cache and v_cache must share one dtype (or the caches both "
                f"{_FP8}), got {names[k_new_dtype]}, {names[v_new_dtype]}, "
                f"{names[k_cache_dtype]}, {names[v_cache_dtype]}"
            )
        return quant
    if k_new_dtype != v_new_dtype or k_new_dtype not in (_dtypes.FP16, _dtypes.BF16):
        raise invalid_argument(
            f"fp8 caches take k_new and v_new both fp16 or both bf16, got "
            f"{names[k_new_dtype]} and {names[v_new_dtype]}"
        )
    if vectorized:
        raise invalid_argument(
            "fp8 caches are written in linear pages only (as fwd_paged reads them): "
            "page_layout='vectorized' holds fp16/bf16"
        )
    return quant


def scale_count(shape: tuple[int, ...], nhead_k: int, name: str,
                heads: str = "nhead_k", head: str = "K/V head") -> int:  # fmt: skip
    """The values a scale array holds, read from its shape before it is viewed or staged: 1
    (one scale for every head) or nhead_k (one per head; q_scale passes nhead_q, with
    ``heads`` and ``head`` naming them in the message)."""
    count = math.prod(shape)
    if len(shape) > 1 or count not in (1, nhead_k):
        raise invalid_argument(
            f"{name} must hold 1 or {heads}={nhead_k} fp32 values (one per {head}), got "
            f"shape {shape}"
        )
    return count


def scales_per_head(k_count: int, v_count: int, nhead_k: int) -> bool:
    """Whether device scales of these lengths are one per K/V head. The C problem has one
    flag for both arrays, so their lengths must agree."""
    if k_count != v_count:
        raise invalid_argument(
            f"k_scale has {k_count} values and v_scale {v_count}: device scales are both one "
            f"value or both nhead_k={nhead_k} values (one per K/V head)"
        )
    return k_count > 1
