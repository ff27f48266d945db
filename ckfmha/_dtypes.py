"""Element types ckfmha understands, and how other libraries spell them."""

from __future__ import annotations

from typing import Any

import numpy as np

# Values of the C enum ckfmha_dtype.
FP16 = 0
BF16 = 1
FP32 = 2
# Auxiliary arrays only (cu_seqlens offsets, dropout random bytes); not C dtypes.
INT32 = 3
UINT8 = 4
# K/V caches of one-byte e4m3 values (float8_e4m3fn): not a C dtype either. It becomes the
# problem's kv_quant (CKFMHA_KV_QUANT_FP8_E4M3); q and o keep problem.dtype.
FP8_E4M3 = 5

NAMES = {FP16: "fp16", BF16: "bf16", FP32: "fp32", INT32: "int32", UINT8: "uint8",
         FP8_E4M3: "fp8_e4m3"}  # fmt: skip
ITEMSIZE = {FP16: 2, BF16: 2, FP32: 4, INT32: 4, UINT8: 1, FP8_E4M3: 1}

_ALIASES = {
    "fp16": FP16,
    "float16": FP16,
    "half": FP16,
    "f2": FP16,
    "bf16": BF16,
    "bfloat16": BF16,
    "fp32": FP32,
    "float32": FP32,
    "float": FP32,
    "f4": FP32,
    "int32": INT32,
    "i4": INT32,
    "uint8": UINT8,
    "u1": UINT8,
    "fp8_e4m3": FP8_E4M3,
    "e4m3": FP8_E4M3,
    "float8_e4m3fn": FP8_E4M3,  # torch and ml_dtypes spell it so
    "e4m3fn": FP8_E4M3,
}


def dtype_code(dtype: Any) -> int:
    """The ckfmha_dtype of a name ("bf16"), a NumPy dtype, or a framework dtype object.

    Framework dtypes (torch.bfloat16, jnp.float16...) are recognised by name so
    that no framework has to be imported here.
    """
    if isinstance(dtype, int) and not isinstance(dtype, bool) and dtype in NAMES:
        return dtype
    if isinstance(dtype, str):
        key = dtype.lower().removeprefix("torch.").lstrip("<=|")
    else:
        try:
            key = np.dtype(dtype).name
        except TypeError:
            key = str(dtype).lower().removeprefix("torch.")
    if key not in _ALIASES:
        from ckfmha.errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"unsupported dtype {dtype!r}: ckfmha takes fp16, bf16 or fp32 (K/V also fp8_e4m3)", 1
        )
    return _ALIASES[key]


def float8_e4m3_numpy_dtype() -> np.dtype | None:
    """NumPy has no fp8 either; ml_dtypes.float8_e4m3fn when ml_dtypes is installed."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.float8_e4m3fn)


def bfloat16_numpy_dtype() -> np.dtype | None:
    """NumPy has no bfloat16; ml_dtypes provides one when it is installed."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


def numpy_dtype(code: int) -> np.dtype:
    """The NumPy dtype holding elements of ``code`` (bf16 needs ml_dtypes; e4m3 comes back as
    ml_dtypes.float8_e4m3fn, or as its uint8 codes without ml_dtypes)."""
    if code == FP16:
        return np.dtype(np.float16)
    if code == FP32:
        return np.dtype(np.float32)
    if code == INT32:
        return np.dtype(np.int32)
    if code == UINT8:
        return np.dtype(np.uint8)
    if code == FP8_E4M3:
        e4m3 = float8_e4m3_numpy_dtype()
        return np.dtype(np.uint8) if e4m3 is None else e4m3
    bf16 = bfloat16_numpy_dtype()
    if bf16 is None:
        from ckfmha.errors import InvalidArgumentError

        raise InvalidArgumentError(
            "bf16 host arrays need the ml_dtypes package (NumPy has no bfloat16)", 1
        )
    return bf16


def typestr(code: int) -> str:
    """__cuda_array_interface__ typestr; bf16 has no letter there so it is a 2-byte void, and
    e4m3 travels as its uint8 codes (what CAI consumers can hold)."""
    return {FP16: "<f2", BF16: "<V2", FP32: "<f4", INT32: "<i4", UINT8: "|u1",
            FP8_E4M3: "|u1"}[code]  # fmt: skip
