"""Per-block e4m3 quantisation on the host, as the fp8 forward reads it with per-block scales
(``fp8_block_scales``): one fp32 scale per block of 128 tokens of one head, amax / 448 of the
block (1.0 for an all-zero block), and the e4m3 codes of x / scale.

The codes come from ``ckfmha.fp8`` (round to nearest, ties to even, saturating at +-448, as
the GPU's ``cvt.rn.satfinite`` and torch's float8_e4m3fn cast), so these tests and the library
share one encoder. Each scale is rounded to the fp32 the kernel reads before the codes are
made, and the dequantised values (code * fp32 scale, in float64) are what a reference should
run on: the inputs exactly as the kernel sees them.
"""

from __future__ import annotations

import itertools

import numpy as np
import numpy.typing as npt

from ckfmha import fp8

BLOCK = 128  # CKFMHA_FP8_SCALE_BLOCK

Codes = npt.NDArray[np.uint8]
Scales = npt.NDArray[np.float32]


def blocks(seqlen: int, block: int = BLOCK) -> int:
    """The blocks that cover ``seqlen`` tokens: ceil(seqlen / block)."""
    return -(-int(seqlen) // block)


def _token_scales(scales: npt.ArrayLike, seqlen: int, block: int) -> npt.NDArray[np.float64]:
    """[..., blocks] scales as [..., seqlen, 1]: each token's block scale, broadcast over d."""
    return fp8.expand_block_scales(scales, block, seqlen, axis=-1)[..., None]


def quantize_e4m3_blocks(x: npt.ArrayLike, seqlens: npt.ArrayLike | None = None,
                         block: int = BLOCK) -> tuple[Codes, Scales]:  # fmt: skip
    """(codes, scales) of x [batch, heads, seqlen, d] (bhsd): uint8 e4m3 codes shaped like x
    and fp32 scales [batch, heads, ceil(seqlen / block)].

    With ``seqlens`` (one length per batch entry) the tokens past a sequence's length are
    padding: they take no part in the amax, and a block of padding alone gets scale 1.0 (its
    codes are still x / scale, saturated, as a kernel never reads them)."""
    values = np.asarray(x, dtype=np.float64)
    if values.ndim != 4:
        raise ValueError(f"x must be [batch, heads, seqlen, d], got shape {values.shape}")
    measured = values
    if seqlens is not None:
        lengths = np.asarray(seqlens, dtype=np.int64)
        if lengths.shape != (values.shape[0],) or np.any(lengths > values.shape[2]):
            raise ValueError(f"seqlens {lengths.tolist()} do not fit x of shape {values.shape}")
        valid = np.arange(values.shape[2]) < lengths[:, None]  # [batch, seqlen]
        measured = np.where(valid[:, None, :, None], values, 0.0)
    scales = fp8.block_scales(measured, block, axis=-2).astype(np.float32)
    codes = fp8.quantize(values, _token_scales(scales, values.shape[2], block))
    return codes, scales


def dequantize_e4m3_blocks(codes: npt.ArrayLike, scales: npt.ArrayLike,
                           block: int = BLOCK) -> npt.NDArray[np.float64]:  # fmt: skip
    """code * scale in float64 for codes [batch, heads, seqlen, d] and scales [batch, heads,
    blocks]: the values the kernel computes with."""
    raw = np.asarray(codes)
    return fp8.dequantize(raw, _token_scales(scales, raw.shape[2], block))


def _sequences(cu_seqlens: npt.ArrayLike, max_seqlen: int) -> list[tuple[int, int]]:
    """(start, end) of each sequence of packed offsets, checked against max_seqlen."""
    offsets = [int(n) for n in np.asarray(cu_seqlens).reshape(-1)]
    spans = list(itertools.pairwise(offsets))
    for index, (start, end) in enumerate(spans):
        if not 0 <= end - start <= max_seqlen:
            raise ValueError(f"sequence {index} spans tokens {start}..{end}, outside "
                             f"0..max_seqlen={max_seqlen} tokens")  # fmt: skip
    return spans


def quantize_e4m3_blocks_varlen(x: npt.ArrayLike, cu_seqlens: npt.ArrayLike, max_seqlen: int,
                                block: int = BLOCK) -> tuple[Codes, Scales]:  # fmt: skip
    """(codes, scales) of packed x [tokens, heads, d] (fwd_varlen's layout): uint8 codes shaped
    like x and fp32 scales [sequences, heads, ceil(max_seqlen / block)].

    A sequence's blocks start at its first token (cu_seqlens[b]), not at a multiple of
    ``block`` in the packed tensor; its blocks past its end, never read, get scale 1.0, as do
    tokens outside every sequence."""
    values = np.asarray(x, dtype=np.float64)
    if values.ndim != 3:
        raise ValueError(f"x must be [tokens, heads, d], got shape {values.shape}")
    spans = _sequences(cu_seqlens, max_seqlen)
    scales = np.ones((len(spans), values.shape[1], blocks(max_seqlen, block)), np.float32)
    per_token = np.ones(values.shape[:2], np.float64)  # [tokens, heads]
    for index, (start, end) in enumerate(spans):
        # One sequence as [1, heads, seqlen, d]: the batch-mode blocks of that sequence.
        sequence = np.moveaxis(values[start:end], 0, 1)[None]
        found = fp8.block_scales(sequence, block, axis=-2).astype(np.float32)[0]
        scales[index, :, : found.shape[1]] = found
        per_token[start:end] = fp8.expand_block_scales(found, block, end - start, axis=-1).T
    return fp8.quantize(values, per_token[..., None]), scales


def dequantize_e4m3_blocks_varlen(codes: npt.ArrayLike, scales: npt.ArrayLike,
                                  cu_seqlens: npt.ArrayLike,
                                  block: int = BLOCK) -> npt.NDArray[np.float64]:  # fmt: skip
    """code * scale in float64 for packed codes [tokens, heads, d] and scales [sequences,
    heads, blocks], each sequence's blocks from its first token; tokens outside every sequence
    take scale 1.0."""
    raw = np.asarray(codes)
    table = np.asarray(scales, dtype=np.float64)
    per_token = np.ones(raw.shape[:2], np.float64)
    for index, (start, end) in enumerate(_sequences(cu_seqlens, table.shape[2] * block)):
        per_token[start:end] = fp8.expand_block_scales(table[index], block, end - start).T
    return fp8.dequantize(raw, per_token[..., None])
