"""Backward kernels on the GPU against the float64 NumPy gradients.

Every registered bwd_dq_dk_dv kernel that runs on this device is forced by name and checked
on cases built from its features (mask kind, batch or group mode), with fresh random inputs,
odd sizes (seqlen 1, 17, 100: not tile multiples), GQA/MQA, both layouts and zero-length
sequences, and outputs poisoned with NaN first so an unwritten element fails (dbias too, for
kernels that write it: every element, masked ones as exact zeros). The forward's
O and LSE come from the float64 reference (rounded to the kernel's dtype), so a backward
error is never a forward one.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np
import pytest
from support.device_kernels import device_kernels
from support.kernel_cases import mask_options

import ckfmha
from ckfmha.reference import (
    attention_reference,
    dropout_keep,
    philox_dropout_randval,
    varlen_attention_reference,
)
from ckfmha.reference_bwd import (
    attention_backward_reference,
    varlen_attention_backward_reference,
)

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch") if ckfmha.device_count() > 0 else None

# Gradients pass through two more rounded products than the forward (P and dS are rounded
# to the input dtype before dV, dK and dQ): bounds on |got - ref| relative to the
# reference's norm, and on the largest error relative to the largest reference value.
REL_L2_TOL = {"fp16": 4e-3, "bf16": 3e-2}
MAX_REL_TOL = {"fp16": 2e-2, "bf16": 1e-1}
ZERO_TOL = {"fp16": 1.5e-2, "bf16": 1e-1}

SEQLEN_PAIRS = [(1, 17), (17, 1), (100, 257), (257, 100), (128, 128), (1, 1)]
VARLEN_Q = [0, 1, 17, 300, 129, 64]
VARLEN_K = [5, 1, 40, 300, 0, 200]


KERNELS = device_kernels("bwd_dq_dk_dv")
KERNEL_IDS = [k["name"] for k in KERNELS]


def _has_deterministic_mode(kernel: dict[str, Any]) -> bool:
    """The sm90 main stage adds dQ with atomics only (fast mode); the dispatcher refuses it a
    deterministic problem."""
    return kernel["pipeline"] != "sm90_tma_wgmma"


def _torch_dtype(name: str) -> Any:
    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]


def _f64(t: Any) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


class Inputs:
    """Random tensors for one case, drawn from a seeded generator."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def normal(self, shape: tuple[int, ...], dtype: Any) -> Any:
        t = torch.randn(shape, generator=self.generator, dtype=torch.float32)
        return t.to(device="cuda", dtype=dtype)


def _feature_options(kernel: dict[str, Any], inputs: Inputs, b: int, hq: int, sq: int,
                     sk: int, dtype: Any) -> dict[str, Any]:  # fmt: skip
    """Bias, ALiBi, soft-cap and dropout as the kernel computes them (the forward's values)."""
    options: dict[str, Any] = {}
    if kernel["bias"] == "elementwise" and kernel["pipeline"] == "sm90_tma_wgmma":
        # The Hopper main stage reads one bias value a key: a bias broadcast over the query
        # rows, random per sequence and head, with each sequence's last 0-7 keys at -inf (key
        # padding; every row still sees a key under the masks the tests draw). Odd sequences
        # pass it expanded over the rows (stride 0), even ones as [b, h, 1, sk].
        bias = inputs.normal((b, hq, 1, sk), dtype)
        for row in range(b):
            padded = int(torch.randint(0, 8, (1,), generator=inputs.generator))
            bias[row, ..., sk - min(padded, sk - 1):] = float("-inf")
        options["bias"] = bias.expand(b, hq, sq, sk) if sk % 2 else bias
    elif kernel["bias"] == "elementwise":
        # Broadcast over the batch: a stride-0 axis must work.
        options["bias"] = inputs.normal((1, hq, sq, sk), dtype).expand(b, hq, sq, sk)
    elif kernel["bias"] == "alibi":
        slopes = torch.rand((hq,), generator=inputs.generator) * 0.5 + 0.01
        options["alibi_slopes"] = slopes.to("cuda")
    if kernel["softcap"]:
        options["softcap"] = 2.5
    if kernel["dropout"]:
        seed = int(torch.randint(0, 2**62, (1,), generator=inputs.generator)) + 2**40
        offset = int(torch.randint(0, 2**40, (1,), generator=inputs.generator)) + 2**33
        options.update(dropout_p=0.3, dropout_seed=seed, dropout_offset=offset)
    return options


def _reference_options(options: dict[str, Any], b: int, hq: int, sq: int,
                       sk: int) -> dict[str, Any]:  # fmt: skip
    """The reference's spelling: arrays on the host, the dropout stream as a keep mask."""
    converted = {k: (_f64(v) if hasattr(v, "detach") else v) for k, v in options.items()}
    if "dropout_seed" in converted:
        randval = philox_dropout_randval(converted.pop("dropout_seed"),
                                         converted.pop("dropout_offset"), b, hq, sq, sk)
        converted["dropout_keep"] = dropout_keep(randval, converted["dropout_p"])  # fmt: skip
    return converted


def _poisoned_like(t: Any) -> Any:
    return torch.full_like(t, float("nan"))


def _compare(dtype: str, got: Any, ref: np.ndarray, what: str) -> None:
    g = _f64(got)
    assert not np.isnan(g).any(), f"unwritten (NaN) elements in {what}"
    ref_norm = np.linalg.norm(ref)
    err = g - ref
    rel = np.linalg.norm(err) / max(ref_norm, 1e-30)
    if ref_norm < 1e-9:
        # (Near-)zeros in the reference: a row that sees one key has dS = P (dP - D) = 0,
        # which the kernels get as the rounding residue of dP - D (D comes from O in the
        # input dtype, which dropout's 1/(1-p) makes inexact).
        worst = np.abs(g).max()
        assert worst < ZERO_TOL[dtype], f"{what} must be ~0, got max {worst:.3e}"
        return
    assert rel < REL_L2_TOL[dtype], f"{what}: relative L2 error {rel:.3e}"
    worst = np.abs(err).max() / max(np.abs(ref).max(), 1e-30)
    assert worst < MAX_REL_TOL[dtype], f"{what}: max error {worst:.3e} of max |ref|"


def _compare_dbias(dtype: str, got: Any, ref: np.ndarray, what: str) -> None:
    """dbias against the reference; where the reference is exactly 0 because P is (masked
    scores, rows past a sequence, group-mode padding) dbias must be exactly 0 too.

    A row that sees a single key is the exception: there dS = P (dP - D) is 0 only in exact
    arithmetic (P = 1, dP = D), and the kernel keeps the rounding residue of dP - D (D comes
    from O in the input dtype) on that one key, within the tolerance for zeros."""
    _compare(dtype, got, ref, what)
    g = _f64(got)
    stray = (ref == 0) & (g != 0)
    one_key_residue = ((ref == 0).all(axis=-1) & ((g != 0).sum(axis=-1) <= 1)
                       & (np.abs(g).max(axis=-1) < ZERO_TOL[dtype]))
    stray[one_key_residue] = False
    assert not stray.any(), (
        f"{what}: {int(stray.sum())} masked/padding elements are non-zero "
        f"(max {np.abs(g[stray]).max():.3e})"
    )


def _dbias_request(kernel: dict[str, Any], like: Any, shape: tuple[int, ...]) -> dict[str, Any]:
    """return_dbias with a NaN-poisoned dbias_out, for kernels that write dbias."""
    if not kernel["dbias"]:
        return {}
    return {"return_dbias": True,
            "dbias_out": torch.full(shape, float("nan"), dtype=like.dtype, device="cuda")}


