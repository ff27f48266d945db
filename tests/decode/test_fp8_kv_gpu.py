"""fp8 (e4m3) K/V on the GPU against the float64 reference run on the dequantised inputs (the
values the kernels compute with: ``ckfmha.fp8.dequantize`` of the codes and the fp32 scales).

Covered: contiguous decode and prefill-shaped queries (seqlen_q 1, 4, 37) in batch mode, GQA
groups of 1, 4 and 8, head dims 64 and 128, key counts 1, 63, 1000 and 4097, causal (both
alignments) and no mask, the LSE, forced one split, forced several and automatic plans, fp16
and bf16 queries, per-tensor scales as numbers, device scale arrays of one value and of one
per K/V head, uint8 codes with kv_dtype, rows with a few large values (scales from amax/448),
paged caches (vLLM block tables and SGLang kv_indptr, pages of 1, 16 and 64 keys, empty
sequences), batch prefill over fp8 pages, the serving wrapper, a CUDA graph whose device
scales change between replays, and the torch op. Outputs and LSEs are poisoned with NaN
first; inputs are fresh random values per case.

Where scales are powers of two, the dequantised K/V are exactly bf16 values, and the fp8 path
is compared with the same problem run on bf16 K/V too.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from support.cuda_graphs import capture
from support.gpu_compare import Inputs, compare, f64, torch_dtype
from support.outlier_rows import normal_with_outliers

import ckfmha
from ckfmha import fp8
from ckfmha.reference import attention_reference, paged_attention_reference

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch") if ckfmha.device_count() > 0 else None

FP8_ARCH = 89  # e4m3 -> fp16/bf16 conversion (cvt ... e4m3x2) starts with sm_89
fp8_device = pytest.mark.skipif(
    ckfmha.device_count() == 0 or ckfmha.device_arch() < FP8_ARCH,
    reason=f"fp8 K/V kernels need sm_{FP8_ARCH} or later",
)

# fp8 path vs the same problem on bf16 K/V holding the dequantised values exactly (power-of-two
# scales; amax / 448 scales give code * scale values bf16 cannot hold), both on the split-KV
# plan with the same split count. The fp8 kernel runs its products in fp16 (Q rescaled by a
# power of two, K/V widened exactly, P rounded to fp16's 11 bits) where the bf16 kernel rounds
# P to bf16's 8 bits, so the two differ by about the bf16 kernel's own P rounding: 2^-9 relative
# per probability, 1.5-3e-3 in relative L2 on these inputs (H100). The bound, 6e-3, is under
# one and a half bf16 ulps (2^-8 = 3.9e-3) and well under the 1.5e-2 either path may be off the
# float64 reference (gpu_compare.REL_L2_TOL), which both are also checked against.
VS_BF16_REL_L2 = 6e-3


@dataclass
class QuantizedKV:
    """e4m3 codes on the device and what they stand for."""

    k: Any  # torch.float8_e4m3fn, like the input values
    v: Any
    k_ref: np.ndarray  # float64: codes * scale, as the kernels see them
    v_ref: np.ndarray
    k_scales: np.ndarray  # fp32 values: one per K/V head, or one in all
    v_scales: np.ndarray


def _scale_for(x: np.ndarray, head_axis: int, per_head: bool, power_of_two: bool) -> np.ndarray:
    """amax / 448, per head or in all, as the fp32 value the kernels read (rounded up to a
    power of two with power_of_two, so no code saturates)."""
    axes = tuple(a for a in range(x.ndim) if a != head_axis) if per_head else None
    amax = np.abs(x).max(axis=axes)
    scale = np.where(amax > 0, amax / fp8.E4M3_MAX, 1.0)
    if power_of_two:
        scale = np.exp2(np.ceil(np.log2(scale)))
    return np.atleast_1d(scale.astype(np.float32))


def _quantized(inputs: Inputs, shape: tuple[int, ...], head_axis: int, per_head: bool,
               power_of_two: bool = False, outliers: bool = False) -> QuantizedKV:  # fmt: skip
    def one() -> tuple[Any, np.ndarray, np.ndarray]:
        x = normal_with_outliers(inputs, shape, outliers)
        scales = _scale_for(x, head_axis, per_head, power_of_two)
        broadcast = (
            np.float64(scales[0])
            if scales.size == 1
            else np.expand_dims(
                scales.astype(np.float64), tuple(a for a in range(x.ndim) if a != head_axis)
            )
        )
        codes = fp8.quantize(x, broadcast)
        on_device = torch.from_numpy(codes).view(torch.float8_e4m3fn).cuda()
        return on_device, fp8.dequantize(codes, broadcast), scales

    k, k_ref, k_scales = one()
    v, v_ref, v_scales = one()
    return QuantizedKV(k, v, k_ref, v_ref, k_scales, v_scales)


def _scale_args(kv: QuantizedKV, kind: str) -> dict[str, Any]:
    """k_scale / v_scale as ``kind``: "float" numbers, "array1" one-value device arrays, or
    "per_head" device arrays of nhead_k values."""
    if kind == "float":
        return {"k_scale": float(kv.k_scales[0]), "v_scale": float(kv.v_scales[0])}
    return {"k_scale": torch.from_numpy(kv.k_scales).cuda(),
            "v_scale": torch.from_numpy(kv.v_scales).cuda()}  # fmt: skip


def _poisoned(shape: tuple[int, ...], dtype: Any) -> Any:
    return torch.full(shape, float("nan"), device="cuda", dtype=dtype)


def _mask(causal: bool, index: int) -> dict[str, Any]:
    # Decode wants the last query on the last key (bottom-right); every third case checks the
    # other alignment too.
    if not causal:
        return {}
    return {"causal": True, "causal_alignment": "top_left" if index % 3 == 2 else "bottom_right"}


# ---- contiguous K/V ----

# (batch, sq, sk, (hq, hk), d, dtype, causal, num_splits, scales): decode rows and a 37-query
# chunk, GQA groups 1, 4 and 8, one key, key counts off the 64-key tile, sq > sk (causal rows
# with no key), forced one and several splits and automatic plans, the three kinds of scale.
CONTIGUOUS_CASES = [
    (2, 1, 1000, (8, 2), 128, "bf16", True, 0, "float"),
    (3, 1, 4097, (32, 8), 128, "bf16", False, 0, "per_head"),
    (1, 4, 63, (8, 8), 128, "fp16", True, 1, "array1"),
    (2, 4, 4097, (32, 4), 64, "bf16", True, 5, "float"),
    (2, 37, 1000, (8, 1), 128, "bf16", False, 3, "per_head"),
    (1, 1, 1, (4, 1), 64, "fp16", False, 0, "float"),
    (4, 1, 63, (64, 8), 64, "fp16", True, 2, "per_head"),
    (1, 4, 1, (8, 1), 128, "bf16", True, 1, "per_head"),
    (2, 37, 4097, (16, 2), 128, "fp16", True, 0, "array1"),
    (2, 1, 1000, (4, 4), 64, "bf16", False, 7, "array1"),
]


def _contiguous(case: tuple[Any, ...], index: int, *, power_of_two: bool = False,
                outliers: bool = False) -> tuple[Any, ...]:  # fmt: skip
    """Runs a case; returns (out, lse, reference out, reference lse, q, kv, options)."""
    batch, sq, sk, (hq, hk), d, dtype_name, causal, num_splits, scales = case
    inputs = Inputs(zlib.crc32(repr((case, power_of_two, outliers)).encode()))
    layout = ["bhsd", "bshd"][index % 2]
    dtype = torch_dtype(dtype_name)

    def shape(heads: int, seqlen: int) -> tuple[int, ...]:
        return (batch, seqlen, heads, d) if layout == "bshd" else (batch, heads, seqlen, d)

    q = inputs.normal(shape(hq, sq), dtype)
    kv = _quantized(inputs, shape(hk, sk), 2 if layout == "bshd" else 1, scales == "per_head",
                    power_of_two, outliers)  # fmt: skip
    out, lse = _poisoned(shape(hq, sq), dtype), _poisoned((batch, hq, sq), torch.float32)
    options = {"scale": 1.0 / math.sqrt(d) * (0.75 if index % 2 else 1.0), "layout": layout,
               "num_splits": num_splits, **_mask(causal, index)}  # fmt: skip
    ckfmha.fwd(q, kv.k, kv.v, return_lse=True, out=out, lse_out=lse, **_scale_args(kv, scales),
               **options)  # fmt: skip
    torch.cuda.synchronize()
    reference = {k: v for k, v in options.items() if k != "num_splits"}
    ref, ref_lse = attention_reference(f64(q), kv.k_ref, kv.v_ref, **reference)
    return out, lse, ref, ref_lse, q, kv, options


@fp8_device
@pytest.mark.parametrize("index", range(len(CONTIGUOUS_CASES)))
def test_fp8_kv_matches_the_reference(index: int) -> None:
    case = CONTIGUOUS_CASES[index]
    out, lse, ref, ref_lse, *_ = _contiguous(case, index)
    compare({"dtype": case[5]}, out, lse, ref, ref_lse, f"{case}")


@fp8_device
@pytest.mark.parametrize("index", [0, 3, 4, 6])
def test_outlier_rows_match_the_reference(index: int) -> None:
    case = CONTIGUOUS_CASES[index]
    out, lse, ref, ref_lse, _, kv, _ = _contiguous(case, index, outliers=True)
    # The output is as large as the largest values of V: brought back to the unit scale that
    # gpu_compare's absolute bounds were set for (a unit normal sample's largest value is ~4).
    # The LSE keeps its absolute bound.
    unit = max(1.0, float(np.abs(kv.v_ref).max()) / 4)
    compare({"dtype": case[5]}, out.double() / unit, lse, ref / unit, ref_lse, f"outliers {case}")


def _relative_l2(got: Any, want: Any) -> float:
    a, b = f64(got), f64(want)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@fp8_device
@pytest.mark.parametrize("index", [i for i, c in enumerate(CONTIGUOUS_CASES) if c[5] == "bf16"])
def test_fp8_kv_matches_bf16_kv_holding_the_same_values(index: int) -> None:
    # Both runs on one forced count of two splits or more: both run the split-KV plan (one
    # split, or an automatic plan, may run a one-stage kernel of other tiles for bf16 K/V).
    case = CONTIGUOUS_CASES[index]
    case = (*case[:7], max(case[7], 2), case[8])
    out, lse, ref, ref_lse, q, kv, options = _contiguous(case, index, power_of_two=True)
    compare({"dtype": "bf16"}, out, lse, ref, ref_lse, f"power-of-two scales {case}")
    k16, v16 = (torch.from_numpy(x).to("cuda", torch.bfloat16) for x in (kv.k_ref, kv.v_ref))
    assert np.array_equal(f64(k16), kv.k_ref) and np.array_equal(f64(v16), kv.v_ref)
    bf16_out, bf16_lse = ckfmha.fwd(q, k16, v16, return_lse=True, **options)
    rel = _relative_l2(out, bf16_out)
    assert rel < VS_BF16_REL_L2, f"fp8 vs bf16 K/V: relative L2 {rel:.2e} ({case})"
    finite = np.isfinite(f64(bf16_lse))
    np.testing.assert_array_equal(np.isfinite(f64(lse)), finite)
    np.testing.assert_allclose(f64(lse)[finite], f64(bf16_lse)[finite], atol=1e-4, rtol=0)


@fp8_device
def test_uint8_codes_with_kv_dtype_give_the_same_output() -> None:
    case = CONTIGUOUS_CASES[0]
    out, _, _, _, q, kv, options = _contiguous(case, 0)
    again = ckfmha.fwd(
        q,
        kv.k.view(torch.uint8),
        kv.v.view(torch.uint8),
        kv_dtype="e4m3",
        k_scale=float(kv.k_scales[0]),
        v_scale=float(kv.v_scales[0]),
        **options,
    )
    assert torch.equal(again, out)


@fp8_device
def test_device_scales_are_read_at_every_graph_replay() -> None:
    case = (2, 1, 1000, (32, 8), 128, "bf16", True, 3, "per_head")
    out, lse, ref, ref_lse, q, kv, options = _contiguous(case, 0)
    k_scale, v_scale = (torch.from_numpy(s).cuda() for s in (kv.k_scales, kv.v_scales))

    def run() -> None:
        ckfmha.fwd(q, kv.k, kv.v, return_lse=True, out=out, lse_out=lse, k_scale=k_scale,
                   v_scale=v_scale, **options)  # fmt: skip

    graph = capture(run)
    factors = np.linspace(0.5, 2.0, 8).astype(np.float32)
    k_scale.copy_(torch.from_numpy(kv.k_scales * factors).cuda())
    v_scale.copy_(torch.from_numpy(kv.v_scales * factors[::-1].copy()).cuda())
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    heads = (1, 8, 1, 1)
    k_ref = kv.k_ref * (factors.astype(np.float64)).reshape(heads)
    v_ref = kv.v_ref * (factors[::-1].astype(np.float64)).reshape(heads)
    reference = {k: v for k, v in options.items() if k != "num_splits"}
    ref, ref_lse = attention_reference(f64(q), k_ref, v_ref, **reference)
    compare({"dtype": "bf16"}, out, lse, ref, ref_lse, "scales changed before a replay")


@fp8_device
def test_the_torch_op_reads_fp8_kv() -> None:
    import ckfmha.torch

    case = CONTIGUOUS_CASES[1]
    out, lse, *_, q, kv, options = _contiguous(case, 1)
    with torch.no_grad():
        again, again_lse = ckfmha.torch.attention(
            q, kv.k, kv.v, layout=options["layout"], scale=options["scale"], return_lse=True,
            k_scale=torch.from_numpy(kv.k_scales).cuda(),
            v_scale=torch.from_numpy(kv.v_scales).cuda())  # fmt: skip
    # Automatic plans on equal problems: the same kernels, the same bits.
    assert torch.equal(again, out) and torch.equal(again_lse, lse)


# ---- paged caches ----


@dataclass
class Pages:
    """Where each sequence's keys live: page ids in key order, as a vLLM block table and as
    SGLang's kv_indices + kv_indptr."""

    lens_k: np.ndarray
    num_pages: int
    block_table: np.ndarray
    kv_indices: np.ndarray
    kv_indptr: np.ndarray

    def args(self, table: str) -> dict[str, Any]:
        lens = torch.from_numpy(self.lens_k).cuda()
        if table == "block_table":
            return {"block_table": torch.from_numpy(self.block_table).cuda(), "seqlens_k": lens}
        return {
            "kv_indices": torch.from_numpy(self.kv_indices).cuda(),
            "kv_indptr": torch.from_numpy(self.kv_indptr).cuda(),
            "seqlens_k": lens,
        }

    def reference_args(self, table: str) -> dict[str, Any]:
        if table == "block_table":
            return {"block_table": self.block_table, "seqlens_k": self.lens_k}
        return {
            "kv_indices": self.kv_indices,
            "kv_indptr": self.kv_indptr,
            "seqlens_k": self.lens_k,
        }


