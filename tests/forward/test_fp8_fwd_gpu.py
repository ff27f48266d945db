"""fp8 (e4m3) queries, keys and values on Hopper against the float64 reference run on the
dequantised inputs (``ckfmha.fp8.dequantize`` of the codes and the fp32 scales: the values the
kernel multiplies).

Covered: head dims 64, 128 and 256; GQA groups of 1, 4 and 8; 12, 24 and 40 query heads;
lengths 1, 17, 255, 1000 and 2049 with seqlen_q != seqlen_k both ways; no mask, causal (both
alignments) and windows; bhsd and bshd; fp16 and bf16 outputs; the LSE; batch and group
(varlen) mode; scales as numbers, one-value device arrays and per-head device arrays; uint8
codes with q_dtype/kv_dtype; rows with a few large values; a CUDA graph whose device scales
change between replays; the torch op. Outputs and LSEs are poisoned with NaN first; inputs are
fresh random values per case (never zeros).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from support.cuda_graphs import capture
from support.fp8_checks import check, check_varlen, mask_options, max_logit, poisoned
from support.gpu_compare import Inputs, torch_dtype
from support.outlier_rows import normal_with_outliers

import ckfmha
from ckfmha import fp8
from ckfmha.reference import attention_reference

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch") if ckfmha.device_count() > 0 else None

FP8_QUERY_ARCH = 90  # e4m3 x e4m3 wgmma: the sm_90a forward
hopper = pytest.mark.skipif(
    ckfmha.device_count() == 0 or ckfmha.device_arch() != FP8_QUERY_ARCH,
    reason=f"fp8 queries are served by the sm_{FP8_QUERY_ARCH}a forward",
)


@dataclass
class Quantized:
    """One tensor in e4m3 on the device and what it stands for."""

    codes: Any  # torch.float8_e4m3fn on the device
    values: np.ndarray  # float64: codes * scale, as the kernel sees them
    scales: np.ndarray  # fp32: one value, or one per head


def _quantize(x: np.ndarray, head_axis: int, per_head: bool) -> Quantized:
    """e4m3 codes of x with amax / 448 scales (one in all, or one per head), each scale
    rounded to the fp32 the kernel reads before the codes are made."""
    if per_head:
        others = tuple(a for a in range(x.ndim) if a != head_axis)
        scales = np.array([fp8.tensor_scale(h) for h in np.moveaxis(x, head_axis, 0)], np.float32)
        broadcast = np.expand_dims(scales.astype(np.float64), others)
    else:
        scales = np.array([fp8.tensor_scale(x)], np.float32)
        broadcast = np.float64(scales[0])
    codes = fp8.quantize(x, broadcast)
    on_device = torch.from_numpy(codes).view(torch.float8_e4m3fn).cuda()
    return Quantized(on_device, fp8.dequantize(codes, broadcast), scales)


def _scale_args(q: Quantized, k: Quantized, v: Quantized, kind: str) -> dict[str, Any]:
    """q_scale, k_scale, v_scale as "float" numbers, "array1" one-value device arrays, or
    "per_head" device arrays (nhead_q values for q, nhead_k for k and v)."""
    tensors = {"q_scale": q, "k_scale": k, "v_scale": v}
    if kind == "float":
        return {name: float(t.scales[0]) for name, t in tensors.items()}
    return {name: torch.from_numpy(t.scales).cuda() for name, t in tensors.items()}


# ---- batch mode ----

# (batch, sq, sk, (hq, hk), d, mask, out dtype, scales). Masks: "none", "causal" (top-left),
# "causal_br" (bottom-right), or a (left, right) window. Each case keeps batch * hq * sq * sk
# under ~2.5e7 so the float64 reference stays well under a second.
CASES: list[tuple[Any, ...]] = [
    (2, 255, 255, (12, 12), 64, "none", "bf16", "float"),
    (1, 1000, 1000, (12, 3), 128, "causal", "bf16", "float"),
    (2, 17, 2049, (40, 5), 128, "none", "fp16", "per_head"),
    (1, 2049, 255, (24, 3), 256, "causal_br", "bf16", "array1"),
    (3, 1, 1000, (12, 12), 256, "none", "bf16", "float"),
    (1, 1000, 17, (12, 3), 64, "causal", "fp16", "per_head"),
    (2, 255, 1000, (24, 24), 256, (100, 0), "bf16", "float"),
    (1, 1000, 2049, (8, 1), 128, (256, 256), "bf16", "array1"),
    (4, 1, 1, (12, 12), 128, "none", "fp16", "float"),
    (1, 17, 17, (24, 6), 256, "causal", "fp16", "per_head"),
    (1, 2049, 255, (40, 40), 64, "none", "bf16", "float"),
    (2, 255, 17, (40, 5), 64, "causal_br", "bf16", "per_head"),
    (1, 1000, 1000, (24, 3), 64, (-1, 0), "bf16", "float"),
    (2, 255, 2049, (12, 12), 128, "causal", "fp16", "array1"),
    (1, 1000, 255, (40, 10), 256, "none", "bf16", "float"),
    (2, 17, 1000, (24, 24), 128, (7, 33), "fp16", "float"),
    (1, 2049, 1000, (12, 12), 128, "causal_br", "bf16", "per_head"),
    (2, 1000, 255, (24, 6), 256, (-1, 17), "fp16", "float"),
    (1, 255, 255, (40, 5), 128, "none", "bf16", "array1"),
    (3, 17, 255, (12, 12), 64, "causal", "bf16", "float"),
]


@dataclass
class Run:
    """One batch-mode call: its outputs, the reference's, and the inputs."""

    out: Any
    lse: Any
    ref: np.ndarray
    ref_lse: np.ndarray
    q: Quantized
    k: Quantized
    v: Quantized
    options: dict[str, Any]
    logit: float  # max_logit of the inputs