def _forward_outputs(q, k, v, dtype, **options):
    """The forward's O (rounded to dtype) and LSE (fp32) from the float64 reference."""
    out, lse = attention_reference(_f64(q), _f64(k), _f64(v), **options)
    o = torch.from_numpy(out).to(device="cuda", dtype=dtype)
    # bshd inputs give an LSE view with strided rows; the kernels read contiguous rows.
    lse = np.ascontiguousarray(lse)
    return o, torch.from_numpy(lse).to(device="cuda", dtype=torch.float32)


def _run_batch_case(kernel: dict[str, Any], index: int, sq: int, sk: int, inputs: Inputs,
                    deterministic: bool, heads: tuple[int, int] | None = None) -> None:  # fmt: skip
    dtype = _torch_dtype(kernel["dtype"])
    d, dv = kernel["hdim_q"], kernel["hdim_v"]
    hq, hk = heads or [(4, 4), (4, 2), (6, 1)][index % 3]
    layout = ["bhsd", "bshd"][index % 2]
    b = 2 if sq * sk < 100_000 else 1

    def shape(heads: int, seqlen: int, dim: int) -> tuple[int, ...]:
        return (b, seqlen, heads, dim) if layout == "bshd" else (b, heads, seqlen, dim)

    q = inputs.normal(shape(hq, sq, d), dtype)
    k = inputs.normal(shape(hk, sk, d), dtype)
    v = inputs.normal(shape(hk, sk, dv), dtype)
    do = inputs.normal(shape(hq, sq, dv), dtype)
    scale = 1.0 / math.sqrt(d) * (0.75 if index % 2 else 1.0)
    options = {**mask_options(kernel, index), "scale": scale,
               **_feature_options(kernel, inputs, b, hq, sq, sk, dtype)}  # fmt: skip
    ref_options = _reference_options(options, b, hq, sq, sk)
    o, lse = _forward_outputs(q, k, v, dtype, layout=layout, **ref_options)
    dq, dk, dv_ = (_poisoned_like(t) for t in (q, k, v))
    got = ckfmha.bwd(do, q, k, v, o, lse, layout=layout, dq_out=dq, dk_out=dk, dv_out=dv_,
                     kernel=kernel["name"], deterministic=deterministic, **options,
                     **_dbias_request(kernel, q, (b, hq, sq, sk)))  # fmt: skip
    torch.cuda.synchronize()
    assert got[0].data_ptr() == dq.data_ptr(), "dq_out= must be written in place"
    ref = attention_backward_reference(_f64(q), _f64(k), _f64(v), _f64(do), layout=layout,
                                       **ref_options)  # fmt: skip
    what = f"{kernel['name']} case {index} sq={sq} sk={sk} h={hq}/{hk} {layout} {options}"
    _compare(kernel["dtype"], got[0], ref.dq, "dq " + what)
    _compare(kernel["dtype"], got[1], ref.dk, "dk " + what)
    _compare(kernel["dtype"], got[2], ref.dv, "dv " + what)
    if kernel["dbias"]:
        # The bias broadcasts over the batch (an expanded view), so the reference's gradient
        # is already the full per-batch one the kernel writes.
        _compare_dbias(kernel["dtype"], got[3], ref.dbias, "dbias " + what)


def _offsets(lengths) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def _run_group_case(kernel: dict[str, Any], index: int, inputs: Inputs,
                    deterministic: bool, lengths: tuple[list[int], list[int]] | None = None,
                    heads: tuple[int, int] | None = None) -> None:  # fmt: skip
    dtype = _torch_dtype(kernel["dtype"])
    d, dv = kernel["hdim_q"], kernel["hdim_v"]
    hq, hk = heads or [(4, 2), (3, 3)][index % 2]
    varlen_q, varlen_k = lengths or (VARLEN_Q, VARLEN_K)
    lens_q = np.roll(varlen_q, index)
    lens_k = lens_q if index % 2 else np.roll(varlen_k, index)
    cu_q, cu_k = _offsets(lens_q), _offsets(lens_k)
    max_q, max_k = int(lens_q.max()), int(lens_k.max())
    q = inputs.normal((int(cu_q[-1]), hq, d), dtype)
    k = inputs.normal((int(cu_k[-1]), hk, d), dtype)
    v = inputs.normal((int(cu_k[-1]), hk, dv), dtype)
    do = inputs.normal((int(cu_q[-1]), hq, dv), dtype)
    options = {**mask_options(kernel, index),
               **_feature_options(kernel, inputs, len(lens_q), hq, max_q, max_k, dtype)}
    ref_options = _reference_options(options, len(lens_q), hq, max_q, max_k)
    out, lse = varlen_attention_reference(_f64(q), _f64(k), _f64(v), cu_q, cu_k, **ref_options)
    o = torch.from_numpy(np.nan_to_num(out)).to(device="cuda", dtype=dtype)
    lse_t = torch.from_numpy(lse).to(device="cuda", dtype=torch.float32)
    dq, dk, dv_ = (_poisoned_like(t) for t in (q, k, v))
    got = ckfmha.bwd_varlen(
        do, q, k, v, o, lse_t, torch.from_numpy(cu_q).cuda(), torch.from_numpy(cu_k).cuda(),
        max_seqlen_q=max_q, max_seqlen_k=max_k, dq_out=dq, dk_out=dk, dv_out=dv_,
        kernel=kernel["name"], deterministic=deterministic, **options,
        **_dbias_request(kernel, q, (len(lens_q), hq, max_q, max_k)),
    )  # fmt: skip
    torch.cuda.synchronize()
    ref = varlen_attention_backward_reference(_f64(q), _f64(k), _f64(v), _f64(do), cu_q, cu_k,
                                              **ref_options)  # fmt: skip
    what = f"{kernel['name']} varlen {index} lens_q={list(lens_q)} lens_k={list(lens_k)}"
    _compare(kernel["dtype"], got[0], ref.dq, "dq " + what)
    _compare(kernel["dtype"], got[1], ref.dk, "dk " + what)
    _compare(kernel["dtype"], got[2], ref.dv, "dv " + what)
    if kernel["dbias"]:
        # Each sequence's gradient in its top-left corner, zeros in the padding.
        _compare_dbias(kernel["dtype"], got[3], ref.dbias, "dbias " + what)


@pytest.mark.parametrize("kernel", KERNELS, ids=KERNEL_IDS)
def test_kernel_matches_reference(kernel: dict[str, Any]) -> None:
    inputs = Inputs(zlib.crc32(kernel["name"].encode()))
    exact = _has_deterministic_mode(kernel)
    if kernel["mode"] == "group":
        for index in range(2):
            _run_group_case(kernel, index, inputs, deterministic=exact and index % 2 == 1)
    else:
        for index, (sq, sk) in enumerate(SEQLEN_PAIRS):
            _run_batch_case(kernel, index, sq, sk, inputs,
                            deterministic=exact and index % 3 == 2)  # fmt: skip


# Sizes for the sm90 main stage on top of SEQLEN_PAIRS: several key tiles of 128 (64 at d256) and
# query tiles of 64 (both with ragged ends), causal diagonals crossing tile edges, seqlen_q > seqlen_k
# (bottom-right rows that see no key) and the reverse.
SM90_SEQLEN_PAIRS = [(300, 300), (65, 385), (513, 129), (127, 1000)]
# Group mode on the sm90 main stage: its TMA views span the packed tokens, so a sequence's last
# query and key tiles read the next sequence's rows. Sequences of several tiles with ragged ends
# back to back, short ones between them, one with no queries and one with no keys.
SM90_VARLEN_Q = [385, 1, 129, 0, 700, 64, 257]
SM90_VARLEN_K = [300, 17, 513, 200, 641, 0, 130]


