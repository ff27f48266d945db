"""e4m3 (fp8) values on the host: encoding, rounding and scales, in NumPy.

The fp8 format Hopper's tensor cores take is e4m3 "FN" (OCP FP8): 1 sign, 4 exponent (bias 7)
and 3 mantissa bits, no infinities, NaN at 0x7F/0xFF, largest finite value 448, smallest
subnormal 2**-9. A tensor in fp8 travels with a scale: its real value is code * scale, so a
scale of amax / 448 lets the largest element use the whole range.

``round_e4m3`` rounds to the nearest e4m3 value, ties to the even code, saturating at +-448
(as the GPU's ``cvt.rn.satfinite`` conversion does, and torch's float8_e4m3fn cast);
``encode_e4m3`` / ``decode_e4m3`` convert between values and the uint8 codes; ``quantize``
and ``dequantize`` apply a scale (one per tensor, or one per block of rows with
``block_scales``). The float64 reference of an fp8 attention runs on ``dequantize``'s output:
the inputs exactly as the kernel sees them.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

E4M3_MAX = 448.0
NAN_CODE = 0x7F  # with the sign bit: 0xFF


def _code_values() -> npt.NDArray[np.float64]:
    """The values of codes 0..127 (sign bit clear); code 0x7F is NaN."""
    codes = np.arange(128)
    exponent, mantissa = codes >> 3, codes & 7
    normal = (1 + mantissa / 8) * np.exp2(exponent - 7.0)
    subnormal = mantissa / 8 * 2.0**-6
    values = np.where(exponent == 0, subnormal, normal)
    values[NAN_CODE] = np.nan
    return values


_VALUES = _code_values()
_FINITE = _VALUES[:NAN_CODE]  # ascending: codes 0..126


def encode_e4m3(x: npt.ArrayLike) -> npt.NDArray[np.uint8]:
    """The e4m3 codes nearest to `x` (ties to the even code), saturating at +-448; NaN gives
    0x7F (0xFF if negative)."""
    values = np.asarray(x, dtype=np.float64)
    magnitude = np.minimum(np.abs(values), E4M3_MAX)
    upper = np.clip(np.searchsorted(_FINITE, magnitude), 1, NAN_CODE - 1)
    lower = upper - 1
    below, above = magnitude - _FINITE[lower], _FINITE[upper] - magnitude
    # Nearest; on a tie the even code (its last mantissa bit clear).
    take_upper = (above < below) | ((above == below) & (upper % 2 == 0))
    codes = np.where(take_upper, upper, lower).astype(np.uint8)
    codes = np.where(np.isnan(values), NAN_CODE, codes).astype(np.uint8)
    return np.where(np.signbit(values), codes | 0x80, codes).astype(np.uint8)


def decode_e4m3(codes: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """The values of e4m3 codes (uint8)."""
    raw = np.asarray(codes)
    if raw.dtype != np.uint8:
        raise TypeError(f"e4m3 codes are uint8, got {raw.dtype}")
    magnitude = _VALUES[raw & 0x7F]
    return np.where(raw & 0x80, -magnitude, magnitude)


def round_e4m3(x: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """`x` rounded to e4m3 values (decode_e4m3(encode_e4m3(x)))."""
    return decode_e4m3(encode_e4m3(x))


def tensor_scale(x: npt.ArrayLike) -> float:
    """amax / 448: the scale that maps the largest magnitude of `x` to e4m3's largest value
    (1.0 for an all-zero tensor, so dequantizing stays exact)."""
    amax = float(np.max(np.abs(np.asarray(x, dtype=np.float64)), initial=0.0))
    if not np.isfinite(amax):
        raise ValueError("a tensor scale needs finite values; the tensor holds inf or NaN")
    return amax / E4M3_MAX if amax > 0 else 1.0


def block_scales(x: npt.ArrayLike, rows: int, axis: int = -2) -> npt.NDArray[np.float64]:
    """One tensor_scale per block of `rows` consecutive rows along `axis` (the last block may
    be shorter): shaped like `x` with `axis` of length ceil(n / rows) and the other axes that
    follow it reduced away (per-head blocks of [batch, heads, seqlen, hdim] with axis -2
    give [batch, heads, blocks])."""
    values = np.asarray(x, dtype=np.float64)
    if rows < 1:
        raise ValueError(f"rows is {rows}; a block holds at least one row")
    axis = axis % values.ndim
    n = values.shape[axis]
    starts = np.arange(0, n, rows)
    later = tuple(range(axis + 1, values.ndim))
    magnitude = np.abs(values).max(axis=later) if later else np.abs(values)
    amax = np.maximum.reduceat(magnitude, starts, axis=axis) if n else magnitude
    if not np.all(np.isfinite(amax)):
        raise ValueError("block scales need finite values; the tensor holds inf or NaN")
    return np.where(amax > 0, amax / E4M3_MAX, 1.0)


def expand_block_scales(scales: npt.ArrayLike, rows: int, length: int,
                        axis: int = -1) -> npt.NDArray[np.float64]:  # fmt: skip
    """Per-row scales from per-block ones: each block's scale repeated over its `rows` rows,
    cut to `length` rows along `axis`."""
    repeated = np.repeat(np.asarray(scales, dtype=np.float64), rows, axis=axis)
    return np.take(repeated, np.arange(length), axis=axis)


def quantize(x: npt.ArrayLike, scale: npt.ArrayLike) -> npt.NDArray[np.uint8]:
    """The e4m3 codes of x / scale (`scale` broadcasts against `x`)."""
    return encode_e4m3(np.asarray(x, dtype=np.float64) / np.asarray(scale, dtype=np.float64))


def dequantize(codes: npt.ArrayLike, scale: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """code * scale in float64: the values an fp8 kernel computes with."""
    return decode_e4m3(codes) * np.asarray(scale, dtype=np.float64)
