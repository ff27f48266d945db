"""The attention entry points as torch.library custom ops, with fake (meta) implementations.

``torch.ops.ckfmha.fwd`` / ``bwd`` / ``fwd_varlen`` / ``bwd_varlen`` are opaque to
torch.compile: Dynamo records a call, the fake implementation gives its output shapes and
dtypes, and the real one runs ``ckfmha.fwd``/``ckfmha.bwd`` at run time. The forward ops
return ``rng_state``, an int64 CPU tensor (dropout seed, offset), so the backward replays the
same Philox stream without a host read of device memory. ``fwd`` and ``fwd_paged`` read fp8
(float8_e4m3fn) K/V with their dequantisation scales (``KV_QUANT_SCHEMA``); fp8 K/V has no backward.
``fwd_fp8`` and ``fwd_varlen_fp8`` read fp8 queries too (``Q_QUANT_SCHEMA``): inference ops
with no autograd. Its
scale tensors go to ``ckfmha.fwd`` whatever their shape, so per-block scales (q_scale, k_scale
and v_scale 3-D) need nothing of the schema, and the fake implementation's outputs do not
depend on them.

Outputs are freshly allocated and contiguous in their documented shapes (what ckfmha's
runners allocate), which the fake implementations state exactly.
"""

from __future__ import annotations

from typing import Any

import torch

import ckfmha

# One Philox stream per call: a 63-bit seed drawn from torch's CPU generator, so
# torch.manual_seed makes dropout reproducible.
_SEED_BOUND = 1 << 62

# The forward's options, shared by every attention op; ``deterministic`` (on the forward ops)
# is the mode their backward will run in.
_FEATURES = (
    "Tensor? bias, Tensor? alibi_slopes, Tensor? sink, bool causal, str causal_alignment, "
    "int[]? window, float? scale, float softcap, float dropout_p"
)


# fp8 K/V: the storage hint for uint8 codes, and each scale as a device fp32 tensor or a number
# (a schema argument has one type, so the two kinds travel apart; at most one of a pair is set).
KV_QUANT_SCHEMA = (
    "str? kv_dtype=None, Tensor? k_scale=None, Tensor? v_scale=None, "
    "float? k_scale_value=None, float? v_scale_value=None"
)


def kv_quant_options(kv_dtype: str | None, k_scale: torch.Tensor | None,
                     v_scale: torch.Tensor | None, k_scale_value: float | None,
                     v_scale_value: float | None) -> dict[str, Any]:  # fmt: skip
    """The fp8 K/V arguments of ckfmha.fwd / fwd_paged from the ops' ``KV_QUANT_SCHEMA`` ones."""
    return {
        "kv_dtype": kv_dtype,
        "k_scale": k_scale_value if k_scale is None else k_scale.detach(),
        "v_scale": v_scale_value if v_scale is None else v_scale.detach(),
    }


# fp8 queries: the storage hint for uint8 codes, q's scale as a tensor (1, nhead_q or per-block
# values) or a number (as the K/V scales travel), and the output dtype (bf16 unless given).
Q_QUANT_SCHEMA = (
    "str? q_dtype=None, Tensor? q_scale=None, float? q_scale_value=None, "
    "ScalarType? out_dtype=None"
)


def _window(window: list[int] | None) -> tuple[int, int] | None:
    return None if window is None else (int(window[0]), int(window[1]))


def _rng_state(dropout_p: float, dropout_seed: int | None) -> tuple[int, torch.Tensor]:
    """This call's seed, and the (seed, offset) tensor the forward ops return: the given seed,
    else a fresh one when dropout is on. The tensor is on the CPU whatever device a
    ``torch.device`` context makes the default."""
    if dropout_p <= 0.0:
        seed = 0
    elif dropout_seed is None:
        seed = int(torch.randint(_SEED_BOUND, (1,), dtype=torch.int64).item())
    else:
        seed = int(dropout_seed)
    return seed, torch.tensor([seed, 0], dtype=torch.int64, device="cpu")


