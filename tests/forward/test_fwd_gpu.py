"""Forward kernels on the GPU against the float64 NumPy reference.

Every registered forward kernel that runs on this device is forced by name and
checked on cases built from its own features (mask kind, bias, dropout,
soft-cap, sink, batch or group mode), with fresh random inputs (never zeros)
and outputs poisoned with NaN first, so an unwritten element fails the test.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from support.device_kernels import device_kernels
from support.gpu_compare import REL_L2_TOL, Inputs, compare, f64, torch_dtype
from support.kernel_cases import mask_options

import ckfmha
from ckfmha.reference import (
    attention_reference,
    dropout_keep,
    philox_dropout_randval,
    varlen_attention_reference,
)

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch") if ckfmha.device_count() > 0 else None

SEQLEN_PAIRS = [(1, 17), (17, 1), (257, 1000), (1000, 257), (300, 300), (1, 1)]
# Column-major V takes the same odd key counts, plus key counts that fill whole
# 16-byte vectors; VCOL_STORAGE then varies how V sits in memory.
VCOL_SEQLEN_PAIRS = SEQLEN_PAIRS + [(200, 256), (33, 64)]
VARLEN_Q = [0, 1, 17, 300, 129, 64]
VARLEN_K = [5, 1, 40, 300, 0, 200]


KERNELS = device_kernels("fwd")
KERNEL_IDS = [k["name"] for k in KERNELS]


def _bias_rows_only(kernel: dict[str, Any]) -> bool:
    """The Hopper template's 192-row tile takes an elementwise bias only broadcast over the
    query rows (FwdSm90Traits::kBiasRowsOnly); the dispatcher refuses it any other."""
    return (kernel["pipeline"] == "sm90_tma_wgmma" and kernel["tile_m"] == 192
            and kernel["bias"] == "elementwise")  # fmt: skip


def _feature_options(kernel: dict[str, Any], inputs: Inputs, b: int, hq: int, sq: int,
                     sk: int, dtype: Any) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if _bias_rows_only(kernel):
        # One row a (batch, head), broadcast over the batch and the query rows.
        options["bias"] = inputs.normal((1, hq, 1, sk), dtype).expand(b, hq, sq, sk)
    elif kernel["bias"] == "elementwise":
        # Broadcast over the batch: a stride-0 axis must work.
        options["bias"] = inputs.normal((1, hq, sq, sk), dtype).expand(b, hq, sq, sk)
    elif kernel["bias"] == "alibi":
        options["alibi_slopes"] = inputs.uniform((hq,), 0.01, 0.5)
    if kernel["softcap"]:
        options["softcap"] = 2.5
    if kernel["sink"]:
        options["sink"] = inputs.normal((hq,), torch.float32, 2.0)
    if kernel["dropout"]:
        options.update(dropout_p=0.3, dropout_seed=inputs.integer(2**62) + 2**40,
                       dropout_offset=inputs.integer(2**40) + 2**33)
    return options


def _reference_options(options: dict[str, Any]) -> dict[str, Any]:
    converted = {}
    for key, value in options.items():
        converted[key] = f64(value) if hasattr(value, "detach") else value
    return converted


def _lse_request(kernel: dict[str, Any], lse: Any) -> dict[str, Any]:
    """LSE arguments for a kernel: its LSE into ``lse`` where it writes one (kernels built
    without LSE, in the full set, refuse a problem that asks for it)."""
    return {"return_lse": True, "lse_out": lse} if kernel["lse"] else {}


def _outputs(kernel: dict[str, Any], result: Any) -> tuple[Any, Any, Any]:
    """(o, LSE or None, dropout bytes or None) from what ckfmha.fwd returned."""
    parts = list(result) if isinstance(result, tuple) else [result]
    lse = parts.pop(1) if kernel["lse"] else None
    randval = parts[1] if kernel["dropout"] else None
    return parts[0], lse, randval


def _check_randval(randval: Any, options: dict[str, Any], b: int, hq: int, sq: int, sk: int,
                   visible: np.ndarray) -> np.ndarray:
    """The stored bytes must be the documented Philox stream wherever a kernel visited."""
    expected = philox_dropout_randval(options["dropout_seed"], options["dropout_offset"], b, hq,
                                      sq, sk)
    got = randval.cpu().numpy()
    np.testing.assert_array_equal(got[visible], expected[visible])
    return dropout_keep(expected, options["dropout_p"])


def _keys_contiguous(inputs: Inputs, lead: tuple[int, ...], sk: int, storage: str,
                     dtype: Any) -> Any:
    """Column-major V [*lead, sk] stored as ``storage`` says.

    "contiguous": the head-dim stride is sk, so 16-byte key vectors are aligned
    only when sk is a multiple of 8. "padded": rows padded to a multiple of 8
    keys plus one vector, so vectors are aligned and the last one straddles
    the end whenever sk is not a multiple of 8. "shifted": the padded rows seen
    from their second key, so the base is never 16-byte aligned.
    """
    if storage == "contiguous":
        return inputs.normal(lead + (sk,), dtype)
    rows = inputs.normal(lead + ((sk + 7) // 8 * 8 + 8,), dtype)
    start = 1 if storage == "shifted" else 0
    return rows[..., start : start + sk]


VCOL_STORAGE = ["contiguous", "padded", "shifted"]


def _batch_cases(kernel: dict[str, Any]) -> Iterator[dict[str, Any]]:
    pairs = VCOL_SEQLEN_PAIRS if kernel["v_col_major"] else SEQLEN_PAIRS
    for i, (sq, sk) in enumerate(pairs):
        yield {"index": i, "sq": sq, "sk": sk, "batch": 2 if sq * sk < 200_000 else 1,
               "heads": [(4, 4), (4, 2), (6, 1)][i % 3], "layout": ["bhsd", "bshd"][i % 2],
               "v_storage": VCOL_STORAGE[i % 3]}


def _run_batch_case(kernel: dict[str, Any], case: dict[str, Any], inputs: Inputs) -> None:
    dtype = torch_dtype(kernel["dtype"])
    d, dv = kernel["hdim_q"], kernel["hdim_v"]
    (hq, hk), b, sq, sk = case["heads"], case["batch"], case["sq"], case["sk"]
    bshd = case["layout"] == "bshd"

    def shape(heads: int, seqlen: int, dim: int) -> tuple[int, ...]:
        return (b, seqlen, heads, dim) if bshd else (b, heads, seqlen, dim)

    q = inputs.normal(shape(hq, sq, d), dtype)
    k = inputs.normal(shape(hk, sk, d), dtype)
    v_col_major = kernel["v_col_major"]
    # Column-major V is [b, hk, dv, sk] whatever the layout of q and k.
    if v_col_major:
        v = _keys_contiguous(inputs, (b, hk, dv), sk, case["v_storage"], dtype)
    else:
        v = inputs.normal(shape(hk, sk, dv), dtype)
    out = torch.full(shape(hq, sq, dv), float("nan"), device="cuda", dtype=dtype)
    lse = torch.full((b, hq, sq), float("nan"), device="cuda", dtype=torch.float32)
    options = {**mask_options(kernel, case["index"]),
               **_feature_options(kernel, inputs, b, hq, sq, sk, dtype)}
    scale = 1.0 / math.sqrt(d) * (0.75 if case["index"] % 2 else 1.0)
    result = ckfmha.fwd(q, k, v, scale=scale, layout=case["layout"], out=out,
                        kernel=kernel["name"], v_col_major=v_col_major,
                        return_dropout_randval=kernel["dropout"], **_lse_request(kernel, lse),
                        **options)
    torch.cuda.synchronize()
    got, got_lse, randval = _outputs(kernel, result)
    assert got.data_ptr() == out.data_ptr(), "out= must be written in place"

    ref_options = _reference_options(options)
    if kernel["dropout"]:
        probs_visible = _visible(kernel, ref_options, b, hq, sq, sk)
        keep = _check_randval(randval, options, b, hq, sq, sk, probs_visible)
        ref_options["dropout_keep"] = keep
    for key in ("dropout_seed", "dropout_offset"):
        ref_options.pop(key, None)
    ref, ref_lse = attention_reference(f64(q), f64(k), f64(v), scale=scale,
                                       layout=case["layout"], v_col_major=v_col_major,
                                       **ref_options)
    compare(kernel, got, got_lse, ref, ref_lse, f"{case} {sorted(options)}")


def _visible(kernel: dict[str, Any], options: dict[str, Any], b: int, hq: int, sq: int,
             sk: int) -> np.ndarray:
    """[b, hq, sq, sk] positions a kernel must visit (not masked)."""
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    offset = sk - sq if options.get("causal_alignment") == "bottom_right" else 0
    left, right = -1, -1
    if options.get("causal"):
        right = 0
    elif "window" in options:
        left, right = options["window"]
    ok = np.ones((sq, sk), dtype=bool)
    if left >= 0:
        ok &= j >= i + offset - left
    if right >= 0:
        ok &= j <= i + offset + right
    return np.broadcast_to(ok, (b, hq, sq, sk))


def _run_group_case(kernel: dict[str, Any], index: int, inputs: Inputs) -> None:
    dtype = torch_dtype(kernel["dtype"])
    d, dv = kernel["hdim_q"], kernel["hdim_v"]
    hq, hk = [(4, 2), (3, 3)][index % 2]
    lens_q = np.roll(VARLEN_Q, index)
    lens_k = lens_q if index % 2 else np.roll(VARLEN_K, index)
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    b = len(lens_q)
    max_q, max_k = int(lens_q.max()), int(lens_k.max())
    q = inputs.normal((int(cu_q[-1]), hq, d), dtype)
    k = inputs.normal((int(cu_k[-1]), hk, d), dtype)
    v_col_major = kernel["v_col_major"]
    if v_col_major:
        # [hk, dv, total_k]: sequences start at arbitrary keys, so each CTA
        # finds its own vectors aligned or not; padded rows make some aligned.
        storage = "contiguous" if index % 2 else "padded"
        v = _keys_contiguous(inputs, (hk, dv), int(cu_k[-1]), storage, dtype)
    else:
        v = inputs.normal((int(cu_k[-1]), hk, dv), dtype)
    out = torch.full((int(cu_q[-1]), hq, dv), float("nan"), device="cuda", dtype=dtype)
    lse = torch.full((hq, int(cu_q[-1])), float("nan"), device="cuda", dtype=torch.float32)
    options = {**mask_options(kernel, index),
               **_feature_options(kernel, inputs, b, hq, max_q, max_k, dtype)}
    skip_min = 2 if index % 2 else 0
    result = ckfmha.fwd_varlen(
        q, k, v, torch.from_numpy(cu_q).cuda(), torch.from_numpy(cu_k).cuda(),
        max_seqlen_q=max_q, max_seqlen_k=max_k, skip_min_seqlen_q=skip_min, out=out,
        kernel=kernel["name"], v_col_major=v_col_major, return_dropout_randval=kernel["dropout"],
        **_lse_request(kernel, lse), **options)
    torch.cuda.synchronize()
    got, got_lse, randval = _outputs(kernel, result)
    ref_options = _varlen_reference_options(kernel, options, randval, lens_q, lens_k, hq,
                                            skip_min)
    ref, ref_lse = varlen_attention_reference(f64(q), f64(k), f64(v), cu_q, cu_k,
                                              skip_min_seqlen_q=skip_min,
                                              v_col_major=v_col_major, **ref_options)
    compare(kernel, got, got_lse, ref, ref_lse, f"varlen {index} {sorted(options)}")


def _varlen_reference_options(kernel: dict[str, Any], options: dict[str, Any], randval: Any,
                              lens_q: np.ndarray, lens_k: np.ndarray, hq: int,
                              skip_min: int = 0) -> dict[str, Any]:
    """The reference's options for a varlen call: dropout's keep mask from the stored bytes
    (checked against the Philox stream where the kernel visited), seeds dropped."""
    ref_options = _reference_options(options)
    if kernel["dropout"]:
        b, max_q, max_k = len(lens_q), int(lens_q.max()), int(lens_k.max())
        visited = np.zeros((b, hq, max_q, max_k), dtype=bool)
        for seq, (n_q, n_k) in enumerate(zip(lens_q, lens_k)):
            if n_q >= max(skip_min, 1):
                visited[seq, :, :n_q, :n_k] = _visible(kernel, ref_options, 1, hq, n_q, n_k)[0]
        ref_options["dropout_keep"] = _check_randval(randval, options, b, hq, max_q, max_k,
                                                     visited)
    for key in ("dropout_seed", "dropout_offset"):
        ref_options.pop(key, None)
    return ref_options


@pytest.mark.parametrize("kernel", KERNELS, ids=KERNEL_IDS)
def test_kernel_matches_reference(kernel: dict[str, Any]) -> None:
    inputs = Inputs(zlib.crc32(kernel["name"].encode()))
    if kernel["mode"] == "group":
        # A third offset pattern gives column-major V long sequences starting
        # on 16-byte boundaries (the vector path) beside misaligned ones.
        for index in range(3 if kernel["v_col_major"] else 2):
            _run_group_case(kernel, index, inputs)
    else:
        for case in _batch_cases(kernel):
            _run_batch_case(kernel, case, inputs)


# Persistent kernels launch one CTA per SM and walk the tiles; the cases above
# have fewer tiles than an H100 has SMs, so these give each CTA several tiles
# (and, in group mode, many tiles without rows or keys to skip).
PERSISTENT_KERNELS = [k for k in KERNELS if k["pipeline"] == "sm90_tma_wgmma"]


def _check_bhsd_case(kernel: dict[str, Any], q: Any, k: Any, v: Any, options: dict[str, Any],
                     what: str) -> None:
    """One forward call with kernel["name"] on [b, h, s, d] tensors into NaN-poisoned
    outputs, against the float64 reference at the default scale (dropout: with the keep mask
    of the bytes it stored)."""
    b, hq, sq = q.shape[:3]
    sk = k.shape[2]
    out = torch.full((b, hq, sq, v.shape[-1]), float("nan"), device="cuda", dtype=q.dtype)
    lse = torch.full((b, hq, sq), float("nan"), device="cuda", dtype=torch.float32)
    result = ckfmha.fwd(q, k, v, out=out, kernel=kernel["name"],
                        return_dropout_randval=kernel["dropout"], **_lse_request(kernel, lse),
                        **options)
    torch.cuda.synchronize()
    ref_options = _reference_options(options)
    if kernel["dropout"]:
        visible = _visible(kernel, ref_options, b, hq, sq, sk)
        ref_options["dropout_keep"] = _check_randval(_outputs(kernel, result)[2], options, b,
                                                     hq, sq, sk, visible)
    for key in ("dropout_seed", "dropout_offset"):
        ref_options.pop(key, None)
    ref, ref_lse = attention_reference(f64(q), f64(k), f64(v), **ref_options)
    compare(kernel, out, lse if kernel["lse"] else None, ref, ref_lse,
            f"{what} {sorted(options)}")


def _check_varlen_case(kernel: dict[str, Any], q: Any, k: Any, v: Any, lens_q: np.ndarray,
                       lens_k: np.ndarray, options: dict[str, Any], what: str) -> None:
    """One fwd_varlen call with kernel["name"] on packed [tokens, h, d] tensors of sequences
    `lens_q`/`lens_k` into NaN-poisoned outputs, against the float64 reference."""
    hq, dv = q.shape[1], v.shape[-1]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    out = torch.full((int(cu_q[-1]), hq, dv), float("nan"), device="cuda", dtype=q.dtype)
    lse = torch.full((hq, int(cu_q[-1])), float("nan"), device="cuda", dtype=torch.float32)
    result = ckfmha.fwd_varlen(
        q, k, v, torch.from_numpy(cu_q).cuda(), torch.from_numpy(cu_k).cuda(),
        max_seqlen_q=int(lens_q.max()), max_seqlen_k=int(lens_k.max()), out=out,
        kernel=kernel["name"], return_dropout_randval=kernel["dropout"],
        **_lse_request(kernel, lse), **options)
    torch.cuda.synchronize()
    ref_options = _varlen_reference_options(kernel, options, _outputs(kernel, result)[2],
                                            lens_q, lens_k, hq)
    ref, ref_lse = varlen_attention_reference(f64(q), f64(k), f64(v), cu_q, cu_k, **ref_options)
    compare(kernel, out, lse if kernel["lse"] else None, ref, ref_lse, f"{what} {sorted(options)}")


_SM90_BIAS_BATCH = [
    k for k in KERNELS
    if k["pipeline"] == "sm90_tma_wgmma" and k["bias"] == "elementwise" and k["mode"] == "batch"
    and not _bias_rows_only(k)
]  # fmt: skip


def _bias_view(inputs: Inputs, shape: tuple[int, int, int, int], dtype: Any,
               row_pad: int, element_offset: int) -> Any:  # fmt: skip
    """A [b, h, sq, sk] bias whose rows are `row_pad` elements longer in memory and whose first
    element lies `element_offset` elements into its storage."""
    b, h, sq, sk = shape
    flat = inputs.normal((b * h * sq * (sk + row_pad) + element_offset,), dtype)
    rows = flat[element_offset:].view(b, h, sq, sk + row_pad)
    return rows[..., :sk]


@pytest.mark.parametrize("kernel", _SM90_BIAS_BATCH, ids=[k["name"] for k in _SM90_BIAS_BATCH])
def test_sm90_bias_ring_and_register_paths(kernel: dict[str, Any]) -> None:
    """The Hopper forward bulk-copies bias rows into a shared-memory ring when the pointer, the
    strides and the key count are whole 16-byte vectors, and reads them into registers
    otherwise (fwd_bias_ring.cuh). Many key and query tiles, GQA, a full (not broadcast) bias:
    contiguous and with padded rows (the ring, a partial last key tile of 96 keys), one element
    off alignment, and an odd key count (registers)."""
    inputs = Inputs(zlib.crc32(kernel["name"].encode()) + 4)
    dtype = torch_dtype(kernel["dtype"])
    d, dv = kernel["hdim_q"], kernel["hdim_v"]
    b, hq, hk = 2, 6, 2
    cases = [("ring", 700, 1120, 0, 0), ("ring, padded rows", 300, 1120, 24, 0),
             ("registers, misaligned", 300, 1120, 0, 1), ("registers, odd keys", 700, 1123, 0, 0)]
    for what, sq, sk, row_pad, offset in cases:
        options = {**mask_options(kernel, 1),
                   **_feature_options(kernel, inputs, b, hq, sq, sk, dtype)}  # fmt: skip
        options["bias"] = _bias_view(inputs, (b, hq, sq, sk), dtype, row_pad, offset)
        q = inputs.normal((b, hq, sq, d), dtype)
        k = inputs.normal((b, hk, sk, d), dtype)
        v = inputs.normal((b, hk, sk, dv), dtype)
        _check_bhsd_case(kernel, q, k, v, options, f"bias {what} {sq}x{sk}")


def _key_padding_bias(kernel: dict[str, Any], inputs: Inputs, b: int, heads: int, sk: int,
                      dtype: Any, offset: int) -> Any:  # fmt: skip
    """A [b, heads, 1, sk] additive key-padding bias (random values on each sequence's valid
    keys, -inf past a random valid length of at least one key) starting `offset` elements into
    its storage, so that an odd offset leaves it 2-byte aligned only. Key 0 is valid, which
    every row sees under the bottom-right causal mask; a window may see only padded keys, so
    window kernels pad with -30 instead (the reference's softmax of a row of -inf is undefined)."""
    flat = inputs.normal((b * heads * sk + offset,), dtype)
    bias = flat[offset:].view(b, heads, 1, sk)
    pad = -30.0 if kernel["mask"] == "window" else float("-inf")
    for batch in range(b):
        valid = 1 + inputs.integer(sk)
        bias[batch, :, :, valid:] = pad
    return bias


_SM90_BIAS_ANY_MODE = [
    k for k in KERNELS if k["pipeline"] == "sm90_tma_wgmma" and k["bias"] == "elementwise"
]  # fmt: skip


@pytest.mark.parametrize("kernel", _SM90_BIAS_ANY_MODE,
                         ids=[k["name"] for k in _SM90_BIAS_ANY_MODE])
def test_sm90_bias_row_mode(kernel: dict[str, Any]) -> None:
    """A bias broadcast over the query rows (a key-padding mask, [b, 1 or heads, 1, sk]) takes
    the ring's row mode, whatever its alignment (fwd_bias_ring.cuh): per-batch padding with
    -inf, one bias per head or one for all, odd key counts, misaligned storage, GQA, several
    key tiles and, in group mode, sequences of their own lengths."""
    inputs = Inputs(zlib.crc32(kernel["name"].encode()) + 5)
    dtype = torch_dtype(kernel["dtype"])
    d, dv = kernel["hdim_q"], kernel["hdim_v"]
    hq, hk = 6, 2
    if kernel["mode"] == "batch":
        cases = [("one row for all heads", 3, 700, 1123, 1, 1),
                 ("a row per head, aligned", 2, 300, 1024, hq, 0),
                 ("one query row", 2, 1, 517, 1, 3)]
        for what, b, sq, sk, heads, offset in cases:
            options = {**mask_options(kernel, 1),
                       **_feature_options(kernel, inputs, b, hq, sq, sk, dtype)}  # fmt: skip
            options["bias"] = _key_padding_bias(kernel, inputs, b, heads, sk, dtype, offset)
            q = inputs.normal((b, hq, sq, d), dtype)
            k = inputs.normal((b, hk, sk, d), dtype)
            v = inputs.normal((b, hk, sk, dv), dtype)
            _check_bhsd_case(kernel, q, k, v, options, f"row-broadcast bias {what} {sq}x{sk}")
        return
    lens_q = np.array([inputs.integer(600) + 1 for _ in range(5)] + [300])
    lens_k = lens_q + np.array([inputs.integer(400) for _ in range(6)])
    max_q, max_k = int(lens_q.max()), int(lens_k.max())
    q = inputs.normal((int(lens_q.sum()), hq, d), dtype)
    k = inputs.normal((int(lens_k.sum()), hk, d), dtype)
    v = inputs.normal((int(lens_k.sum()), hk, dv), dtype)
    options = {**mask_options(kernel, 1),
               **_feature_options(kernel, inputs, len(lens_q), hq, max_q, max_k, dtype)}
    options["bias"] = _key_padding_bias(kernel, inputs, len(lens_q), 1, max_k, dtype, 1)
    _check_varlen_case(kernel, q, k, v, lens_q, lens_k, options, "row-broadcast bias, group mode")


@pytest.mark.parametrize("kernel", PERSISTENT_KERNELS, ids=[k["name"] for k in PERSISTENT_KERNELS])
def test_persistent_kernel_walks_many_tiles(kernel: dict[str, Any]) -> None:
    inputs = Inputs(zlib.crc32(kernel["name"].encode()) + 1)
    dtype = torch_dtype(kernel["dtype"])
    d, dv = kernel["hdim_q"], kernel["hdim_v"]
    if kernel["mode"] == "batch":
        # 1500 rows are 12 query tiles of 128 or 8 of 192 (384 or 256 tiles
        # over 8 heads x 4); aligned bottom-right, their first 210 rows see
        # no key, so whole tiles have none between tiles that have some.
        # 1300 rows are 11 or 7 tiles, an odd count, so each head's causal
        # units end on a lone middle tile; over 3 x 5 heads with one K/V
        # head (MQA).
        for index, (b, hq, hk, sq, sk) in enumerate([(4, 8, 2, 1500, 1290),
                                                     (3, 5, 1, 1300, 1300)]):
            options = {**mask_options(kernel, 1 - index),
                       **_feature_options(kernel, inputs, b, hq, sq, sk, dtype)}
            q = inputs.normal((b, hq, sq, d), dtype)
            k = inputs.normal((b, hk, sk, d), dtype)
            v = inputs.normal((b, hk, sk, dv), dtype)
            _check_bhsd_case(kernel, q, k, v, options, f"persistent batch {b}x{hq}x{sq}")
    else:
        hq, hk = 8, 2
        options = mask_options(kernel, 1)
        lens_q = np.array([inputs.integer(700) for _ in range(24)] + [0, 700])
        lens_k = np.array([inputs.integer(700) for _ in range(24)] + [300, 0])
        q = inputs.normal((int(lens_q.sum()), hq, d), dtype)
        k = inputs.normal((int(lens_k.sum()), hk, d), dtype)
        v = inputs.normal((int(lens_k.sum()), hk, dv), dtype)
        max_q, max_k = int(lens_q.max()), int(lens_k.max())
        options.update(_feature_options(kernel, inputs, len(lens_q), hq, max_q, max_k, dtype))
        _check_varlen_case(kernel, q, k, v, lens_q, lens_k, options, "persistent group")


BATCH_PERSISTENT_KERNELS = [k for k in PERSISTENT_KERNELS if k["mode"] == "batch"]


@pytest.mark.parametrize("kernel", BATCH_PERSISTENT_KERNELS,
                         ids=[k["name"] for k in BATCH_PERSISTENT_KERNELS])
def test_rising_row_maxima_rescale_the_output(kernel: dict[str, Any]) -> None:
    """Scores that climb by about 6 natural-log units every 64 keys towards the first key.

    Key tiles are visited from the last to the first, so almost every tile
    raises each row's maximum by more than the lazy-maximum slack of the
    Hopper kernels (a factor 2^8), and O must be rescaled turn after turn;
    plain random inputs rarely move a maximum that far after the first tile.
    The second case ramps the other way (the first tile visited holds the
    maximum).
    """
    inputs = Inputs(zlib.crc32(kernel["name"].encode()) + 2)
    dtype = torch_dtype(kernel["dtype"])
    d, dv = kernel["hdim_q"], kernel["hdim_v"]
    b, hq, hk, sq, sk = 2, 4, 2, 300, 1000
    direction = torch.zeros(d, device="cuda")
    direction[0] = 1.0
    for index, rising in enumerate((True, False)):
        options = mask_options(kernel, index)
        # q leans 4 along `direction`; key j's component there climbs to
        # 90 * sqrt(d) / 4 at the rising end, so scores span about 90.
        ramp = torch.linspace(1.0, 0.0, sk, device="cuda")
        if not rising:
            ramp = ramp.flip(0)
        ramp = ramp * 90.0 * math.sqrt(d) / 4.0
        q = inputs.normal((b, hq, sq, d), torch.float32, 0.3) + 4.0 * direction
        k = inputs.normal((b, hk, sk, d), torch.float32, 0.3) + ramp[:, None] * direction
        q, k = q.to(dtype), k.to(dtype)
        v = inputs.normal((b, hk, sk, dv), dtype)
        options.update(_feature_options(kernel, inputs, b, hq, sq, sk, dtype))
        _check_bhsd_case(kernel, q, k, v, options, f"rising={rising}")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="needs compute-sanitizer")
