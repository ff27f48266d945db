"""fp8 (e4m3) attention with per-block scales (one fp32 scale per 128 tokens of each head, for
q, k and v) on Hopper, against the float64 reference run on the dequantised inputs.

Every input's 128-token blocks are first multiplied by their own power of two (2^-2 .. 2^2), so
neighbouring blocks' scales differ by up to 16x and a scale read for the wrong block, head or
sequence moves the output far outside the bounds. Covered: head dims 64 (its 192-row tiles
included), 128 and 256 (64-key tiles, two to a block); GQA groups of 1, 3, 4, 5 and 8; 8 to
40 query heads; lengths 1, 17, 255, 1000, 1500 and 2049, seqlen_q != seqlen_k both ways; no
mask, causal (both alignments) and a window; bhsd and bshd; fp16 and bf16 outputs; batch and
group (varlen) mode with sequences not starting at multiples of 128; rows with outliers; the
torch op; and that uniform block scales agree with per-tensor scales. Outputs and
LSEs are NaN-poisoned first; inputs are fresh random values per case.
"""

from __future__ import annotations

import itertools
import math
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from support.fp8_blocks import (
    BLOCK,
    blocks,
    dequantize_e4m3_blocks,
    dequantize_e4m3_blocks_varlen,
    quantize_e4m3_blocks,
    quantize_e4m3_blocks_varlen,
)
from support.fp8_checks import check, check_varlen, mask_options, max_logit, poisoned
from support.gpu_compare import Inputs, torch_dtype
from support.outlier_rows import normal_with_outliers

import ckfmha
from ckfmha import fp8
from ckfmha.reference import attention_reference

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch") if ckfmha.device_count() > 0 else None

FP8_QUERY_ARCH = 90
hopper = pytest.mark.skipif(
    ckfmha.device_count() == 0 or ckfmha.device_arch() != FP8_QUERY_ARCH,
    reason=f"fp8 queries are served by the sm_{FP8_QUERY_ARCH}a forward",
)

BLOCK_FACTOR_LOG2 = 2  # each block of an input is scaled by 2^u, u uniform in [-2, 2]


def _blockwise(x: np.ndarray, seq_axis: int, rng: np.random.Generator) -> np.ndarray:
    """x with every BLOCK tokens along seq_axis (per batch entry and head) times its own
    power of two."""
    moved = np.moveaxis(x, seq_axis, -2)
    factors = 2.0 ** rng.uniform(
        -BLOCK_FACTOR_LOG2, BLOCK_FACTOR_LOG2, (*moved.shape[:-2], blocks(moved.shape[-2]))
    )
    per_token = fp8.expand_block_scales(factors, BLOCK, moved.shape[-2], axis=-1)[..., None]
    return np.moveaxis(moved * per_token, -2, seq_axis)


@dataclass
class BlockQuantized:
    """One tensor in e4m3 on the device with its per-block scales, and what it stands for."""

    codes: Any  # torch.float8_e4m3fn on the device, in the call's layout
    values: np.ndarray  # float64 codes * scales, in the call's layout
    scales: Any  # torch fp32 on the device: [batch, heads, blocks]


def _to_device(codes: np.ndarray) -> Any:
    return torch.from_numpy(np.ascontiguousarray(codes)).view(torch.float8_e4m3fn).cuda()


def _quantize_bhsd(x: np.ndarray, layout: str) -> BlockQuantized:
    """x [batch, heads, seqlen, d] per block, handed over in ``layout``."""
    codes, scales = quantize_e4m3_blocks(x)
    values = dequantize_e4m3_blocks(codes, scales)
    if layout == "bshd":
        codes, values = codes.transpose(0, 2, 1, 3), values.transpose(0, 2, 1, 3)
    return BlockQuantized(_to_device(codes), np.ascontiguousarray(values),
                          torch.from_numpy(scales).cuda())  # fmt: skip


def _block_scales(q: BlockQuantized, k: BlockQuantized, v: BlockQuantized) -> dict[str, Any]:
    return {"q_scale": q.scales, "k_scale": k.scales, "v_scale": v.scales}


# ---- batch mode ----