# q, k, v, o, lse and the upstream gradient reach ckfmha as they are: it reads torch CUDA
# tensors on the current stream through their attributes, which a tensor that requires a
# gradient allows (a detach per tensor cost about a microsecond a call). The feature arrays
# may be host tensors that ckfmha stages through NumPy, which refuses those: they are detached.
def _features(bias, alibi_slopes, sink, causal, causal_alignment, window, scale, softcap,
              dropout_p) -> dict[str, Any]:  # fmt: skip
    return {
        "bias": None if bias is None else bias.detach(),
        "alibi_slopes": None if alibi_slopes is None else alibi_slopes.detach(),
        "sink": None if sink is None else sink.detach(),
        "causal": causal, "causal_alignment": causal_alignment, "window": _window(window),
        "scale": scale, "softcap": softcap, "dropout_p": dropout_p,
    }  # fmt: skip


def _empty_like_input(like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The placeholder a backward returns for a gradient nobody asked for."""
    return like.new_empty((0,), dtype=like.dtype if dtype is None else dtype)


# ---- forward, batch mode ----

torch.library.define(
    "ckfmha::fwd",
    f"(Tensor q, Tensor k, Tensor v, {_FEATURES}, int? dropout_seed, str layout, "
    f"bool deterministic, {KV_QUANT_SCHEMA}) "
    "-> (Tensor out, Tensor lse, Tensor rng_state)",
)


def run_fwd(q, k, v, bias, alibi_slopes, sink, causal, causal_alignment, window, scale,
            softcap, dropout_p, dropout_seed, layout, deterministic, kv_dtype=None,
            k_scale=None, v_scale=None, k_scale_value=None,
            v_scale_value=None):  # fmt: skip
    """ckfmha::fwd's CUDA implementation, which the eager route (``ckfmha.torch.eager``)
    calls directly."""
    seed, rng_state = _rng_state(dropout_p, dropout_seed)
    o, lse = ckfmha.fwd(
        q, k, v, return_lse=True, layout=layout, dropout_seed=seed,
        **_features(bias, alibi_slopes, sink, causal, causal_alignment, window, scale, softcap,
                    dropout_p),
        **kv_quant_options(kv_dtype, k_scale, v_scale, k_scale_value, v_scale_value),
    )  # fmt: skip
    return o, lse, rng_state


torch.library.impl("ckfmha::fwd", "CUDA")(run_fwd)


def _bhsd_dims(shape: torch.Size, layout: str) -> tuple[int, int, int, int]:
    batch, a, b, d = shape
    return (batch, a, b, d) if layout == "bhsd" else (batch, b, a, d)


@torch.library.register_fake("ckfmha::fwd")
def _fwd_fake(q, k, v, bias, alibi_slopes, sink, causal, causal_alignment, window, scale,
              softcap, dropout_p, dropout_seed, layout, deterministic, kv_dtype=None,
              k_scale=None, v_scale=None, k_scale_value=None,
              v_scale_value=None):  # fmt: skip
    o, lse = _fake_outputs(q, v, layout, q.dtype)
    return o, lse, torch.empty((2,), dtype=torch.int64, device="cpu")


def _fake_outputs(q, v, layout: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse) as the batch-mode forward allocates them: o in q's layout and ``dtype``."""
    batch, heads, seqlen_q, _ = _bhsd_dims(q.shape, layout)
    hdim_v = v.shape[-1]
    o_shape = (batch, heads, seqlen_q, hdim_v) if layout == "bhsd" else (
        batch, seqlen_q, heads, hdim_v)
    return q.new_empty(o_shape, dtype=dtype), q.new_empty((batch, heads, seqlen_q),
                                                          dtype=torch.float32)


# ---- forward over fp8 queries (inference; no autograd) ----

torch.library.define(
    "ckfmha::fwd_fp8",
    f"(Tensor q, Tensor k, Tensor v, {_FEATURES}, str layout, {Q_QUANT_SCHEMA}, "
    f"{KV_QUANT_SCHEMA}) -> (Tensor out, Tensor lse)",
)


@torch.library.impl("ckfmha::fwd_fp8", "CUDA")
def _fwd_fp8_cuda(q, k, v, bias, alibi_slopes, sink, causal, causal_alignment, window, scale,
                  softcap, dropout_p, layout, q_dtype=None, q_scale=None, q_scale_value=None,
                  out_dtype=None, kv_dtype=None, k_scale=None, v_scale=None, k_scale_value=None,
                  v_scale_value=None):  # fmt: skip
    o, lse = ckfmha.fwd(
        q.detach(), k.detach(), v.detach(), return_lse=True, layout=layout, q_dtype=q_dtype,
        q_scale=q_scale_value if q_scale is None else q_scale.detach(), out_dtype=out_dtype,
        **_features(bias, alibi_slopes, sink, causal, causal_alignment, window, scale, softcap,
                    dropout_p),
        **kv_quant_options(kv_dtype, k_scale, v_scale, k_scale_value, v_scale_value),
    )  # fmt: skip
    return o, lse


@torch.library.register_fake("ckfmha::fwd_fp8")
def _fwd_fp8_fake(q, k, v, bias, alibi_slopes, sink, causal, causal_alignment, window, scale,
                  softcap, dropout_p, layout, q_dtype=None, q_scale=None, q_scale_value=None,
                  out_dtype=None, kv_dtype=None, k_scale=None, v_scale=None, k_scale_value=None,
                  v_scale_value=None):  # fmt: skip
    return _fake_outputs(q, v, layout, torch.bfloat16 if out_dtype is None else out_dtype)


# ---- backward, batch mode ----

torch.library.define(
    "ckfmha::bwd",
    f"(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor rng_state, "
    f"{_FEATURES}, str layout, bool deterministic, bool want_dbias, bool want_dsink) "
    "-> (Tensor dq, Tensor dk, Tensor dv, Tensor dbias, Tensor dsink)",
)


def _gradients(grads: tuple, q: torch.Tensor, want_dbias: bool, want_dsink: bool) -> tuple:
    """(dq, dk, dv, dbias, dsink) with empty placeholders for gradients not asked for."""
    dq, dk, dv = grads[:3]
    rest = list(grads[3:])
    dbias = rest.pop(0) if want_dbias else _empty_like_input(q)
    dsink = rest.pop(0) if want_dsink else _empty_like_input(q, torch.float32)
    return dq, dk, dv, dbias, dsink


def bwd_options(rng_state, bias, alibi_slopes, sink, causal, causal_alignment, window, scale,
                softcap, dropout_p, deterministic, want_dbias,
                want_dsink) -> dict[str, Any]:  # fmt: skip
    """The keyword arguments of ckfmha.bwd and bwd_varlen for the backward of a forward run
    with these options (its rng_state replayed), asking for the gradients wanted."""
    seed, offset = _replayed_stream(rng_state, dropout_p)
    return {
        "deterministic": deterministic, "dropout_seed": seed, "dropout_offset": offset,
        "return_dbias": want_dbias, "return_dsink": want_dsink,
        **_features(bias, alibi_slopes, sink, causal, causal_alignment, window, scale, softcap,
                    dropout_p),
    }  # fmt: skip


def run_bwd(dout, q, k, v, out, lse, rng_state, bias, alibi_slopes, sink, causal,
            causal_alignment, window, scale, softcap, dropout_p, layout, deterministic,
            want_dbias, want_dsink):  # fmt: skip
    """ckfmha::bwd's CUDA implementation, called directly on the eager route."""
    grads = ckfmha.bwd(
        grad_ready(dout), q, k, v, out, lse, layout=layout,
        **bwd_options(rng_state, bias, alibi_slopes, sink, causal, causal_alignment, window,
                      scale, softcap, dropout_p, deterministic, want_dbias, want_dsink),
    )  # fmt: skip
    return _gradients(grads, q, want_dbias, want_dsink)


torch.library.impl("ckfmha::bwd", "CUDA")(run_bwd)


@torch.library.register_fake("ckfmha::bwd")
def _bwd_fake(dout, q, k, v, out, lse, rng_state, bias, alibi_slopes, sink, causal,
              causal_alignment, window, scale, softcap, dropout_p, layout, deterministic,
              want_dbias, want_dsink):  # fmt: skip
    batch, heads, seqlen_q, _ = _bhsd_dims(q.shape, layout)
    seqlen_k = _bhsd_dims(k.shape, layout)[2]
    return _fake_gradients(q, k, v, (batch, heads, seqlen_q, seqlen_k), want_dbias, want_dsink)


def _fake_gradients(q, k, v, bias_shape: tuple, want_dbias: bool, want_dsink: bool) -> tuple:
    """(dq, dk, dv, dbias, dsink) as the backward ops allocate them: like q, k and v, the full
    bias gradient and the fp32 [nhead_q] sink gradient, or empty placeholders when not asked."""
    dbias = q.new_empty(bias_shape) if want_dbias else _empty_like_input(q)
    dsink = q.new_empty((bias_shape[1],) if want_dsink else (0,), dtype=torch.float32)
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dbias, dsink)