@pytest.mark.parametrize(
    "kernel", [k for k in KERNELS if k["pipeline"] == "sm90_tma_wgmma"],
    ids=[k["name"] for k in KERNELS if k["pipeline"] == "sm90_tma_wgmma"],
)  # fmt: skip
def test_sm90_kernel_multi_tile_cases(kernel: dict[str, Any]) -> None:
    inputs = Inputs(zlib.crc32(kernel["name"].encode()) + 1)
    if kernel["mode"] == "group":
        for index, heads in enumerate([(6, 3), (4, 4), (8, 1), (5, 5)]):
            _run_group_case(kernel, index, inputs, deterministic=False,
                            lengths=(SM90_VARLEN_Q, SM90_VARLEN_K), heads=heads)
        return
    for index, (sq, sk) in enumerate(SM90_SEQLEN_PAIRS):
        _run_batch_case(kernel, index, sq, sk, inputs, deterministic=False)


_SM90_KEY_BIAS = [k for k in KERNELS
                  if k["pipeline"] == "sm90_tma_wgmma" and k["bias"] == "elementwise"]


@pytest.mark.parametrize("kernel", _SM90_KEY_BIAS, ids=[k["name"] for k in _SM90_KEY_BIAS])
def test_sm90_key_bias_kernel_refuses_a_bias_per_query(kernel: dict[str, Any]) -> None:
    """The Hopper main stage reads one bias value a key: forced onto a bias with a row per
    query it refuses, naming what it takes, instead of reading the first row for all."""
    inputs = Inputs(zlib.crc32(kernel["name"].encode()) + 4)
    dtype = _torch_dtype(kernel["dtype"])
    d, dv = kernel["hdim_q"], kernel["hdim_v"]
    b, hq, sq, sk = 1, 2, 64, 128
    q, k = inputs.normal((b, hq, sq, d), dtype), inputs.normal((b, hq, sk, d), dtype)
    v, do = inputs.normal((b, hq, sk, dv), dtype), inputs.normal((b, hq, sq, dv), dtype)
    o = inputs.normal((b, hq, sq, dv), dtype)
    lse = inputs.normal((b, hq, sq), torch.float32)
    options = {**mask_options(kernel, 0), **_feature_options(kernel, inputs, b, hq, sq, sk, dtype),
               "bias": inputs.normal((b, hq, sq, sk), dtype)}
    with pytest.raises(ckfmha.errors.UnsupportedError,
                       match="broadcast over the query rows only"):
        ckfmha.bwd(do, q, k, v, o, lse, kernel=kernel["name"], **options)


_SM90_CAUSAL = [k for k in KERNELS if k["pipeline"] == "sm90_tma_wgmma" and k["mask"] == "causal"]


@pytest.mark.parametrize("kernel", _SM90_CAUSAL, ids=[k["name"] for k in _SM90_CAUSAL])
def test_sm90_causal_launch_order_covers_every_key_tile(kernel: dict[str, Any]) -> None:
    """Causal grids launch their (KV head, batch) pairs in chunks on a one-dimensional grid
    (bwd_launch_order.hpp). With 64 queries over 6000 keys aligned bottom-right, every key tile
    sees every query, and six pairs on an H100 make: at d128 (47 key tiles) chunks of two
    pairs; at d64 (47) and d256 (94) one-pair chunks and then a last chunk of three (two at
    d256). Top-left, only the first key tile sees a query, and at d64 and d256 one chunk holds
    all six. A key
    tile no CTA owns would leave its NaN-poisoned dK and dV rows; a pair taken twice, doubled
    dQ rows."""
    inputs = Inputs(zlib.crc32(kernel["name"].encode()) + 2)
    if kernel["mode"] == "group":
        # The grid is sized by the longest sequence; the others' CTAs past their keys own none.
        for index in (0, 2):  # top-left, keys longer than queries in every sequence
            _run_group_case(kernel, index, inputs, deterministic=False, heads=(6, 3),
                            lengths=([64, 100, 30], [6000, 5000, 300]))
        return
    for index in range(2):  # top-left (most key tiles see no query) and bottom-right
        _run_batch_case(kernel, index, 64, 6000, inputs, deterministic=False, heads=(12, 6))


_SM90_PLAIN_BATCH = [
    k for k in KERNELS
    if k["pipeline"] == "sm90_tma_wgmma" and k["mode"] == "batch" and k["bias"] == "none"
    and not (k["dropout"] or k["softcap"])
]  # fmt: skip
# Fast mode adds dQ with fp32 atomics in no fixed order, so calls on the same inputs differ by
# rounding: at most 2.2e-5 relative L2 on 16k-token bf16 problems at every head dim but 96
# (NOTES 95), whose 1e-3-1e-2 held it back. The bound leaves a factor of 9 for rounding.
REPEAT_REL_L2_TOL = 2e-4