# (batch, sq, sk, (hq, hk), d, mask, out dtype); each keeps batch * hq * sq * sk near or under
# 2.5e7 so the float64 reference stays fast.
CASES: list[tuple[Any, ...]] = [
    (2, 1000, 1000, (12, 3), 64, "none", "bf16"),  # 192-row tiles past the last block
    (1, 1500, 1500, (12, 3), 64, "causal", "fp16"),
    (2, 255, 1000, (40, 5), 128, "none", "bf16"),
    (1, 1000, 2049, (12, 12), 128, "causal_br", "bf16"),
    (1, 17, 1000, (8, 1), 256, "none", "bf16"),  # 64-key tiles, two to a block
    (2, 1000, 255, (24, 6), 256, "causal", "fp16"),
    (1, 1000, 1000, (12, 3), 128, (100, 0), "bf16"),
    (3, 1, 255, (12, 12), 64, "none", "bf16"),
    (1, 2049, 17, (40, 40), 128, "none", "fp16"),
    (2, 255, 255, (24, 3), 256, (-1, 17), "bf16"),
]


@dataclass
class Run:
    """One batch-mode call: its outputs, the reference's, and the inputs."""

    out: Any
    lse: Any
    q: BlockQuantized
    k: BlockQuantized
    v: BlockQuantized
    options: dict[str, Any]
    out_name: str


def _run(case: tuple[Any, ...], index: int, *, outliers: bool = False) -> Run:
    batch, sq, sk, (hq, hk), d, mask, out_name = case
    inputs = Inputs(zlib.crc32(repr(("blocks", case, outliers)).encode()))
    rng = np.random.default_rng(inputs.integer(2**31))
    layout = ["bhsd", "bshd"][index % 2]
    q, k, v = (
        _quantize_bhsd(_blockwise(normal_with_outliers(inputs, (batch, h, n, d), outliers), 2,
                                  rng), layout)
        for h, n in ((hq, sq), (hk, sk), (hk, sk))
    )  # fmt: skip
    shape = (batch, sq, hq, d) if layout == "bshd" else (batch, hq, sq, d)
    out, lse = poisoned(shape, torch_dtype(out_name)), poisoned((batch, hq, sq), torch.float32)
    options = {"scale": 1.0 / math.sqrt(d), "layout": layout, **mask_options(mask)}
    ckfmha.fwd(q.codes, k.codes, v.codes, return_lse=True, out=out, lse_out=lse,
               out_dtype=out_name, **_block_scales(q, k, v), **options)  # fmt: skip
    torch.cuda.synchronize()
    return Run(out, lse, q, k, v, options, out_name)


def _check_run(run: Run, what: str) -> None:
    ref, ref_lse = attention_reference(run.q.values, run.k.values, run.v.values, **run.options)
    head_axis = 2 if run.options["layout"] == "bshd" else 1
    logit = max_logit(run.q.values, run.k.values, run.options["scale"], head_axis)
    check(run.out, run.lse, ref, ref_lse, run.v.values, what, logit)


@hopper
@pytest.mark.parametrize("index", range(len(CASES)))
def test_block_scales_match_the_reference(index: int) -> None:
    _check_run(_run(CASES[index], index), f"{CASES[index]}")


@hopper
@pytest.mark.parametrize("index", [0, 3, 4])
def test_block_scales_with_outlier_rows_match_the_reference(index: int) -> None:
    _check_run(_run(CASES[index], index, outliers=True), f"outliers {CASES[index]}")


# Uniform block scales against per-tensor scales: the same products, but the block kernel
# keeps row maxima in log2 units and tests the lazy maximum's slack on scaled values, so a
# row's maximum can move one tile earlier or later and round its e4m3 P differently. The
# outputs then agree to far inside the reference bounds, not bit for bit.
UNIFORM_REL_L2 = 2e-3
UNIFORM_LSE_ABS = 1e-4


@hopper
def test_uniform_block_scales_agree_with_per_tensor_scales() -> None:
    batch, sq, sk, (hq, hk), d = 2, 1000, 1000, (12, 3), 128
    inputs = Inputs(zlib.crc32(b"uniform block scales"))
    arrays = [normal_with_outliers(inputs, (batch, h, n, d), False)
              for h, n in ((hq, sq), (hk, sk), (hk, sk))]  # fmt: skip
    scales = [np.float32(fp8.tensor_scale(x)) for x in arrays]
    codes = [_to_device(fp8.quantize(x, np.float64(s))) for x, s in zip(arrays, scales)]
    options = {"causal": True, "return_lse": True}
    tensor_out, tensor_lse = ckfmha.fwd(*codes, q_scale=float(scales[0]), k_scale=float(scales[1]),
                                        v_scale=float(scales[2]), **options)  # fmt: skip
    block_scales = {
        name: torch.full((batch, heads, blocks(n)), float(s), device="cuda")
        for name, heads, n, s in (("q_scale", hq, sq, scales[0]), ("k_scale", hk, sk, scales[1]),
                                  ("v_scale", hk, sk, scales[2]))
    }  # fmt: skip
    block_out, block_lse = ckfmha.fwd(*codes, **block_scales, **options)
    torch.cuda.synchronize()
    diff = (block_out.double() - tensor_out.double()).norm() / tensor_out.double().norm()
    assert float(diff) < UNIFORM_REL_L2
    assert float((block_lse - tensor_lse).abs().max()) < UNIFORM_LSE_ABS