def _replayed_stream(rng_state: torch.Tensor, dropout_p: float) -> tuple[int, int]:
    """The forward's (seed, offset) for the backward to replay; without dropout there is no
    stream, and the CPU tensor is not read."""
    if dropout_p <= 0.0:
        return 0, 0
    seed, offset = (int(x) for x in rng_state.tolist())
    return seed, offset


def grad_ready(t: torch.Tensor) -> torch.Tensor:
    """Upstream gradients may be views with any strides (expanded zeros, transposes): the
    kernels need a contiguous head dim and 16-byte aligned rows."""
    t = t.detach()
    if t.stride(-1) != 1 or any(s % 8 for s in t.stride()[:-1]) or t.data_ptr() % 16:
        return t.contiguous()
    return t


# ---- forward and backward, group mode (packed variable-length sequences) ----

_VARLEN = "Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k"

torch.library.define(
    "ckfmha::fwd_varlen",
    f"(Tensor q, Tensor k, Tensor v, {_VARLEN}, {_FEATURES}, int? dropout_seed, "
    "bool deterministic) "
    "-> (Tensor out, Tensor lse, Tensor rng_state)",
)


def run_fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, bias,
                   alibi_slopes, sink, causal, causal_alignment, window, scale, softcap,
                   dropout_p, dropout_seed, deterministic):  # fmt: skip
    """ckfmha::fwd_varlen's CUDA implementation, called directly on the eager route."""
    seed, rng_state = _rng_state(dropout_p, dropout_seed)
    o, lse = ckfmha.fwd_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, return_lse=True,
        dropout_seed=seed,
        **_features(bias, alibi_slopes, sink, causal, causal_alignment, window, scale, softcap,
                    dropout_p),
    )  # fmt: skip
    return o, lse, rng_state