def _run(case: tuple[Any, ...], index: int, *, outliers: bool = False) -> Run:
    batch, sq, sk, (hq, hk), d, mask, out_name, scales = case
    inputs = Inputs(zlib.crc32(repr((case, outliers)).encode()))
    layout = ["bhsd", "bshd"][index % 2]
    head_axis = 2 if layout == "bshd" else 1

    def shape(heads: int, seqlen: int) -> tuple[int, ...]:
        return (batch, seqlen, heads, d) if layout == "bshd" else (batch, heads, seqlen, d)

    per_head = scales == "per_head"
    q, k, v = (_quantize(normal_with_outliers(inputs, shape(h, n), outliers), head_axis, per_head)
               for h, n in ((hq, sq), (hk, sk), (hk, sk)))  # fmt: skip
    out_dtype = torch_dtype(out_name)
    out, lse = poisoned(shape(hq, sq), out_dtype), poisoned((batch, hq, sq), torch.float32)
    options = {"scale": 1.0 / math.sqrt(d) * (0.75 if index % 3 == 1 else 1.0),
               "layout": layout, **mask_options(mask)}  # fmt: skip
    ckfmha.fwd(q.codes, k.codes, v.codes, return_lse=True, out=out, lse_out=lse,
               out_dtype=out_name, **_scale_args(q, k, v, scales), **options)  # fmt: skip
    torch.cuda.synchronize()
    ref, ref_lse = attention_reference(q.values, k.values, v.values, **options)
    logit = max_logit(q.values, k.values, options["scale"], head_axis)
    return Run(out, lse, ref, ref_lse, q, k, v, options, logit)


@hopper
@pytest.mark.parametrize("index", range(len(CASES)))
def test_fp8_attention_matches_the_reference(index: int) -> None:
    run = _run(CASES[index], index)
    check(run.out, run.lse, run.ref, run.ref_lse, run.v.values, f"{CASES[index]}", run.logit)


@hopper
@pytest.mark.parametrize("index", [0, 2, 5, 10, 13])
def test_outlier_rows_match_the_reference(index: int) -> None:
    run = _run(CASES[index], index, outliers=True)
    check(
        run.out, run.lse, run.ref, run.ref_lse, run.v.values, f"outliers {CASES[index]}", run.logit
    )


@hopper
def test_output_dtype_defaults_to_bf16() -> None:
    run = _run(CASES[0], 0)
    again = ckfmha.fwd(run.q.codes, run.k.codes, run.v.codes, **_scale_args(
        run.q, run.k, run.v, "float"), **run.options)  # fmt: skip
    assert again.dtype == torch.bfloat16 and torch.equal(again, run.out)


@hopper
def test_uint8_codes_with_dtype_hints_give_the_same_output() -> None:
    index = 1
    run = _run(CASES[index], index)
    again = ckfmha.fwd(
        run.q.codes.view(torch.uint8),
        run.k.codes.view(torch.uint8),
        run.v.codes.view(torch.uint8),
        q_dtype="fp8_e4m3",
        kv_dtype="e4m3",
        out_dtype="bf16",
        **_scale_args(run.q, run.k, run.v, "float"),
        **run.options,
    )
    assert torch.equal(again, run.out)