@pytest.mark.skipif(not any(k["v_col_major"] for k in KERNELS), reason="no column-major V kernel")
def test_column_major_v_reads_no_key_past_the_end() -> None:
    # memcheck sees reads past an allocation, not past a sequence: without torch's
    # caching allocator each V is its own allocation, so a key read past the end of
    # a contiguous V's last channel (the last packed sequence, in group mode) is
    # reported; the odd sizes put that end inside a 16-byte vector.
    first_of: dict[tuple[str, str], str] = {}
    for kernel in KERNELS:
        if kernel["v_col_major"]:
            first_of.setdefault((kernel["mode"], kernel["dtype"]), kernel["name"])
    names = list(first_of.values())
    command = [
        "compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "99",
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
        "-k", "test_kernel_matches_reference and (" + " or ".join(names) + ")",
    ]  # fmt: skip
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    result = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]


@pytest.mark.skipif(not KERNELS, reason="no forward kernel for this device")
def test_dropout_is_reproducible_and_seed_dependent() -> None:
    kernels = [k for k in KERNELS if k["dropout"] and k["mode"] == "batch"]
    if not kernels:
        pytest.skip("no dropout kernel registered")
    kernel = kernels[0]
    dtype = torch_dtype(kernel["dtype"])
    q = torch.randn(1, 2, 64, kernel["hdim_q"], device="cuda", dtype=dtype)
    v = torch.randn(1, 2, 64, kernel["hdim_v"], device="cuda", dtype=dtype)
    extra = _feature_options({**kernel, "dropout": False}, Inputs(1), 1, 2, 64, 64, dtype)
    extra.update(mask_options(kernel, 0))

    def run(seed: int) -> Any:
        return ckfmha.fwd(q, q, v, dropout_p=0.5, dropout_seed=seed, kernel=kernel["name"],
                          **extra)

    first, again, other = run(7), run(7), run(8)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_automatic_selection_and_results_on_same_stream() -> None:
    kernel = _plain_batch_kernel()
    hdim, dtype, causal = kernel["hdim_q"], torch_dtype(kernel["dtype"]), kernel["mask"] == "causal"
    q = torch.randn(2, 8, 300, hdim, device="cuda", dtype=dtype)
    k = torch.randn(2, 2, 300, hdim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = ckfmha.fwd(q, k, v, causal=causal)
    stream.synchronize()
    assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == q.dtype
    ref, _ = attention_reference(f64(q), f64(k), f64(v), causal=causal)
    rel = np.linalg.norm(f64(out) - ref) / np.linalg.norm(ref)
    assert rel < REL_L2_TOL[kernel["dtype"]]


@pytest.mark.skipif(not KERNELS, reason="no forward kernel for this device")
def test_torch_tensors_on_the_launch_stream_are_read_directly() -> None:
    from ckfmha._arrays import as_view

    t = torch.randn(2, 3, 40, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    current = torch.cuda.current_stream().cuda_stream
    view = as_view(t, current, None, "q", 4)
    assert view.protocol == "torch"
    assert (view.ptr, view.shape, view.strides) == (t.data_ptr(), tuple(t.shape), t.stride())
    assert view.dtype_name == "bf16"
    # Another stream must be ordered after the tensor's pending work: DLPack does that.
    side = torch.cuda.Stream()
    assert as_view(t, side.cuda_stream, None, "q", 4).protocol == "dlpack"
    with pytest.raises(ckfmha.InvalidArgumentError, match="q: torch dtype torch.float64"):
        as_view(t.double(), current, None, "q", 4)


def test_inputs_written_on_torch_stream_are_read_on_an_explicit_other_stream() -> None:
    kernel = _plain_batch_kernel()
    hdim, dtype, causal = kernel["hdim_q"], torch_dtype(kernel["dtype"]), kernel["mask"] == "causal"
    q = torch.randn(1, 4, 2000, hdim, device="cuda", dtype=dtype)
    k = torch.randn(1, 4, 2000, hdim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    expected = ckfmha.fwd(q, k, v, causal=causal)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    torch.cuda._sleep(20_000_000)  # the writes below land long after the call returns
    q2, k2, v2 = q * 1.0, k * 1.0, v * 1.0
    out = ckfmha.fwd(q2, k2, v2, causal=causal, stream=side)
    side.synchronize()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)


def _plain_batch_kernel(dtypes: tuple[str, ...] = ("fp16", "bf16")) -> dict[str, Any]:
    """A batch-mode kernel of one of `dtypes` needing no feature a plain call lacks (so a plain
    call of its dtype, head dim and mask fits it), or a skip in a build without one."""
    kernels = [k for k in KERNELS
               if k["mode"] == "batch" and k["dtype"] in dtypes and k["bias"] == "none"
               and not (k["dropout"] or k["softcap"] or k["sink"] or k["v_col_major"])
               and k["hdim_q"] == k["hdim_v"] and k["mask"] != "window"]
    if not kernels:
        pytest.skip(f"no plain batch-mode {'/'.join(dtypes)} forward kernel registered")
    return kernels[0]


def test_numpy_inputs_are_staged() -> None:
    kernel = _plain_batch_kernel(("fp16",))  # NumPy has no bf16
    causal = kernel["mask"] == "causal"
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((1, 2, n, kernel["hdim_q"])).astype(np.float16)
               for n in (33, 70, 70))
    out = ckfmha.fwd(q, k, v, causal=causal)
    assert isinstance(out, np.ndarray) and out.dtype == np.float16
    ref, _ = attention_reference(q.astype(np.float64), k.astype(np.float64),
                                 v.astype(np.float64), causal=causal)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < REL_L2_TOL["fp16"]


@pytest.mark.skipif(not KERNELS, reason="no forward kernel for this device")
def test_unsupported_head_dim_raises_with_supported_list() -> None:
    q = torch.randn(1, 2, 16, 72, device="cuda", dtype=torch.float16)
    with pytest.raises(ckfmha.UnsupportedError, match="head dims"):
        ckfmha.fwd(q, q, q)


def test_misaligned_rows_are_rejected() -> None:
    kernel = _plain_batch_kernel()
    hdim, dtype = kernel["hdim_q"], torch_dtype(kernel["dtype"])
    base = torch.randn(1, 2, 16, hdim + 1, device="cuda", dtype=dtype)
    view = base[..., 1:]  # a kernel's head dim, but rows start at odd element offsets
    with pytest.raises(ckfmha.UnsupportedError, match="16-byte"):
        ckfmha.fwd(view, view, view, causal=kernel["mask"] == "causal")


def _fp32_batch_kernel() -> dict[str, Any]:
    kernels = [k for k in KERNELS if k["dtype"] == "fp32" and k["mode"] == "batch"]
    if not kernels:
        pytest.skip("no fp32 batch-mode kernel registered")
    return kernels[0]


@pytest.mark.skipif(not KERNELS, reason="no forward kernel for this device")
def test_fp32_is_selected_and_rows_need_four_element_alignment() -> None:
    kernel = _fp32_batch_kernel()
    d, dv = kernel["hdim_q"], kernel["hdim_v"]
    inputs = Inputs(5)
    options = {**mask_options(kernel, 0),
               **_feature_options(kernel, inputs, 1, 2, 40, 40, torch.float32)}
    options.pop("dropout_seed", None)
    options.pop("dropout_offset", None)
    if kernel["dropout"]:
        options["dropout_p"] = 0.0
        options["return_dropout_randval"] = True  # a p=0 problem that still needs dropout

    def padded(pad: int) -> tuple[Any, Any, Any]:
        # Rows of d + pad floats: 16-byte vectors need row starts at multiples of 4.
        q = inputs.normal((1, 2, 40, d + pad), torch.float32)[..., :d]
        k = inputs.normal((1, 2, 40, d + pad), torch.float32)[..., :d]
        v = inputs.normal((1, 2, 40, dv + pad), torch.float32)[..., :dv]
        return q, k, v

    q, k, v = padded(4)
    result = ckfmha.fwd(q, k, v, **options)
    out = result[0] if isinstance(result, tuple) else result
    torch.cuda.synchronize()
    assert out.dtype == torch.float32
    ref_options = _reference_options(options)
    ref_options.pop("dropout_p", None)
    ref_options.pop("return_dropout_randval", None)
    ref, _ = attention_reference(f64(q), f64(k), f64(v), **ref_options)
    rel = np.linalg.norm(f64(out) - ref) / np.linalg.norm(ref)
    assert rel < REL_L2_TOL["fp32"]
    q, k, v = padded(2)
    with pytest.raises(ckfmha.UnsupportedError, match="not a multiple of 4 elements"):
        ckfmha.fwd(q, k, v, **options)