torch.library.impl("ckfmha::fwd_varlen", "CUDA")(run_fwd_varlen)


@torch.library.register_fake("ckfmha::fwd_varlen")
def _fwd_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, bias,
                     alibi_slopes, sink, causal, causal_alignment, window, scale, softcap,
                     dropout_p, dropout_seed, deterministic):  # fmt: skip
    total_q, heads, _ = q.shape
    o = q.new_empty((total_q, heads, v.shape[-1]))
    lse = q.new_empty((heads, total_q), dtype=torch.float32)
    return o, lse, torch.empty((2,), dtype=torch.int64, device="cpu")


# fp8 queries over packed sequences (inference; no autograd), as fwd_fp8 in batch mode.
torch.library.define(
    "ckfmha::fwd_varlen_fp8",
    f"(Tensor q, Tensor k, Tensor v, {_VARLEN}, {_FEATURES}, {Q_QUANT_SCHEMA}, "
    f"{KV_QUANT_SCHEMA}) -> (Tensor out, Tensor lse)",
)


@torch.library.impl("ckfmha::fwd_varlen_fp8", "CUDA")
def _fwd_varlen_fp8_cuda(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, bias,
                         alibi_slopes, sink, causal, causal_alignment, window, scale, softcap,
                         dropout_p, q_dtype=None, q_scale=None, q_scale_value=None,
                         out_dtype=None, kv_dtype=None, k_scale=None, v_scale=None,
                         k_scale_value=None, v_scale_value=None):  # fmt: skip
    return ckfmha.fwd_varlen(
        q.detach(), k.detach(), v.detach(), cu_seqlens_q, cu_seqlens_k,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, return_lse=True, q_dtype=q_dtype,
        q_scale=q_scale_value if q_scale is None else q_scale.detach(), out_dtype=out_dtype,
        **_features(bias, alibi_slopes, sink, causal, causal_alignment, window, scale, softcap,
                    dropout_p),
        **kv_quant_options(kv_dtype, k_scale, v_scale, k_scale_value, v_scale_value),
    )  # fmt: skip