@hopper
def test_the_torch_op_takes_block_scales() -> None:
    import ckfmha.torch

    index = 2
    run = _run(CASES[index], index)
    with torch.no_grad():
        again, again_lse = ckfmha.torch.attention(
            run.q.codes, run.k.codes, run.v.codes, return_lse=True, out_dtype=run.out_name,
            **_block_scales(run.q, run.k, run.v), **run.options)  # fmt: skip
    assert torch.equal(again, run.out) and torch.equal(again_lse, run.lse)


# ---- group mode (varlen) ----

# (lengths_q, lengths_k, (hq, hk), d, mask, out dtype); odd cases have outlier rows.
VARLEN_CASES: list[tuple[Any, ...]] = [
    ([17, 1000, 1, 255], [17, 1000, 1, 255], (12, 3), 128, "causal", "bf16"),
    ([255, 0, 2049], [1000, 17, 300], (24, 24), 64, "causal_br", "fp16"),
    ([1000, 17], [1000, 1000], (40, 5), 256, "none", "bf16"),
    ([129, 300, 1], [255, 129, 1000], (16, 2), 64, "none", "bf16"),
]


def _quantize_varlen(x: np.ndarray, cu: np.ndarray, max_seqlen: int) -> BlockQuantized:
    codes, scales = quantize_e4m3_blocks_varlen(x, cu, max_seqlen)
    values = dequantize_e4m3_blocks_varlen(codes, scales, cu)
    return BlockQuantized(_to_device(codes), values, torch.from_numpy(scales).cuda())


@hopper
@pytest.mark.parametrize("index", range(len(VARLEN_CASES)))
def test_varlen_block_scales_match_the_reference(index: int) -> None:
    lens_q, lens_k, (hq, hk), d, mask, out_name = VARLEN_CASES[index]
    inputs = Inputs(zlib.crc32(repr(("blocks", VARLEN_CASES[index])).encode()))
    rng = np.random.default_rng(inputs.integer(2**31))
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)

    def packed(heads: int, cu: np.ndarray, max_seqlen: int) -> BlockQuantized:
        x = normal_with_outliers(inputs, (int(cu[-1]), heads, d), index % 2 == 1)
        for start, end in itertools.pairwise(cu):  # each sequence's own blocks
            x[start:end] = _blockwise(x[start:end], 0, rng)
        return _quantize_varlen(x, cu, max_seqlen)

    q = packed(hq, cu_q, max(lens_q))
    k, v = packed(hk, cu_k, max(lens_k)), packed(hk, cu_k, max(lens_k))
    check_varlen(
        (q.codes, k.codes, v.codes),
        (q.values, k.values, v.values),
        (cu_q, cu_k),
        d,
        mask,
        out_name,
        _block_scales(q, k, v),
        f"varlen {VARLEN_CASES[index]}",
    )


@hopper
def test_the_varlen_torch_op_takes_fp8_queries_with_block_scales() -> None:
    import ckfmha.torch

    lens_q, lens_k, (hq, hk), d = [17, 300, 1], [255, 129, 1000], (8, 2), 128
    inputs = Inputs(zlib.crc32(b"varlen torch op"))
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q, k, v = (
        _quantize_varlen(normal_with_outliers(inputs, (int(cu[-1]), h, d), False), cu, max(lens))
        for h, cu, lens in ((hq, cu_q, lens_q), (hk, cu_k, lens_k), (hk, cu_k, lens_k))
    )  # fmt: skip
    cu = (torch.from_numpy(cu_q).cuda(), torch.from_numpy(cu_k).cuda())
    options = {"max_seqlen_q": max(lens_q), "max_seqlen_k": max(lens_k), "causal": True,
               "return_lse": True, **_block_scales(q, k, v)}  # fmt: skip
    out, lse = ckfmha.fwd_varlen(q.codes, k.codes, v.codes, *cu, **options)
    with torch.no_grad():
        again, again_lse = ckfmha.torch.attention_varlen(q.codes, k.codes, v.codes, *cu, **options)
    # Equal problems: the same kernel, the same bits.
    assert again.dtype == torch.bfloat16
    assert torch.equal(again, out) and torch.equal(again_lse, lse)
