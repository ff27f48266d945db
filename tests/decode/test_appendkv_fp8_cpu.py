"""Appending into fp8 (e4m3) KV caches without a GPU: the Python layer's argument errors (stand-in
device arrays: every check runs before the device is touched), kernel selection where no kernel
writes fp8, the torch op's schema, and the reference's codes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import ckfmha
from ckfmha import _dtypes, errors, first_use
from ckfmha.fp8 import decode_e4m3, encode_e4m3
from ckfmha.fp8_kv import KV_QUANT_FP8_E4M3, KV_QUANT_NONE, append_quant_of
from ckfmha.reference_appendkv import (
    append_kv_reference,
    quantize_row,
    rope_tables,
    rotate,
    round_to_dtype,
)

no_gpu = pytest.mark.skipif(ckfmha.device_count() > 0, reason="checks behaviour without a GPU")

FP8 = "fp8_e4m3"
FAKE = 1 << 20
CACHE = (2, 64, 4, 128)  # [batch, max_seqlen, nhead_k, hdim]: 4 K/V heads
NEW = (2, 3, 4, 128)


def _device(shape: tuple[int, ...], dtype: str = "fp16", slot: int = 0, device: int = 0) -> Any:
    """A stand-in device array; each slot is 16 MiB apart, so that only chosen ones overlap."""
    return ckfmha.device_ptr(FAKE + (slot << 24), shape, dtype, device=device)


def _scales(count: int, dtype: str = "fp32", device: int = 0) -> dict[str, Any]:
    return {"k_scale": _device((count,), dtype, 10, device),
            "v_scale": _device((count,), dtype, 11, device)}  # fmt: skip


def _call(**changes: Any) -> Any:
    """append_kv into fp8 caches (bf16 tokens) with the arrays and options changed."""
    arrays: dict[str, Any] = {
        "k_cache": _device(CACHE, FP8, 1),
        "v_cache": _device(CACHE, FP8, 2),
        "k_new": _device(NEW, "bf16", 3),
        "v_new": _device(NEW, "bf16", 4),
        "cache_seqlens": _device((2,), "int32", 5),
    }
    arrays.update(changes)
    positional = [arrays.pop(name) for name in ("k_cache", "v_cache", "k_new", "v_new",
                                                 "cache_seqlens")]  # fmt: skip
    return ckfmha.append_kv(*positional, **arrays)


_PAGED = {
    "k_cache": _device((40, 16, 4, 128), FP8, 1),
    "v_cache": _device((40, 16, 4, 128), FP8, 2),
    "block_table": _device((2, 20), "int32", 6),
}
_VECTORIZED = {
    "k_cache": _device((40, 4, 16, 16, 8), FP8, 1),
    "v_cache": _device((40, 4, 128, 16), FP8, 2),
    "block_table": _device((2, 20), "int32", 6),
    "page_layout": "vectorized",
}


# ---- argument errors ----


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {
                "k_cache": _device(CACHE, "bf16", 1),
                "v_cache": _device(CACHE, "bf16", 2),
                "k_scale": 2.0,
            },
            r"k_scale/v_scale are given, but k_cache and v_cache are bf16",
        ),
        (
            {
                "k_cache": _device(CACHE, "bf16", 1),
                "v_cache": _device(CACHE, "bf16", 2),
                **_scales(4),
            },
            r"k_scale/v_scale are given, but k_cache and v_cache are bf16",
        ),
        ({"v_cache": _device(CACHE, "bf16", 2)}, r"k_cache is fp8_e4m3 but v_cache is bf16"),
        ({"k_cache": _device(CACHE, "bf16", 1)}, r"k_cache is bf16 but v_cache is fp8_e4m3"),
        (
            {"k_new": _device(NEW, FP8, 3)},
            r"k_new is fp8_e4m3, but the new tokens come in fp16 or bf16",
        ),
        ({"v_new": _device(NEW, "uint8", 4)}, r"v_new is uint8, but the new tokens come in"),
        (
            {"k_cache": _device(CACHE, "uint8", 1), "v_cache": _device(CACHE, "uint8", 2)},
            r"k_cache is uint8: .*kv_dtype='fp8_e4m3'",
        ),
        (
            {"k_new": _device(NEW, "fp32", 3), "v_new": _device(NEW, "fp32", 4)},
            r"fp8 caches take k_new and v_new both fp16 or both bf16, got fp32 and fp32",
        ),
        (
            {"v_new": _device(NEW, "fp16", 4)},
            r"fp8 caches take k_new and v_new both fp16 or both bf16, got bf16 and fp16",
        ),
        (_VECTORIZED, r"fp8 caches are written in linear pages only"),
        ({"k_scale": -1.0}, r"k_scale is -1.0.*positive and finite"),
        ({"v_scale": float("nan")}, r"v_scale is nan.*positive and finite"),
        ({"k_scale": 0.0}, r"positive and finite"),
        ({"k_scale": 1e-300}, r"outside the positive normal fp32 range"),
        ({"k_scale": "2"}, r"k_scale must be a float, or an fp32 array"),
        ({"k_scale": True}, r"k_scale must be a float, or an fp32 array"),
        (_scales(3), r"k_scale must hold 1 or nhead_k=4"),
        (
            {"k_scale": _device((2, 2), "fp32", 10), "v_scale": _device((4,), "fp32", 11)},
            r"k_scale must hold 1 or nhead_k=4",
        ),
        (
            {"k_scale": _device((1,), "fp32", 10), "v_scale": _device((4,), "fp32", 11)},
            r"k_scale has 1 values and v_scale 4: device scales are both one value or both",
        ),
        ({"k_scale": _device((4,), "fp32", 10)}, r"k_scale is an array and v_scale not given"),
        (
            {"k_scale": _device((4,), "fp32", 10), "v_scale": 2.0},
            r"k_scale is an array and v_scale a number",
        ),
        (
            {"k_scale": np.ones(4, np.float64), "v_scale": np.ones(4, np.float32)},
            r"k_scale: NumPy dtype float64 is not fp32",
        ),
        (_scales(4, device=1), r"k_scale is on cuda:1"),
        # A device scale inside the cache the append writes.
        (
            {
                "k_scale": ckfmha.device_ptr(FAKE + (1 << 24) + 64, (4,), "fp32"),
                "v_scale": _device((4,), "fp32", 11),
            },
            r"k_cache .*k_scale",
        ),
    ],
)
def test_append_kv_fp8_argument_errors(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=message):
        _call(**changes)


@no_gpu
@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"k_scale": 0.02, "v_scale": 3.5},
        {"k_scale": np.float32(0.25), "v_scale": 4},
        {
            "k_cache": _device(CACHE, "uint8", 1),
            "v_cache": _device(CACHE, "uint8", 2),
            "kv_dtype": "e4m3",
            "k_scale": 1.5,
        },
        _scales(1),
        _scales(4),
        {**_PAGED, **_scales(4)},
        {
            "cos": _device((200, 64), "fp32", 7),
            "sin": _device((200, 64), "fp32", 8),
            "q": _device((2, 3, 8, 128), "bf16", 9),
            "k_scale": 0.5,
            "v_scale": 0.5,
        },
        {
            "cos": _device((200, 32), "bf16", 7),
            "sin": _device((200, 32), "bf16", 8),
            "rotary_interleaved": True,
            **_PAGED,
        },
    ],
)
def test_well_formed_fp8_appends_reach_the_device(changes: dict[str, Any]) -> None:
    with pytest.raises(errors.NoDeviceError):
        _call(**changes)


def test_append_quant_of_pairs_tokens_and_caches() -> None:
    bf16, fp16, fp32, fp8 = _dtypes.BF16, _dtypes.FP16, _dtypes.FP32, _dtypes.FP8_E4M3
    plain = {"scales_given": False, "vectorized": False}
    assert append_quant_of(bf16, bf16, fp8, fp8, **plain) == KV_QUANT_FP8_E4M3
    assert append_quant_of(fp16, fp16, fp8, fp8, scales_given=True,
                           vectorized=False) == KV_QUANT_FP8_E4M3  # fmt: skip
    assert append_quant_of(fp32, fp32, fp32, fp32, **plain) == KV_QUANT_NONE
    assert append_quant_of(fp16, fp16, fp16, fp16, vectorized=True,
                           scales_given=False) == KV_QUANT_NONE  # fmt: skip
    with pytest.raises(errors.InvalidArgumentError, match=r"must share one dtype .*fp16, bf16"):
        append_quant_of(fp16, fp16, fp16, bf16, **plain)


# ---- kernel selection and the torch op ----


def test_fp8_append_problems_select_no_kernel_before_sm89() -> None:
    fields = {"dtype": "bf16", "batch": 2, "nhead_k": 4, "seqlen_new": 1, "hdim": 128,
              "kv_dtype": FP8}  # fmt: skip
    for arch in ("sm_80", "sm_86"):
        with pytest.raises(errors.UnsupportedError):
            ckfmha.select_append_kv(arch=arch, **fields)
        with pytest.raises(errors.UnsupportedError):
            ckfmha.select_append_kv(arch=arch, page_size=16, max_pages_per_seq=4, **fields)
    with pytest.raises(errors.InvalidArgumentError, match=r"kv_dtype is the caches' fp8 format"):
        ckfmha.select_append_kv(arch="sm_90a", **{**fields, "kv_dtype": "bf16"})


def test_fp8_appends_have_their_own_first_use_key() -> None:
    key = first_use.AppendKvKey(_dtypes.BF16, 128, 128, 2, True, KV_QUANT_FP8_E4M3)
    plain = first_use.AppendKvKey(_dtypes.BF16, 128, 128, 2, True)
    for arch in ("sm_89", "sm_90a"):
        (kernel,) = first_use.kernels_for(key, arch)
        assert kernel.signature.kv_quant == "e4m3" and kernel.signature.paged
        assert first_use.kernels_for(plain, arch)[0].signature.kv_quant == "none"
    assert first_use.kernels_for(key, "sm_80") == []


def test_torch_append_op_takes_fp8_caches_and_scales() -> None:
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    import ckfmha.torch

    schema = str(torch.ops.ckfmha.append_kv.default._schema)
    for argument in ("str? kv_dtype=None", "Tensor? k_scale=None", "Tensor? v_scale=None",
                     "float? k_scale_value=None", "float? v_scale_value=None"):  # fmt: skip
        assert argument in schema, schema
    with FakeTensorMode():
        cache = torch.empty(40, 16, 2, 128, dtype=torch.float8_e4m3fn)
        new = torch.empty(2, 1, 2, 128, dtype=torch.bfloat16)
        lengths = torch.empty(2, dtype=torch.int32)
        table = torch.empty(2, 20, dtype=torch.int32)
        assert ckfmha.torch.append_kv(cache, cache.clone(), new, new, lengths, block_table=table,
                                      k_scale=0.5, v_scale=0.25) is None  # fmt: skip
        scales = torch.empty(2, dtype=torch.float32)
        cos = torch.empty(64, 64, dtype=torch.float32)
        q = torch.empty(2, 1, 8, 128, dtype=torch.bfloat16)
        rotated = ckfmha.torch.append_kv(cache, cache.clone(), new, new, lengths, cos=cos,
                                         sin=cos, q=q, block_table=table, k_scale=scales,
                                         v_scale=scales)  # fmt: skip
        assert rotated is not None and rotated.shape == q.shape


# ---- the reference ----


def test_quantize_row_rounds_ties_to_even_and_saturates() -> None:
    # 1.0625 lies halfway between 1.0 (0x38) and 1.125 (0x39); 1.1875 between 0x39 and 1.25.
    row = np.array([[1.0625, 1.1875, -1.0625, 500.0, -1e6, 0.0, -0.0, 2.0**-10]])
    codes = quantize_row(row, 1.0, "bf16")
    np.testing.assert_array_equal(codes[0], [0x38, 0x3A, 0xB8, 0x7E, 0xFE, 0x00, 0x80, 0x00])
    # Per-head scales divide each head's row.
    rows = np.array([[3.0, 6.0], [3.0, 6.0]])
    np.testing.assert_array_equal(
        decode_e4m3(quantize_row(rows, [1.0, 3.0], "bf16")), [[3.0, 6.0], [1.0, 2.0]]
    )


def test_quantize_row_divides_in_fp32_after_rounding_to_the_dtype() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 64)) * 30
    scales = np.array([0.7, 1.3, 0.011, 5.0])
    for dtype in ("fp16", "bf16"):
        rounded = round_to_dtype(x, dtype).astype(np.float32)
        expected = encode_e4m3(rounded / scales.astype(np.float32)[:, None])
        np.testing.assert_array_equal(quantize_row(x, scales, dtype), expected)
    # Rounding to the dtype first matters: 1 + 2^-12 is 1 in bf16 and fp16, but with a scale
    # just under 1 the unrounded quotient crosses the tie between codes 0x38 and 0x39.
    tie = np.array([[1.0 + 2.0**-12]])
    assert quantize_row(tie, 1.0 / 1.0625, "fp16")[0, 0] == 0x38
    assert quantize_row(tie, 1.0, "bf16")[0, 0] == 0x38


def test_fp8_reference_writes_the_codes_of_the_plain_append() -> None:
    rng = np.random.default_rng(4)
    batch, capacity, heads, hdim, new = 2, 10, 2, 16, 3
    k_new = round_to_dtype(rng.standard_normal((batch, new, heads, hdim)), "bf16")
    v_new = round_to_dtype(rng.standard_normal((batch, new, heads, hdim)), "bf16")
    lengths = np.array([0, 6])
    cos, sin = rope_tables(16, 8)
    k_codes = rng.integers(0, 256, (batch, capacity, heads, hdim), dtype=np.uint8)
    v_codes = rng.integers(0, 256, (batch, capacity, heads, hdim), dtype=np.uint8)
    k_scale, v_scale = np.array([0.05, 0.2]), 0.125
    for interleaved in (False, True):
        result = append_kv_reference(k_codes, v_codes, k_new, v_new, lengths, cos=cos, sin=sin,
                                     rotary_interleaved=interleaved,
                                     fp8_scales=(k_scale, v_scale), dtype="bf16")  # fmt: skip
        assert result.k_cache.dtype == np.uint8 and not result.overflow
        for b, length in enumerate(lengths):
            rows = slice(length, length + new)
            keys = rotate(k_new[b], np.arange(length, length + new), cos, sin, interleaved)
            for t in range(new):
                np.testing.assert_array_equal(
                    result.k_cache[b, length + t], quantize_row(keys[t], k_scale, "bf16")
                )
                np.testing.assert_array_equal(
                    result.v_cache[b, length + t], quantize_row(v_new[b, t], v_scale, "bf16")
                )
            # Untouched slots keep their codes.
            untouched = np.ones(capacity, bool)
            untouched[rows] = False
            np.testing.assert_array_equal(result.k_cache[b, untouched], k_codes[b, untouched])
            np.testing.assert_array_equal(result.v_cache[b, untouched], v_codes[b, untouched])


def test_fp8_reference_pages_match_the_contiguous_cache() -> None:
    rng = np.random.default_rng(5)
    batch, heads, hdim, new = 2, 1, 8, 5
    k_new = rng.standard_normal((batch, new, heads, hdim))
    lengths = np.array([1, 4])
    table = np.array([[3, 0, 2], [1, 5, 4]])
    contiguous = append_kv_reference(np.zeros((batch, 12, heads, hdim), np.uint8),
                                     np.zeros((batch, 12, heads, hdim), np.uint8), k_new, k_new,
                                     lengths, fp8_scales=(0.5, 2.0), dtype="fp16")  # fmt: skip
    paged = append_kv_reference(np.zeros((6, 4, heads, hdim), np.uint8),
                                np.zeros((6, 4, heads, hdim), np.uint8), k_new, k_new, lengths,
                                block_table=table, fp8_scales=(0.5, 2.0),
                                dtype="fp16")  # fmt: skip
    np.testing.assert_array_equal(
        paged.k_cache[table].reshape(batch, 12, heads, hdim), contiguous.k_cache
    )
    np.testing.assert_array_equal(
        paged.v_cache[table].reshape(batch, 12, heads, hdim), contiguous.v_cache
    )