@pytest.mark.parametrize("kernel", _SM90_PLAIN_BATCH, ids=[k["name"] for k in _SM90_PLAIN_BATCH])
def test_sm90_gradients_repeat_to_rounding(kernel: dict[str, Any]) -> None:
    """The same large GQA problem run eight times: every call's dQ, dK and dV match the first's
    to rounding. A race inside a CTA shows here as a wrong block in some calls, where the
    float64 cases (small problems, one call) can miss it. O is random and the LSE the unmasked
    log-sum-exp, an upper bound of the masked one, so every P stays finite."""
    dtype = _torch_dtype(kernel["dtype"])
    d, dv = kernel["hdim_q"], kernel["hdim_v"]
    inputs = Inputs(zlib.crc32(kernel["name"].encode()) + 3)
    b, hq, hk, s = 2, 32, 4, 3000
    q, do = inputs.normal((b, hq, s, d), dtype), inputs.normal((b, hq, s, dv), dtype)
    k, v = inputs.normal((b, hk, s, d), dtype), inputs.normal((b, hk, s, dv), dtype)
    o = inputs.normal((b, hq, s, dv), dtype)
    scale = 1.0 / math.sqrt(d)
    lse = torch.empty((b, hq, s), device="cuda", dtype=torch.float32)
    for h in range(hq):  # one head at a time: the full scores of all heads take 4.6 GB
        keys = k[:, h // (hq // hk)].float()
        lse[:, h] = torch.logsumexp(q[:, h].float() @ keys.transpose(-1, -2) * scale, dim=-1)
    options = {**mask_options(kernel, 1), "scale": scale}
    first = None
    for call in range(8):
        got = ckfmha.bwd(do, q, k, v, o, lse, kernel=kernel["name"], **options)[:3]
        torch.cuda.synchronize()
        if first is None:
            first = [t.float().clone() for t in got]
            assert all(torch.isfinite(t).all() for t in first), "non-finite gradients"
            continue
        for name, t, f in zip(("dq", "dk", "dv"), got, first, strict=True):
            rel = float((t.float() - f).norm() / f.norm())
            assert rel < REPEAT_REL_L2_TOL, f"call {call}: {name} differs from call 0 by {rel:.2e}"


def _first(exact: bool = False, **wanted: Any) -> dict[str, Any]:
    """The first kernel with the `wanted` fields (and deterministic mode, when `exact`)."""
    for kernel in KERNELS:
        if exact and not _has_deterministic_mode(kernel):
            continue
        if all(kernel[key] == value for key, value in wanted.items()):
            return kernel
    pytest.skip(f"no backward kernel with {wanted}")


@pytest.mark.skipif(not KERNELS, reason="no backward kernel for this device")
@pytest.mark.parametrize("mode", ["batch", "group"])
def test_deterministic_mode_is_bit_identical_across_runs(mode: str) -> None:
    kernel = _first(exact=True, mode=mode, bias="none", dropout=False, softcap=False)
    dtype = _torch_dtype(kernel["dtype"])
    d, dv = kernel["hdim_q"], kernel["hdim_v"]
    inputs = Inputs(11)
    options = mask_options(kernel, 1)
    # Long enough that several key tiles add to every dQ row from different CTAs.
    if mode == "batch":
        b, hq, hk, s = 2, 4, 2, 1000
        q, do = inputs.normal((b, hq, s, d), dtype), inputs.normal((b, hq, s, dv), dtype)
        k, v = inputs.normal((b, hk, s, d), dtype), inputs.normal((b, hk, s, dv), dtype)
        o, lse = _forward_outputs(q, k, v, dtype, **options)

        def run() -> tuple[Any, ...]:
            return ckfmha.bwd(do, q, k, v, o, lse, kernel=kernel["name"], deterministic=True,
                              **options)  # fmt: skip
    else:
        lens = np.array([700, 0, 1000, 33])
        cu = torch.from_numpy(_offsets(lens)).cuda()
        hq, hk, total = 4, 2, int(lens.sum())
        q, do = inputs.normal((total, hq, d), dtype), inputs.normal((total, hq, dv), dtype)
        k, v = inputs.normal((total, hk, d), dtype), inputs.normal((total, hk, dv), dtype)
        out, lse_np = varlen_attention_reference(_f64(q), _f64(k), _f64(v), cu.cpu().numpy(),
                                                 cu.cpu().numpy(), **options)  # fmt: skip
        o = torch.from_numpy(np.nan_to_num(out)).to(device="cuda", dtype=dtype)
        lse = torch.from_numpy(lse_np).to(device="cuda", dtype=torch.float32)

        def run() -> tuple[Any, ...]:
            return ckfmha.bwd_varlen(do, q, k, v, o, lse, cu, cu, max_seqlen_q=1000,
                                     max_seqlen_k=1000, kernel=kernel["name"],
                                     deterministic=True, **options)  # fmt: skip

    first, second = run(), run()
    for a, b_ in zip(first, second):
        assert torch.equal(a, b_), "deterministic mode must give bit-identical gradients"


def _has_fwd(kernel: dict[str, Any]) -> bool:
    try:
        ckfmha.Dispatcher().select(batch=1, nhead_q=1, seqlen_q=64, hdim=kernel["hdim_q"],
                                   hdim_v=kernel["hdim_v"], dtype=kernel["dtype"], lse=True)
    except ckfmha.CkfmhaError:
        return False
    return True


@pytest.mark.skipif(not KERNELS, reason="no backward kernel for this device")
def test_fast_and_deterministic_modes_agree() -> None:
    kernel = _first(exact=True, mode="batch", bias="none", dropout=False, softcap=False)
    dtype = _torch_dtype(kernel["dtype"])
    inputs = Inputs(12)
    q = inputs.normal((1, 2, 600, kernel["hdim_q"]), dtype)
    k = inputs.normal((1, 2, 600, kernel["hdim_q"]), dtype)
    v = inputs.normal((1, 2, 600, kernel["hdim_v"]), dtype)
    do = inputs.normal((1, 2, 600, kernel["hdim_v"]), dtype)
    options = mask_options(kernel, 0)
    o, lse = _forward_outputs(q, k, v, dtype, **options)
    fast = ckfmha.bwd(do, q, k, v, o, lse, kernel=kernel["name"], **options)
    exact = ckfmha.bwd(do, q, k, v, o, lse, kernel=kernel["name"], deterministic=True, **options)
    # dK and dV never use atomics; dQ differs only by the order of fp32 additions.
    assert torch.equal(fast[1], exact[1]) and torch.equal(fast[2], exact[2])
    assert torch.allclose(fast[0].float(), exact[0].float(), rtol=1e-2, atol=1e-2)


@pytest.mark.skipif(not KERNELS, reason="no backward kernel for this device")
def test_automatic_selection_numpy_inputs() -> None:
    kernel = _first(mode="batch", mask="none", bias="none", dropout=False, softcap=False)
    rng = np.random.default_rng()
    np_dtype = np.float16
    if kernel["dtype"] != "fp16":
        pytest.skip("NumPy has no bf16")
    d = kernel["hdim_q"]
    q, k, v, do = (rng.standard_normal((1, 2, n, d)).astype(np_dtype) for n in (33, 70, 70, 33))
    out, lse = attention_reference(q.astype(np.float64), k.astype(np.float64),
                                   v.astype(np.float64))  # fmt: skip
    dq, dk, dv = ckfmha.bwd(do, q, k, v, out.astype(np_dtype), lse.astype(np.float32))
    assert dv.shape == v.shape
    assert isinstance(dq, np.ndarray) and dq.dtype == np_dtype and dk.shape == k.shape
    ref = attention_backward_reference(q, k, v, do)
    _compare("fp16", torch.from_numpy(dq), ref.dq, "dq numpy")


@pytest.mark.skipif(not KERNELS, reason="no backward kernel for this device")
def test_unsupported_backward_names_the_missing_stage() -> None:
    q = torch.randn(1, 2, 16, 72, device="cuda", dtype=torch.float16)
    lse = torch.zeros(1, 2, 16, device="cuda")
    with pytest.raises(ckfmha.UnsupportedError, match="bwd_dq_dk_dv"):
        ckfmha.bwd(q, q, q, q, q, lse)


def _autograd_kernel() -> dict[str, Any]:
    for kernel in KERNELS:
        plain = kernel["bias"] == "none" and not kernel["dropout"] and not kernel["softcap"]
        if kernel["mode"] == "batch" and kernel["mask"] == "causal" and plain and _has_fwd(kernel):
            return kernel
    pytest.skip("no causal batch-mode backward kernel with a matching forward kernel")


@pytest.mark.skipif(not KERNELS, reason="no backward kernel for this device")
def test_torch_autograd_matches_reference_gradients() -> None:
    import ckfmha.torch

    kernel = _autograd_kernel()
    dtype = _torch_dtype(kernel["dtype"])
    d = kernel["hdim_q"]
    inputs = Inputs(13)
    q = inputs.normal((2, 4, 130, d), dtype).requires_grad_()
    k = inputs.normal((2, 2, 150, d), dtype).requires_grad_()
    v = inputs.normal((2, 2, 150, kernel["hdim_v"]), dtype).requires_grad_()
    out = ckfmha.torch.attention(q, k, v, causal=True, causal_alignment="bottom_right")
    weights = inputs.normal(tuple(out.shape), dtype)
    (out.float() * weights.float()).sum().backward()
    ref = attention_backward_reference(_f64(q), _f64(k), _f64(v), _f64(weights), causal=True,
                                       causal_alignment="bottom_right")  # fmt: skip
    _compare(kernel["dtype"], q.grad, ref.dq, "autograd dq")
    _compare(kernel["dtype"], k.grad, ref.dk, "autograd dk")
    _compare(kernel["dtype"], v.grad, ref.dv, "autograd dv")
    # The same gradients as torch's own attention in float32 (a gradcheck-style comparison).
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    kr, vr = (t.repeat_interleave(2, dim=1) for t in (kf, vf))
    mask = torch.ones(130, 150, dtype=torch.bool, device="cuda").tril(diagonal=150 - 130)
    expected = torch.nn.functional.scaled_dot_product_attention(qf, kr, vr, attn_mask=mask)
    (expected * weights.float()).sum().backward()
    for got, want in ((q.grad, qf.grad), (k.grad, kf.grad), (v.grad, vf.grad)):
        rel = (got.float() - want).norm() / want.norm()
        assert rel < REL_L2_TOL[kernel["dtype"]], f"relative error {rel:.3e} against torch"


def _hopper_kernels() -> list[dict[str, Any]]:
    """The sm90 main stages of plain batch-mode problems (no bias, dropout or soft-cap; one head
    dim), which the tests below describe by their mask alone."""
    return [k for k in KERNELS if k["pipeline"] == "sm90_tma_wgmma" and k["mode"] == "batch"
            and k["bias"] == "none" and not k["dropout"] and not k["softcap"]
            and k["hdim_q"] == k["hdim_v"]]  # fmt: skip


@pytest.mark.skipif(not _hopper_kernels(), reason="no sm90 backward kernel for this device")
def test_sm90_kernel_refuses_deterministic_mode_with_a_reason() -> None:
    kernel = _hopper_kernels()[0]
    dtype = _torch_dtype(kernel["dtype"])
    q = torch.randn(1, 2, 16, kernel["hdim_q"], device="cuda", dtype=dtype)
    lse = torch.zeros(1, 2, 16, device="cuda")
    with pytest.raises(ckfmha.UnsupportedError, match="fp32 atomics"):
        ckfmha.bwd(q, q, q, q, q, lse, kernel=kernel["name"], deterministic=True,
                   **mask_options(kernel, 0))  # fmt: skip


@pytest.mark.skipif(not _hopper_kernels(), reason="no sm90 backward kernel for this device")
def test_automatic_selection_prefers_the_sm90_main_stage() -> None:
    kernel = next((k for k in _hopper_kernels() if k["mask"] != "window"), None)
    if kernel is None:
        pytest.skip("no sm90 main stage for an unmasked or causal problem in this build")
    fields = {"batch": 2, "nhead_q": 4, "nhead_k": 2, "seqlen_q": 300, "seqlen_k": 300,
              "hdim": kernel["hdim_q"], "dtype": kernel["dtype"],
              "causal": kernel["mask"] == "causal"}  # fmt: skip
    plan = ckfmha.Dispatcher().select_bwd(**fields)
    assert plan[1] == kernel["name"], plan
    # Automatic selection runs it and gets the reference gradients.
    dtype = _torch_dtype(kernel["dtype"])
    d = kernel["hdim_q"]
    inputs = Inputs(14)
    q, do = inputs.normal((2, 4, 300, d), dtype), inputs.normal((2, 4, 300, d), dtype)
    k, v = inputs.normal((2, 2, 300, d), dtype), inputs.normal((2, 2, 300, d), dtype)
    options = mask_options(kernel, 1)
    o, lse = _forward_outputs(q, k, v, dtype, **options)
    got = ckfmha.bwd(do, q, k, v, o, lse, **options)
    ref = attention_backward_reference(_f64(q), _f64(k), _f64(v), _f64(do), **options)
    for name, g, r in zip(("dq", "dk", "dv"), got, (ref.dq, ref.dk, ref.dv)):
        _compare(kernel["dtype"], g, r, f"{name} automatic {plan[1]} {options}")


# ---- dbias (elementwise bias gradient)


@pytest.mark.skipif(not KERNELS, reason="no backward kernel for this device")
def test_dbias_is_bit_identical_across_runs_and_modes() -> None:
    """dbias is stored once per element with no atomics: two deterministic runs, and a fast
    one, give the same bits (over several key tiles, GQA and a causal diagonal)."""
    kernel = _first(exact=True, mode="batch", dbias=True, mask="causal")
    dtype = _torch_dtype(kernel["dtype"])
    d, dv = kernel["hdim_q"], kernel["hdim_v"]
    inputs = Inputs(21)
    b, hq, hk, sq, sk = 2, 4, 2, 301, 517
    q, do = inputs.normal((b, hq, sq, d), dtype), inputs.normal((b, hq, sq, dv), dtype)
    k, v = inputs.normal((b, hk, sk, d), dtype), inputs.normal((b, hk, sk, dv), dtype)
    bias = inputs.normal((b, hq, sq, sk), dtype)
    options = {"causal": True, "causal_alignment": "bottom_right", "bias": bias}
    o, lse = _forward_outputs(q, k, v, dtype, causal=True, causal_alignment="bottom_right",
                              bias=_f64(bias))  # fmt: skip

    def run(deterministic: bool) -> tuple[Any, ...]:
        dbias = torch.full((b, hq, sq, sk), float("nan"), dtype=dtype, device="cuda")
        return ckfmha.bwd(do, q, k, v, o, lse, kernel=kernel["name"], return_dbias=True,
                          dbias_out=dbias, deterministic=deterministic, **options)  # fmt: skip

    first, second, fast = run(True), run(True), run(False)
    for a, b_ in zip(first, second):
        assert torch.equal(a, b_), "deterministic mode must give bit-identical gradients"
    assert torch.equal(first[3], fast[3]), "dbias must not depend on the dQ mode"
    ref = attention_backward_reference(_f64(q), _f64(k), _f64(v), _f64(do), causal=True,
                                       causal_alignment="bottom_right", bias=_f64(bias))
    _compare_dbias(kernel["dtype"], first[3], ref.dbias, f"dbias {kernel['name']} multi-tile")


def _dbias_autograd_kernel() -> dict[str, Any]:
    for kernel in KERNELS:
        if kernel["dbias"] and kernel["mode"] == "batch" and not kernel["softcap"]:
            try:
                ckfmha.Dispatcher().select(batch=1, nhead_q=1, seqlen_q=64,
                                           hdim=kernel["hdim_q"], hdim_v=kernel["hdim_v"],
                                           dtype=kernel["dtype"], bias="elementwise",
                                           causal=kernel["mask"] == "causal", lse=True)
            except ckfmha.CkfmhaError:
                continue
            return kernel
    pytest.skip("no batch-mode dbias kernel with a matching forward kernel")


@pytest.mark.skipif(not KERNELS, reason="no backward kernel for this device")
@pytest.mark.parametrize("bias_shape", ["full", "heads", "batch", "batch_heads"])
def test_torch_autograd_bias_gradient(bias_shape: str) -> None:
    """ckfmha.torch returns the bias gradient, summed over the axes a bias broadcasts along."""
    import ckfmha.torch

    kernel = _dbias_autograd_kernel()
    dtype = _torch_dtype(kernel["dtype"])
    d = kernel["hdim_q"]
    causal = kernel["mask"] == "causal"
    b, hq, hk, sq, sk = 2, 4, 2, 77, 203
    inputs = Inputs(22)
    q = inputs.normal((b, hq, sq, d), dtype).requires_grad_()
    k = inputs.normal((b, hk, sk, d), dtype).requires_grad_()
    v = inputs.normal((b, hk, sk, kernel["hdim_v"]), dtype).requires_grad_()
    shape = {"full": (b, hq, sq, sk), "heads": (b, 1, sq, sk), "batch": (1, hq, sq, sk),
             "batch_heads": (1, 1, sq, sk)}[bias_shape]  # fmt: skip
    bias = inputs.normal(shape, dtype).requires_grad_()
    out = ckfmha.torch.attention(q, k, v, causal=causal, bias=bias)
    weights = inputs.normal(tuple(out.shape), dtype)
    (out.float() * weights.float()).sum().backward()
    ref = attention_backward_reference(_f64(q), _f64(k), _f64(v), _f64(weights), causal=causal,
                                       bias=_f64(bias))  # fmt: skip
    assert bias.grad is not None and bias.grad.shape == bias.shape
    what = f"autograd dbias {bias_shape} {kernel['name']}"
    _compare(kernel["dtype"], bias.grad, ref.dbias, what)
    _compare(kernel["dtype"], q.grad, ref.dq, "autograd dq with bias")
    # A bias that does not require grad asks for no dbias: that plan needs a kernel without
    # it, which a build may lack (then the error says which kernels exist).
    q.grad = None
    plain_bias = bias.detach()
    out = ckfmha.torch.attention(q, k, v, causal=causal, bias=plain_bias)
    try:
        (out.float() * weights.float()).sum().backward()
    except ckfmha.UnsupportedError as error:
        assert "no compiled bwd_dq_dk_dv kernel fits" in str(error)
        assert not any(k["bias"] == "elementwise" and not k["dbias"] and not k["softcap"]
                       and not k["dropout"] and k["dtype"] == kernel["dtype"]
                       and k["hdim_q"] == d and k["mode"] == "batch" for k in KERNELS), error
    else:
        _compare(kernel["dtype"], q.grad, ref.dq, "autograd dq, bias without grad")


@pytest.mark.skipif(not KERNELS, reason="no backward kernel for this device")
def test_return_dbias_argument_errors() -> None:
    q = torch.randn(1, 2, 16, 64, device="cuda", dtype=torch.float16)
    lse = torch.zeros(1, 2, 16, device="cuda")
    with pytest.raises(ckfmha.InvalidArgumentError, match="return_dbias needs an elementwise"):
        ckfmha.bwd(q, q, q, q, q, lse, return_dbias=True)
    with pytest.raises(ckfmha.InvalidArgumentError, match="return_dbias needs an elementwise"):
        ckfmha.bwd(q, q, q, q, q, lse, return_dbias=True,
                   alibi_slopes=torch.ones(2, device="cuda"))  # fmt: skip
    with pytest.raises(ckfmha.InvalidArgumentError, match="dbias_out is given but"):
        ckfmha.bwd(q, q, q, q, q, lse, bias=torch.zeros(1, 2, 16, 16, device="cuda",
                   dtype=torch.float16), dbias_out=torch.zeros(1, 2, 16, 16, device="cuda"))
    bias = torch.zeros(1, 2, 16, 16, device="cuda", dtype=torch.float16)
    with pytest.raises(ckfmha.InvalidArgumentError, match="dbias_out must have shape"):
        ckfmha.bwd(q, q, q, q, q, lse, bias=bias, return_dbias=True,
                   dbias_out=torch.zeros(1, 1, 16, 16, device="cuda", dtype=torch.float16))
    broadcast = torch.zeros(1, 2, 16, 16, device="cuda", dtype=torch.float16).expand(3, 2, 16, 16)
    q3 = torch.randn(3, 2, 16, 64, device="cuda", dtype=torch.float16)
    # A zero-stride dbias would have several writers per element: refused (by the C API's
    # stride check, or earlier if the view itself is refused as an output).
    with pytest.raises(ckfmha.InvalidArgumentError, match="dbias"):
        ckfmha.bwd(q3, q3, q3, q3, q3, torch.zeros(3, 2, 16, device="cuda"), bias=bias,
                   return_dbias=True, dbias_out=broadcast)  # fmt: skip


# ---- attention sinks: dq, dk, dv from a sink-inclusive LSE, and dsink

# O reaches the kernels rounded to the input dtype, so each D = rowsum(dO * O) they form is off
# by at most u * rowsum(|dO * O|) from the reference's (u: the dtype's unit roundoff).
UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8}
# dsink against the same sum formed in float64 from the rounded O the kernels read: fp32
# accumulation and exp2 of the log2-domain LSE, relative to sum(share * |dO * O|).
DSINK_SUM_TOL = 1e-4