def _times_per_head(values: np.ndarray, factors: np.ndarray, head_axis: int) -> np.ndarray:
    shape = [1] * values.ndim
    shape[head_axis] = factors.size
    return values * factors.astype(np.float64).reshape(shape)


@hopper
def test_device_scales_are_read_at_every_graph_replay() -> None:
    index = 2  # per-head scales, 40 query heads over 5 K/V heads
    run = _run(CASES[index], index)
    q_scale, k_scale, v_scale = (torch.from_numpy(t.scales).cuda() for t in (run.q, run.k, run.v))

    def launch() -> None:
        ckfmha.fwd(run.q.codes, run.k.codes, run.v.codes, return_lse=True, out=run.out,
                   lse_out=run.lse, out_dtype="fp16", q_scale=q_scale, k_scale=k_scale,
                   v_scale=v_scale, **run.options)  # fmt: skip

    graph = capture(launch)
    hq, hk = CASES[index][3]
    q_factors = np.linspace(0.5, 2.0, hq).astype(np.float32)
    k_factors = np.linspace(2.0, 0.25, hk).astype(np.float32)
    v_factors = k_factors[::-1].copy()
    q_scale.copy_(torch.from_numpy(run.q.scales * q_factors).cuda())
    k_scale.copy_(torch.from_numpy(run.k.scales * k_factors).cuda())
    v_scale.copy_(torch.from_numpy(run.v.scales * v_factors).cuda())
    run.out.fill_(float("nan"))
    run.lse.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    head_axis = 2 if run.options["layout"] == "bshd" else 1
    q_ref, k_ref, v_ref = (_times_per_head(t.values, f, head_axis) for t, f in (
        (run.q, q_factors), (run.k, k_factors), (run.v, v_factors)))  # fmt: skip
    ref, ref_lse = attention_reference(q_ref, k_ref, v_ref, **run.options)
    logit = max_logit(q_ref, k_ref, run.options["scale"], head_axis)
    check(run.out, run.lse, ref, ref_lse, v_ref, "scales changed before a replay", logit)


@hopper
def test_the_torch_op_reads_fp8_queries() -> None:
    import ckfmha.torch

    index = 3
    run = _run(CASES[index], index)
    with torch.no_grad():
        again, again_lse = ckfmha.torch.attention(
            run.q.codes, run.k.codes, run.v.codes, return_lse=True,
            **_scale_args(run.q, run.k, run.v, "array1"), **run.options)  # fmt: skip
    # Equal problems on an automatic plan: the same kernel, the same bits.
    assert again.dtype == torch.bfloat16
    assert torch.equal(again, run.out) and torch.equal(again_lse, run.lse)


# ---- group mode (varlen) ----

# (lengths_q, lengths_k, (hq, hk), d, mask, out dtype, scales); odd cases have outlier rows.
VARLEN_CASES: list[tuple[Any, ...]] = [
    ([17, 1000, 1, 255], [17, 1000, 1, 255], (12, 3), 128, "causal", "bf16", "float"),
    ([1, 255, 2049], [1000, 17, 300], (24, 24), 64, "causal_br", "fp16", "per_head"),
    ([255, 0, 17], [2049, 255, 17], (40, 5), 256, "none", "bf16", "array1"),
    ([1000, 17], [1000, 1000], (12, 12), 128, (64, 0), "bf16", "float"),
    ([2049], [255], (16, 2), 64, "none", "fp16", "per_head"),
    ([1, 1, 1], [255, 1000, 17], (40, 5), 128, "causal_br", "bf16", "float"),
    ([17] * 5, [17] * 5, (24, 3), 256, "causal", "fp16", "array1"),
]


@hopper
@pytest.mark.parametrize("index", range(len(VARLEN_CASES)))
def test_varlen_fp8_attention_matches_the_reference(index: int) -> None:
    lens_q, lens_k, (hq, hk), d, mask, out_name, scales = VARLEN_CASES[index]
    inputs = Inputs(zlib.crc32(repr(VARLEN_CASES[index]).encode()))
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    per_head = scales == "per_head"
    q, k, v = (_quantize(normal_with_outliers(inputs, (int(n), h, d), index % 2 == 1), 1, per_head)
               for h, n in ((hq, cu_q[-1]), (hk, cu_k[-1]), (hk, cu_k[-1])))  # fmt: skip
    check_varlen(
        (q.codes, k.codes, v.codes),
        (q.values, k.values, v.values),
        (cu_q, cu_k),
        d,
        mask,
        out_name,
        _scale_args(q, k, v, scales),
        f"varlen {VARLEN_CASES[index]}",
    )