def _pages(lens_k: list[int], page_size: int, seed: int) -> Pages:
    """Pages handed out in a random order, with spare pages no sequence owns."""
    counts = [-(-n // page_size) for n in lens_k]
    num_pages = sum(counts) + 3
    ids = np.random.default_rng(seed).permutation(num_pages).astype(np.int32)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    table = np.zeros((len(lens_k), max(counts + [1])), dtype=np.int32)
    for b, count in enumerate(counts):
        table[b, :count] = ids[starts[b] : starts[b] + count]
    return Pages(np.asarray(lens_k, np.int32), num_pages, table, ids[: starts[-1]].copy(), starts)


# (page_size, table, lens_k, sq, (hq, hk), d, dtype, causal, num_splits, scales)
PAGED_CASES = [
    (1, "block_table", [63, 1, 1000], 1, (8, 2), 128, "bf16", True, 0, "float"),
    (16, "kv_indptr", [4097, 0, 37], 4, (32, 4), 128, "bf16", True, 3, "per_head"),
    (64, "block_table", [1000, 63], 1, (8, 1), 64, "fp16", False, 1, "array1"),
    (16, "block_table", [1, 4097], 2, (16, 16), 128, "fp16", True, 0, "per_head"),
    (64, "kv_indptr", [200, 129, 5], 1, (32, 8), 64, "bf16", False, 7, "float"),
]


@fp8_device
@pytest.mark.parametrize("index", range(len(PAGED_CASES)))
def test_fp8_pages_match_the_reference(index: int) -> None:
    case = PAGED_CASES[index]
    page_size, table, lens_k, sq, (hq, hk), d, dtype_name, causal, num_splits, scales = case
    inputs = Inputs(zlib.crc32(repr(case).encode()))
    pages = _pages(lens_k, page_size, index)
    dtype = torch_dtype(dtype_name)
    kv = _quantized(inputs, (pages.num_pages, page_size, hk, d), 2, scales == "per_head")
    batch = len(lens_k)
    q = inputs.normal((batch, hq, sq, d), dtype)
    out, lse = _poisoned(q.shape, dtype), _poisoned((batch, hq, sq), torch.float32)
    mask = _mask(causal, index)
    ckfmha.fwd_paged(q, kv.k, kv.v, **pages.args(table), return_lse=True, out=out, lse_out=lse,
                     num_splits=num_splits, **_scale_args(kv, scales), **mask)  # fmt: skip
    torch.cuda.synchronize()
    ref, ref_lse = paged_attention_reference(
        f64(q), kv.k_ref, kv.v_ref, **pages.reference_args(table), **mask
    )
    compare({"dtype": dtype_name}, out, lse, ref, ref_lse, f"paged {case}")


@fp8_device
def test_batch_prefill_over_fp8_pages() -> None:
    lens_q, lens_k, hq, hk, d = [0, 1, 8, 37], [5, 1, 2000, 300], 8, 2, 128
    inputs = Inputs(4099)
    pages = _pages(lens_k, 16, 7)
    kv = _quantized(inputs, (pages.num_pages, 16, hk, d), 2, per_head=True)
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    q = inputs.normal((int(cu_q[-1]), hq, d), torch.bfloat16)
    out, lse = _poisoned(q.shape, torch.bfloat16), _poisoned((hq, int(cu_q[-1])), torch.float32)
    mask = {"causal": True, "causal_alignment": "bottom_right"}
    ckfmha.fwd_paged(q, kv.k, kv.v, **pages.args("kv_indptr"), cu_seqlens_q=torch.from_numpy(
        cu_q).cuda(), max_seqlen_q=max(lens_q), return_lse=True, out=out, lse_out=lse,
        **_scale_args(kv, "per_head"), **mask)  # fmt: skip
    torch.cuda.synchronize()
    ref, ref_lse = paged_attention_reference(
        f64(q), kv.k_ref, kv.v_ref, cu_seqlens_q=cu_q, **pages.reference_args("kv_indptr"), **mask
    )
    compare({"dtype": "bf16"}, out, lse, ref, ref_lse, "batch prefill over fp8 pages")


@fp8_device
def test_serving_decode_plans_and_runs_fp8_caches() -> None:
    from ckfmha.serving import BatchDecode

    lens_k, hq, hk, d, page_size = [300, 4097, 1], 32, 8, 128, 16
    inputs = Inputs(8191)
    pages = _pages(lens_k, page_size, 3)
    kv = _quantized(inputs, (pages.num_pages, page_size, hk, d), 2, per_head=True)
    decode = BatchDecode(max_batch=4, max_pages=pages.num_pages, max_seqlen_k=8192)
    decode.plan(
        block_table=pages.block_table,
        seqlens_k=pages.lens_k,
        nhead_q=hq,
        nhead_k=hk,
        head_dim=d,
        page_size=page_size,
        dtype="bf16",
        kv_dtype="fp8_e4m3",
    )
    q = inputs.normal((3, hq, 1, d), torch.bfloat16)
    out, lse = _poisoned(q.shape, torch.bfloat16), _poisoned((3, hq, 1), torch.float32)
    decode.run(q, kv.k, kv.v, out=out, lse_out=lse, **_scale_args(kv, "per_head"))
    torch.cuda.synchronize()
    ref, ref_lse = paged_attention_reference(
        f64(q),
        kv.k_ref,
        kv.v_ref,
        **pages.reference_args("block_table"),
        causal=True,
        causal_alignment="bottom_right",
    )
    compare({"dtype": "bf16"}, out, lse, ref, ref_lse, "BatchDecode over fp8 caches")
    bf16_cache = torch.zeros(kv.k.shape, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ckfmha.InvalidArgumentError, match=r"the plan is for fp8_e4m3 caches"):
        decode.run(q, bf16_cache, bf16_cache, out=out, lse_out=lse)


# ---- archs without fp8 kernels ----


@pytest.mark.skipif(ckfmha.device_count() == 0 or ckfmha.device_arch() >= FP8_ARCH,
                    reason=f"checks a GPU older than sm_{FP8_ARCH}")  # fmt: skip
def test_older_gpus_say_fp8_kv_is_unsupported() -> None:
    q = torch.zeros((1, 8, 1, 128), device="cuda", dtype=torch.bfloat16)
    k = torch.zeros((1, 2, 64, 128), device="cuda", dtype=torch.float8_e4m3fn)
    with pytest.raises(ckfmha.UnsupportedError, match=r"fp8"):
        ckfmha.fwd(q, k, k, k_scale=0.5)