def _sink_logits(inputs: Inputs, hq: int) -> Any:
    """fp32 [hq] sinks spread so the sink takes from ~0.1% to most of a row's softmax."""
    t = torch.rand((hq,), generator=inputs.generator) * 7.0 - 2.0
    return t.to("cuda")


def _selection_fields(options: dict[str, Any]) -> dict[str, Any]:
    """FwdProblem features of ckfmha.bwd keyword arguments, for Dispatcher.select_bwd."""
    fields = {k: options[k] for k in ("causal", "causal_alignment", "window", "softcap",
                                      "dropout_p") if k in options}  # fmt: skip
    if "alibi_slopes" in options:
        fields["bias"] = "alibi"
    elif "bias" in options:
        fields["bias"] = "elementwise"
    return fields


def _sink_kernel(deterministic: bool, **fields: Any) -> str:
    """The bwd_dq_dk_dv kernel the dispatcher picks among the registered ones (never compiled
    on first use here: the case is skipped when the build lacks it)."""
    try:
        plan = ckfmha.Dispatcher().select_bwd(sink=True, deterministic=deterministic, **fields)
    except ckfmha.UnsupportedError:
        pytest.skip(f"no registered backward kernel for {fields}")
    return plan[1]


def _head_rows(x: np.ndarray, layout: str) -> np.ndarray:
    """[b, h, s, d] (bhsd) or [b, s, h, d] (bshd) as [h, b * s, d]."""
    x = x.transpose(1, 0, 2, 3) if layout == "bhsd" else x.transpose(2, 0, 1, 3)
    return x.reshape(x.shape[0], -1, x.shape[-1])