@torch.library.register_fake("ckfmha::fwd_varlen_fp8")
def _fwd_varlen_fp8_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, bias,
                         alibi_slopes, sink, causal, causal_alignment, window, scale, softcap,
                         dropout_p, q_dtype=None, q_scale=None, q_scale_value=None,
                         out_dtype=None, kv_dtype=None, k_scale=None, v_scale=None,
                         k_scale_value=None, v_scale_value=None):  # fmt: skip
    total_q, heads, _ = q.shape
    o = q.new_empty((total_q, heads, v.shape[-1]),
                    dtype=torch.bfloat16 if out_dtype is None else out_dtype)  # fmt: skip
    return o, q.new_empty((heads, total_q), dtype=torch.float32)


torch.library.define(
    "ckfmha::bwd_varlen",
    f"(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor rng_state, "
    f"{_VARLEN}, {_FEATURES}, bool deterministic, bool want_dbias, bool want_dsink) "
    "-> (Tensor dq, Tensor dk, Tensor dv, Tensor dbias, Tensor dsink)",
)


def run_bwd_varlen(dout, q, k, v, out, lse, rng_state, cu_seqlens_q, cu_seqlens_k,
                   max_seqlen_q, max_seqlen_k, bias, alibi_slopes, sink, causal,
                   causal_alignment, window, scale, softcap, dropout_p, deterministic,
                   want_dbias, want_dsink):  # fmt: skip
    """ckfmha::bwd_varlen's CUDA implementation, called directly on the eager route."""
    grads = ckfmha.bwd_varlen(
        grad_ready(dout), q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
        **bwd_options(rng_state, bias, alibi_slopes, sink, causal, causal_alignment, window,
                      scale, softcap, dropout_p, deterministic, want_dbias, want_dsink),
    )  # fmt: skip
    return _gradients(grads, q, want_dbias, want_dsink)


torch.library.impl("ckfmha::bwd_varlen", "CUDA")(run_bwd_varlen)


@torch.library.register_fake("ckfmha::bwd_varlen")
def _bwd_varlen_fake(dout, q, k, v, out, lse, rng_state, cu_seqlens_q, cu_seqlens_k,
                     max_seqlen_q, max_seqlen_k, bias, alibi_slopes, sink, causal,
                     causal_alignment, window, scale, softcap, dropout_p, deterministic,
                     want_dbias, want_dsink):  # fmt: skip
    bias_shape = (cu_seqlens_q.shape[0] - 1, q.shape[1], max_seqlen_q, max_seqlen_k)
    return _fake_gradients(q, k, v, bias_shape, want_dbias, want_dsink)


def refuse_host_tensors(op: str) -> None:
    """Registers a CPU kernel for ``op`` that says what it needs instead of torch's generic
    'could not run with arguments from the CPU backend'."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ckfmha.InvalidArgumentError(
            f"torch.ops.{op.replace('::', '.')} runs on CUDA tensors; got CPU tensors "
            "(move them with .cuda(), or use ckfmha.reference for a CPU result)", 1)

    torch.library.impl(op, "CPU")(refuse)


for _op in ("ckfmha::fwd", "ckfmha::fwd_fp8", "ckfmha::bwd", "ckfmha::fwd_varlen",
            "ckfmha::fwd_varlen_fp8", "ckfmha::bwd_varlen"):
    refuse_host_tensors(_op)