def _check_dsink(dtype: str, got: Any, ref_dsink: np.ndarray, sink: np.ndarray,
                 lse_rows: np.ndarray, do_rows: np.ndarray, o_rows: np.ndarray,
                 o_exact_rows: np.ndarray, what: str) -> None:  # fmt: skip
    """dsink against the float64 reference (within what O's rounding to the dtype allows) and
    against the same sum over the rounded O the kernels read (tightly: a row left out or
    counted twice shows). Rows are [hq, rows(, dv)]; lse_rows is the reference's LSE."""
    g = _f64(got)
    assert not np.isnan(g).any(), f"unwritten (NaN) dsink: {what}"
    share = np.exp(sink[:, None] - lse_rows)
    scale = (share * np.abs(do_rows * o_exact_rows).sum(-1)).sum(-1)
    from_rounded_o = -(share * (do_rows * o_rows).sum(-1)).sum(-1)
    tight = DSINK_SUM_TOL * scale + 1e-6
    assert (np.abs(g - from_rounded_o) <= tight).all(), (
        f"dsink {what}: got {g}, want {from_rounded_o} from the rounded O (tolerance {tight})")
    loose = (UNIT_ROUNDOFF[dtype] + DSINK_SUM_TOL) * scale + 1e-6
    assert (np.abs(g - ref_dsink) <= loose).all(), (
        f"dsink {what}: got {g}, float64 reference {ref_dsink} (tolerance {loose})")


def _check_batch_dsink(dtype: str, got: Any, ref: Any, sink: Any, do: Any, o: Any,
                       layout: str, what: str) -> None:  # fmt: skip
    """_check_dsink for batch-mode tensors (``ref``: the reference's AttentionGrads)."""
    hq = ref.dsink.shape[0]
    _check_dsink(dtype, got, ref.dsink, _f64(sink), ref.lse.transpose(1, 0, 2).reshape(hq, -1),
                 _head_rows(_f64(do), layout), _head_rows(_f64(o), layout),
                 _head_rows(ref.o, layout), what)  # fmt: skip


def _kernel_features(features: dict[str, Any]) -> dict[str, Any]:
    """A case's features in the fields of a kernel dict, as _feature_options reads them."""
    return {"bias": features.get("bias", "none"), "softcap": features.get("softcap", False),
            "dropout": features.get("dropout", False)}  # fmt: skip


def _nan_dsink(hq: int) -> Any:
    return torch.full((hq,), float("nan"), dtype=torch.float32, device="cuda")


SINK_BATCH_CASES = [
    # dtype, hdim, (hq, hk), (sq, sk), mask, features, layout
    pytest.param("fp16", 64, (8, 2), (77, 300), {"causal": True}, {}, "bhsd",
                 id="fp16-d64-gqa-causal_tl-77x300"),
    pytest.param("bf16", 128, (8, 2), (300, 77),
                 {"causal": True, "causal_alignment": "bottom_right"}, {}, "bshd",
                 id="bf16-d128-gqa-causal_br-300x77"),
    pytest.param("fp16", 128, (4, 4), (1, 300), {}, {}, "bhsd", id="fp16-d128-none-1x300"),
    pytest.param("bf16", 64, (8, 2), (300, 1), {}, {}, "bhsd", id="bf16-d64-gqa-none-300x1"),
    pytest.param("bf16", 64, (4, 1), (1, 1), {"causal": True}, {}, "bshd",
                 id="bf16-d64-mqa-causal-1x1"),
    pytest.param("fp16", 64, (8, 2), (77, 300),
                 {"window": (100, 3), "causal_alignment": "bottom_right"}, {}, "bhsd",
                 id="fp16-d64-gqa-window_br-77x300"),
    pytest.param("bf16", 128, (8, 2), (300, 300), {"window": (16, 0)}, {}, "bhsd",
                 id="bf16-d128-gqa-window-300x300"),
    pytest.param("fp16", 128, (8, 2), (77, 300), {"window": (100, 3)}, {"dropout": True},
                 "bhsd", id="fp16-d128-gqa-window-dropout-77x300"),
    pytest.param("bf16", 64, (8, 2), (300, 77), {"causal": True}, {"softcap": True}, "bshd",
                 id="bf16-d64-gqa-causal-softcap-300x77"),
    pytest.param("fp16", 64, (8, 2), (77, 77), {"causal": True}, {"bias": "alibi"}, "bhsd",
                 id="fp16-d64-gqa-causal-alibi-77x77"),
]  # fmt: skip


@pytest.mark.parametrize(("dtype", "hdim", "heads", "lengths", "mask", "features", "layout"),
                         SINK_BATCH_CASES)  # fmt: skip
def test_sink_gradient_batch_mode(dtype: str, hdim: int, heads: tuple[int, int],
                                  lengths: tuple[int, int], mask: dict[str, Any],
                                  features: dict[str, Any], layout: str) -> None:  # fmt: skip
    """dsink and dq, dk, dv of a forward with sinks, outputs NaN-poisoned first."""
    tdtype = _torch_dtype(dtype)
    (hq, hk), (sq, sk) = heads, lengths
    b = 2
    inputs = Inputs(zlib.crc32(repr((dtype, hdim, heads, lengths, mask, features)).encode()))

    def shape(heads: int, seqlen: int) -> tuple[int, ...]:
        return (b, seqlen, heads, hdim) if layout == "bshd" else (b, heads, seqlen, hdim)

    q, k, v, do = (inputs.normal(shape(h, s), tdtype) for h, s in ((hq, sq), (hk, sk),
                                                                   (hk, sk), (hq, sq)))
    sink = _sink_logits(inputs, hq)
    options = {**mask, **_feature_options(_kernel_features(features), inputs, b, hq, sq, sk,
                                           tdtype)}  # fmt: skip
    ref_options = {**_reference_options(options, b, hq, sq, sk), "sink": _f64(sink)}
    kernel = _sink_kernel(False, batch=b, nhead_q=hq, nhead_k=hk, seqlen_q=sq, seqlen_k=sk,
                          hdim=hdim, dtype=dtype, layout=layout, **_selection_fields(options))
    o, lse = _forward_outputs(q, k, v, tdtype, layout=layout, **ref_options)
    dq, dk, dv = (_poisoned_like(t) for t in (q, k, v))
    dsink = _nan_dsink(hq)
    # The single-query case hands the sinks over as a host array, staged like ALiBi slopes.
    sink_arg = sink.cpu().numpy() if sq == 1 else sink
    got = ckfmha.bwd(do, q, k, v, o, lse, layout=layout, dq_out=dq, dk_out=dk, dv_out=dv,
                     sink=sink_arg, return_dsink=True, dsink_out=dsink, kernel=kernel,
                     **options)  # fmt: skip
    torch.cuda.synchronize()
    assert len(got) == 4 and got[3] is dsink, "dsink follows dq, dk, dv; dsink_out= in place"
    ref = attention_backward_reference(_f64(q), _f64(k), _f64(v), _f64(do), layout=layout,
                                       **ref_options)  # fmt: skip
    what = f"{kernel} b={b} h={hq}/{hk} sq={sq} sk={sk} {layout} {mask} {features}"
    _compare(dtype, got[0], ref.dq, "dq " + what)
    _compare(dtype, got[1], ref.dk, "dk " + what)
    _compare(dtype, got[2], ref.dv, "dv " + what)
    _check_batch_dsink(dtype, dsink, ref, sink, do, o, layout, what)


def _offsets_cuda(lengths) -> Any:
    return torch.from_numpy(_offsets(lengths)).cuda()


# A sequence of one query and no key (o = 0, LSE = the sink), one of no query, odd lengths.
SINK_VARLEN_Q = [77, 0, 1, 300, 5]
SINK_VARLEN_K = [300, 7, 0, 77, 5]


def _run_sink_varlen(dtype: str, hdim: int, heads: tuple[int, int], mask: dict[str, Any],
                     features: dict[str, Any], deterministic: bool,
                     inputs: Inputs) -> tuple[Any, ...]:  # fmt: skip
    """bwd_varlen with sinks over SINK_VARLEN_Q/K, checked against the reference; returns
    its outputs."""
    tdtype = _torch_dtype(dtype)
    hq, hk = heads
    lens_q, lens_k = np.array(SINK_VARLEN_Q), np.array(SINK_VARLEN_K)
    cu_q, cu_k = _offsets(lens_q), _offsets(lens_k)
    max_q, max_k, batch = int(lens_q.max()), int(lens_k.max()), len(lens_q)
    total_q, total_k = int(cu_q[-1]), int(cu_k[-1])
    q, do = inputs.normal((total_q, hq, hdim), tdtype), inputs.normal((total_q, hq, hdim), tdtype)
    k, v = inputs.normal((total_k, hk, hdim), tdtype), inputs.normal((total_k, hk, hdim), tdtype)
    sink = _sink_logits(inputs, hq)
    options = {**mask, **_feature_options(_kernel_features(features), inputs, batch, hq, max_q,
                                           max_k, tdtype)}  # fmt: skip
    ref_options = {**_reference_options(options, batch, hq, max_q, max_k), "sink": _f64(sink)}
    kernel = _sink_kernel(deterministic, batch=batch, nhead_q=hq, nhead_k=hk, seqlen_q=max_q,
                          seqlen_k=max_k, hdim=hdim, dtype=dtype, mode="group",
                          total_q=total_q, total_k=total_k, **_selection_fields(options))
    out, lse = varlen_attention_reference(_f64(q), _f64(k), _f64(v), cu_q, cu_k, **ref_options)
    o = torch.from_numpy(np.nan_to_num(out)).to(device="cuda", dtype=tdtype)
    lse_t = torch.from_numpy(lse).to(device="cuda", dtype=torch.float32)
    dq, dk, dv = (_poisoned_like(t) for t in (q, k, v))
    got = ckfmha.bwd_varlen(
        do, q, k, v, o, lse_t, _offsets_cuda(lens_q), _offsets_cuda(lens_k), max_seqlen_q=max_q,
        max_seqlen_k=max_k, dq_out=dq, dk_out=dk, dv_out=dv, sink=sink, return_dsink=True,
        dsink_out=_nan_dsink(hq), kernel=kernel, deterministic=deterministic, **options,
    )  # fmt: skip
    torch.cuda.synchronize()
    ref = varlen_attention_backward_reference(_f64(q), _f64(k), _f64(v), _f64(do), cu_q, cu_k,
                                              **ref_options)  # fmt: skip
    what = f"{kernel} varlen h={hq}/{hk} lens_q={SINK_VARLEN_Q} lens_k={SINK_VARLEN_K} {mask}"
    _compare(dtype, got[0], ref.dq, "dq " + what)
    _compare(dtype, got[1], ref.dk, "dk " + what)
    _compare(dtype, got[2], ref.dv, "dv " + what)
    _check_dsink(dtype, got[3], ref.dsink, _f64(sink), ref.lse, _f64(do).transpose(1, 0, 2),
                 _f64(o).transpose(1, 0, 2), np.nan_to_num(out).transpose(1, 0, 2), what)
    return got


SINK_VARLEN_CASES = [
    pytest.param("fp16", 64, (8, 2), {"window": (100, 3), "causal_alignment": "bottom_right"},
                 {}, id="fp16-d64-gqa-window_br"),
    pytest.param("bf16", 128, (8, 2), {"causal": True}, {}, id="bf16-d128-gqa-causal_tl"),
    pytest.param("bf16", 64, (4, 4), {}, {}, id="bf16-d64-none"),
    pytest.param("fp16", 128, (8, 2), {"causal": True, "causal_alignment": "bottom_right"},
                 {"bias": "alibi", "dropout": True, "softcap": True},
                 id="fp16-d128-gqa-causal_br-alibi-dropout-softcap"),
]  # fmt: skip


@pytest.mark.parametrize(("dtype", "hdim", "heads", "mask", "features"), SINK_VARLEN_CASES)
def test_sink_gradient_group_mode(dtype: str, hdim: int, heads: tuple[int, int],
                                  mask: dict[str, Any], features: dict[str, Any]) -> None:
    inputs = Inputs(zlib.crc32(repr((dtype, hdim, heads, mask, features)).encode()))
    _run_sink_varlen(dtype, hdim, heads, mask, features, False, inputs)


@pytest.mark.parametrize("mode", ["batch", "group"])
def test_sink_gradient_is_bit_identical_across_runs_and_modes(mode: str) -> None:
    """dsink is reduced in a fixed order: two deterministic runs give the same bits as each
    other and as fast mode (which only changes how dQ is summed); without return_dsink the
    other gradients do not change."""
    if mode == "group":
        def run(deterministic: bool) -> tuple[Any, ...]:
            return _run_sink_varlen("bf16", 128, (8, 2), {"window": (16, 0)}, {}, deterministic,
                                    Inputs(31))  # fmt: skip

        first, second, fast = run(True), run(True), run(False)
    else:
        inputs = Inputs(32)
        b, hq, hk, sq, sk, d = 2, 8, 2, 300, 300, 64
        q, do = inputs.normal((b, hq, sq, d), torch.float16), inputs.normal((b, hq, sq, d),
                                                                            torch.float16)
        k, v = inputs.normal((b, hk, sk, d), torch.float16), inputs.normal((b, hk, sk, d),
                                                                           torch.float16)
        sink = _sink_logits(inputs, hq)
        options = {"causal": True, "causal_alignment": "bottom_right"}
        o, lse = _forward_outputs(q, k, v, torch.float16, sink=_f64(sink), **options)
        fields = {"batch": b, "nhead_q": hq, "nhead_k": hk, "seqlen_q": sq, "seqlen_k": sk,
                  "hdim": d, "dtype": "fp16", **options}  # fmt: skip

        def run(deterministic: bool, return_dsink: bool = True) -> tuple[Any, ...]:
            return ckfmha.bwd(do, q, k, v, o, lse, sink=sink, return_dsink=return_dsink,
                              deterministic=deterministic,
                              kernel=_sink_kernel(deterministic, **fields), **options)

        first, second, fast = run(True), run(True), run(False)
        plain = run(True, return_dsink=False)
        assert len(plain) == 3
        assert all(torch.equal(a, b_) for a, b_ in zip(plain, first)), (
            "asking for dsink must not change dq, dk or dv")
        ref = attention_backward_reference(_f64(q), _f64(k), _f64(v), _f64(do),
                                           sink=_f64(sink), **options)  # fmt: skip
        _check_batch_dsink("fp16", first[3], ref, sink, do, o, "bhsd", "deterministic")
    for a, b_ in zip(first, second):
        assert torch.equal(a, b_), "deterministic mode must give bit-identical gradients"
    assert torch.equal(first[3], fast[3]), "dsink must not depend on the dQ mode"


def test_sink_gradient_of_empty_problems() -> None:
    """Without queries dsink is 0, and without keys too (o = 0 makes D = 0): batch mode
    writes it with a memset (no kernel); group mode with no keys in any sequence runs the
    kernels, whose rows then add nothing."""
    inputs = Inputs(33)
    hq, hk, d = 4, 2, 64
    sink = _sink_logits(inputs, hq)
    for b, sq, sk in ((2, 5, 0), (2, 0, 7), (0, 5, 7)):
        q, do = inputs.normal((b, hq, sq, d), torch.float16), inputs.normal((b, hq, sq, d),
                                                                            torch.float16)
        k, v = inputs.normal((b, hk, sk, d), torch.float16), inputs.normal((b, hk, sk, d),
                                                                           torch.float16)
        o = torch.zeros_like(do)
        lse = sink[None, :, None].expand(b, hq, sq).contiguous()
        dsink = _nan_dsink(hq)
        got = ckfmha.bwd(do, q, k, v, o, lse, sink=sink, return_dsink=True, dsink_out=dsink)
        torch.cuda.synchronize()
        assert got[3] is dsink
        assert torch.equal(dsink, torch.zeros_like(dsink)), f"b={b} sq={sq} sk={sk}: {dsink}"
        assert all(bool((t == 0).all()) for t in got[:3]), f"b={b} sq={sq} sk={sk}"
    # Group mode: queries but no key in any sequence, and no query in any sequence.
    for lens_q, lens_k in (([3, 0, 5], [0, 0, 0]), ([0, 0, 0], [3, 0, 5])):
        total_q, total_k = sum(lens_q), sum(lens_k)
        fields = {"batch": 3, "nhead_q": hq, "nhead_k": hk, "seqlen_q": max(lens_q),
                  "seqlen_k": max(lens_k), "hdim": d, "dtype": "fp16", "mode": "group",
                  "total_q": total_q, "total_k": total_k}  # fmt: skip
        # The plan of the kernels' problem, whose zero length bound is raised to 1.
        kernel = _sink_kernel(False, **{**fields, "seqlen_q": 1, "seqlen_k": 1})
        q, do = inputs.normal((total_q, hq, d), torch.float16), inputs.normal((total_q, hq, d),
                                                                              torch.float16)
        k, v = inputs.normal((total_k, hk, d), torch.float16), inputs.normal((total_k, hk, d),
                                                                             torch.float16)
        o = torch.zeros_like(do)
        lse = sink[:, None].expand(hq, total_q).contiguous()
        dsink = _nan_dsink(hq)
        ckfmha.bwd_varlen(do, q, k, v, o, lse, _offsets_cuda(lens_q), _offsets_cuda(lens_k),
                          max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k), sink=sink,
                          return_dsink=True, dsink_out=dsink, kernel=kernel)  # fmt: skip
        torch.cuda.synchronize()
        assert torch.equal(dsink, torch.zeros_like(dsink)), f"{lens_q} {lens_k}: {dsink}"


@pytest.mark.skipif(not KERNELS, reason="no backward kernel for this device")
def test_sink_and_bias_gradients_come_back_in_order() -> None:
    """return_dbias and return_dsink together: (dq, dk, dv, dbias, dsink)."""
    kernel = _first(mode="batch", dbias=True, mask="causal", softcap=False, dropout=False)
    dtype = _torch_dtype(kernel["dtype"])
    d, b, hq, hk, sq, sk = kernel["hdim_q"], 2, 8, 2, 77, 130
    inputs = Inputs(34)
    q, do = inputs.normal((b, hq, sq, d), dtype), inputs.normal((b, hq, sq, d), dtype)
    k, v = inputs.normal((b, hk, sk, d), dtype), inputs.normal((b, hk, sk, d), dtype)
    bias = inputs.normal((b, hq, sq, sk), dtype)
    sink = _sink_logits(inputs, hq)
    ref_options = {"causal": True, "bias": _f64(bias), "sink": _f64(sink)}
    o, lse = _forward_outputs(q, k, v, dtype, **ref_options)
    got = ckfmha.bwd(do, q, k, v, o, lse, causal=True, bias=bias, sink=sink, return_dbias=True,
                     return_dsink=True, kernel=kernel["name"])  # fmt: skip
    torch.cuda.synchronize()
    assert len(got) == 5 and got[3].shape == (b, hq, sq, sk) and got[4].shape == (hq,)
    ref = attention_backward_reference(_f64(q), _f64(k), _f64(v), _f64(do), **ref_options)
    _compare_dbias(kernel["dtype"], got[3], ref.dbias, f"dbias with sinks {kernel['name']}")
    _check_batch_dsink(kernel["dtype"], got[4], ref, sink, do, o, "bhsd", "with dbias")
