"""The float64 reference against a plain per-row softmax loop and its defining properties."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ckfmha.reference import (
    alibi_bias,
    attention_reference,
    causal_mask,
    dropout_keep,
    philox4x32,
    philox_dropout_randval,
    varlen_attention_reference,
    window_mask,
)


def naive_attention(q, k, v, *, causal=False, alignment="top_left", scale=None):
    """One query row at a time, straight from the definition (bhsd, float64)."""
    batch, nhead_q, seqlen_q, hdim = q.shape
    nhead_k, seqlen_k, hdim_v = k.shape[1], k.shape[2], v.shape[3]
    scale = 1.0 / math.sqrt(hdim) if scale is None else scale
    group = nhead_q // nhead_k
    offset = 0 if alignment == "top_left" else seqlen_k - seqlen_q
    out = np.zeros((batch, nhead_q, seqlen_q, hdim_v))
    lse = np.full((batch, nhead_q, seqlen_q), -np.inf)
    for b in range(batch):
        for h in range(nhead_q):
            for i in range(seqlen_q):
                keys = [j for j in range(seqlen_k) if not causal or j <= i + offset]
                if not keys:
                    continue
                scores = np.array([scale * np.dot(q[b, h, i], k[b, h // group, j]) for j in keys])
                top = scores.max()
                weights = np.exp(scores - top)
                out[b, h, i] = weights @ v[b, h // group, keys] / weights.sum()
                lse[b, h, i] = top + math.log(weights.sum())
    return out, lse


def random_qkv(rng, batch, nhead_q, nhead_k, seqlen_q, seqlen_k, hdim, hdim_v=None):
    hdim_v = hdim if hdim_v is None else hdim_v
    return (
        rng.standard_normal((batch, nhead_q, seqlen_q, hdim)),
        rng.standard_normal((batch, nhead_k, seqlen_k, hdim)),
        rng.standard_normal((batch, nhead_k, seqlen_k, hdim_v)),
    )


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
@pytest.mark.parametrize(
    "shape",
    [(1, 2, 2, 5, 5, 8), (2, 4, 2, 3, 7, 16), (1, 6, 2, 9, 4, 8), (1, 3, 1, 1, 1, 4)],
)
def test_matches_naive_loop(shape, causal, alignment):
    rng = np.random.default_rng(0)
    q, k, v = random_qkv(rng, *shape)
    out, lse = attention_reference(q, k, v, causal=causal, causal_alignment=alignment)
    expected_out, expected_lse = naive_attention(q, k, v, causal=causal, alignment=alignment)
    np.testing.assert_allclose(out, expected_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-12, atol=1e-12)


def test_different_value_head_dim_and_scale():
    rng = np.random.default_rng(1)
    q, k, v = random_qkv(rng, 1, 2, 2, 4, 6, 8, hdim_v=3)
    out, lse = attention_reference(q, k, v, scale=0.3)
    expected_out, expected_lse = naive_attention(q, k, v, scale=0.3)
    assert out.shape == (1, 2, 4, 3)
    np.testing.assert_allclose(out, expected_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-12, atol=1e-12)


def test_gqa_equals_repeated_kv_heads():
    rng = np.random.default_rng(2)
    q, k, v = random_qkv(rng, 2, 8, 2, 5, 6, 16)
    grouped = attention_reference(q, k, v, causal=True)
    repeated = attention_reference(q, np.repeat(k, 4, axis=1), np.repeat(v, 4, axis=1), causal=True)
    np.testing.assert_array_equal(grouped[0], repeated[0])
    np.testing.assert_array_equal(grouped[1], repeated[1])


def test_alignments_agree_when_lengths_match():
    rng = np.random.default_rng(3)
    q, k, v = random_qkv(rng, 1, 2, 2, 7, 7, 8)
    top_left = attention_reference(q, k, v, causal=True, causal_alignment="top_left")
    bottom_right = attention_reference(q, k, v, causal=True, causal_alignment="bottom_right")
    np.testing.assert_array_equal(top_left[0], bottom_right[0])
    np.testing.assert_array_equal(top_left[1], bottom_right[1])


def test_bottom_right_with_more_queries_than_keys_masks_leading_rows():
    rng = np.random.default_rng(4)
    q, k, v = random_qkv(rng, 1, 2, 1, 6, 4, 8)
    with np.errstate(all="raise"):
        out, lse = attention_reference(q, k, v, causal=True, causal_alignment="bottom_right")
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    # Query i sees keys j <= i - 2: rows 0 and 1 see none.
    np.testing.assert_array_equal(out[:, :, :2], 0.0)
    assert np.all(lse[:, :, :2] == -np.inf)
    assert np.all(np.isfinite(lse[:, :, 2:]))
    # The last query sees every key, exactly like unmasked attention.
    full_out, full_lse = attention_reference(q, k, v)
    np.testing.assert_allclose(out[:, :, -1], full_out[:, :, -1], rtol=1e-12)
    np.testing.assert_allclose(lse[:, :, -1], full_lse[:, :, -1], rtol=1e-12)


def test_top_left_first_row_attends_only_to_first_key():
    rng = np.random.default_rng(5)
    q, k, v = random_qkv(rng, 1, 1, 1, 3, 5, 4)
    out, lse = attention_reference(q, k, v, causal=True)
    np.testing.assert_allclose(out[0, 0, 0], v[0, 0, 0], rtol=1e-12)
    np.testing.assert_allclose(lse[0, 0, 0], q[0, 0, 0] @ k[0, 0, 0] / 2.0, rtol=1e-12)


def test_softmax_weights_sum_to_one():
    # With v = identity rows, o is the softmax weight matrix itself.
    rng = np.random.default_rng(6)
    seqlen = 6
    q = rng.standard_normal((1, 1, seqlen, 8))
    k = rng.standard_normal((1, 1, seqlen, 8))
    v = np.eye(seqlen)[None, None]
    scores = q[0, 0] @ k[0, 0].T / math.sqrt(8)
    for causal in (False, True):
        weights, lse = attention_reference(q, k, v, causal=causal)
        np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=1e-12)
        # exp(score - lse) is the softmax weight: lse is the log of its normaliser.
        expected = np.exp(scores - lse[0, 0, :, None])
        if causal:
            expected = np.where(causal_mask(seqlen, seqlen), expected, 0.0)
        np.testing.assert_allclose(weights[0, 0], expected, rtol=1e-10, atol=1e-15)


def test_bshd_layout_is_a_transpose():
    rng = np.random.default_rng(7)
    q, k, v = random_qkv(rng, 2, 4, 2, 5, 6, 8)
    to_bshd = (0, 2, 1, 3)
    out_bhsd, lse_bhsd = attention_reference(q, k, v, causal=True)
    out_bshd, lse_bshd = attention_reference(
        q.transpose(to_bshd),
        k.transpose(to_bshd),
        v.transpose(to_bshd),
        causal=True,
        layout="bshd",
    )
    np.testing.assert_array_equal(out_bshd, out_bhsd.transpose(to_bshd))
    np.testing.assert_array_equal(lse_bshd, lse_bhsd)


def test_large_scores_do_not_overflow():
    q = np.full((1, 1, 2, 4), 100.0)
    k = np.full((1, 1, 3, 4), 100.0)
    v = np.arange(12, dtype=np.float64).reshape(1, 1, 3, 4)
    out, lse = attention_reference(q, k, v)
    np.testing.assert_allclose(out[0, 0, 0], v[0, 0].mean(axis=0))
    np.testing.assert_allclose(lse, 100.0 * 100.0 * 4 / 2.0 + math.log(3.0))


def test_half_precision_inputs_are_promoted():
    rng = np.random.default_rng(8)
    q, k, v = (x.astype(np.float16) for x in random_qkv(rng, 1, 2, 2, 4, 4, 8))
    out, lse = attention_reference(q, k, v)
    assert out.dtype == np.float64 and lse.dtype == np.float64
    expected, _ = naive_attention(*(x.astype(np.float64) for x in (q, k, v)))
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)


def test_causal_mask_shapes():
    np.testing.assert_array_equal(causal_mask(2, 3), [[1, 0, 0], [1, 1, 0]])
    np.testing.assert_array_equal(causal_mask(2, 3, "bottom_right"), [[1, 1, 0], [1, 1, 1]])
    np.testing.assert_array_equal(causal_mask(3, 2, "bottom_right"), [[0, 0], [1, 0], [1, 1]])


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        (((1, 3, 2, 4), (1, 2, 2, 4), (1, 2, 2, 4)), "multiple"),
        (((1, 2, 2, 4), (1, 2, 2, 8), (1, 2, 2, 4)), "incompatible"),
        (((2, 2, 4), (1, 2, 2, 4), (1, 2, 2, 4)), "4-D"),
    ],
)
def test_rejects_bad_shapes(shapes, message):
    q, k, v = (np.zeros(s) for s in shapes)
    with pytest.raises(ValueError, match=message):
        attention_reference(q, k, v)


# ---- features: window, soft-cap, bias, ALiBi, sink, dropout ----


def naive_features(
    q, k, v, *, scale, alignment="top_left", window=None, softcap=0.0, bias=None, slopes=None,
    sink=None, keep=None, p=0.0,
):  # fmt: skip
    """Row by row from the header's definitions (bhsd, float64, GQA).

    ``bias`` is [b, hq, sq, sk]; ``slopes`` [b, hq]; ``sink`` [hq]; ``keep`` bool [b, hq, sq, sk].
    """
    batch, nhead_q, seqlen_q, _ = q.shape
    nhead_k, seqlen_k, hdim_v = k.shape[1], k.shape[2], v.shape[3]
    group = nhead_q // nhead_k
    off = 0 if alignment == "top_left" else seqlen_k - seqlen_q
    left, right = window if window is not None else (-1, -1)
    out = np.zeros((batch, nhead_q, seqlen_q, hdim_v))
    lse = np.full((batch, nhead_q, seqlen_q), -np.inf)
    for b in range(batch):
        for h in range(nhead_q):
            for i in range(seqlen_q):
                logits = {}
                for j in range(seqlen_k):
                    if left >= 0 and j < i + off - left:
                        continue
                    if right >= 0 and j > i + off + right:
                        continue
                    s = scale * float(q[b, h, i] @ k[b, h // group, j])
                    if softcap > 0:
                        s = softcap * math.tanh(s / softcap)
                    if bias is not None:
                        s += bias[b, h, i, j]
                    if slopes is not None:
                        s -= slopes[b, h] * abs(i + seqlen_k - seqlen_q - j)
                    logits[j] = s
                denominator = sum(math.exp(s) for s in logits.values())
                if sink is not None:
                    denominator += math.exp(sink[h])
                if denominator == 0.0:
                    continue
                lse[b, h, i] = math.log(denominator)
                for j, s in logits.items():
                    weight = math.exp(s) / denominator
                    if keep is not None:
                        weight = weight / (1.0 - p) if keep[b, h, i, j] else 0.0
                    out[b, h, i] += weight * v[b, h // group, j]
    return out, lse


def assert_close(got, want):
    np.testing.assert_allclose(got[0], want[0], rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-11, atol=1e-12)


SHAPES = [(2, 4, 2, 6, 9, 8, 8), (1, 3, 3, 9, 5, 8, 4), (1, 2, 1, 1, 7, 4, 4)]


@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (2, 0), (0, 3), (1, 1), (0, 0), (3, -1)])
@pytest.mark.parametrize("shape", SHAPES)
def test_window_matches_header_definition(shape, window, alignment):
    q, k, v = random_qkv(np.random.default_rng(10), *shape)
    got = attention_reference(q, k, v, window=window, causal_alignment=alignment, scale=0.4)
    assert_close(got, naive_features(q, k, v, scale=0.4, alignment=alignment, window=window))
    assert not np.isnan(got[0]).any() and not np.isnan(got[1]).any()


def test_window_special_cases():
    q, k, v = random_qkv(np.random.default_rng(11), 1, 2, 2, 5, 8, 8)
    unmasked = attention_reference(q, k, v)
    np.testing.assert_array_equal(attention_reference(q, k, v, window=(-1, -1))[0], unmasked[0])
    for alignment in ("top_left", "bottom_right"):
        causal = attention_reference(q, k, v, causal=True, causal_alignment=alignment)
        window = attention_reference(q, k, v, window=(-1, 0), causal_alignment=alignment)
        np.testing.assert_array_equal(causal[0], window[0])
    np.testing.assert_array_equal(window_mask(3, 4, 0, 0), np.eye(3, 4, dtype=bool))
    np.testing.assert_array_equal(window_mask(3, 4, 0, 0, "bottom_right"), np.eye(3, 4, k=1))
    with pytest.raises(ValueError, match="not both"):
        attention_reference(q, k, v, causal=True, window=(1, 1))


@pytest.mark.parametrize("softcap", [0.5, 3.0])
def test_softcap_matches_definition(softcap):
    q, k, v = random_qkv(np.random.default_rng(12), 1, 4, 2, 5, 7, 8, hdim_v=6)
    got = attention_reference(q, k, v, softcap=softcap, scale=1.5, causal=True)
    want = naive_features(q, k, v, scale=1.5, window=(-1, 0), softcap=softcap)
    assert_close(got, want)
    # Capped logits stay inside (-softcap, softcap), so every LSE is below softcap + log(sk).
    assert np.all(got[1] < softcap + math.log(7))


def test_large_softcap_approaches_plain_attention():
    q, k, v = random_qkv(np.random.default_rng(13), 1, 2, 2, 4, 4, 8)
    capped = attention_reference(q, k, v, softcap=1e6)
    plain = attention_reference(q, k, v)
    np.testing.assert_allclose(capped[0], plain[0], rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize(
    "bias_shape", [(2, 4, 5, 7), (1, 1, 1, 7), (2, 1, 5, 7), (1, 4, 1, 7), (5, 7), (1, 1, 5, 1)]
)
def test_bias_broadcasts_to_every_head_and_row(bias_shape):
    q, k, v = random_qkv(np.random.default_rng(14), 2, 4, 2, 5, 7, 8)
    bias = np.random.default_rng(15).standard_normal(bias_shape)
    got = attention_reference(q, k, v, bias=bias, softcap=2.0, scale=0.5)
    full = np.broadcast_to(bias, (2, 4, 5, 7))
    assert_close(got, naive_features(q, k, v, scale=0.5, softcap=2.0, bias=full))


def test_bias_of_minus_infinity_masks_like_a_window():
    q, k, v = random_qkv(np.random.default_rng(16), 1, 2, 2, 6, 6, 8)
    as_bias = np.where(causal_mask(6, 6), 0.0, -np.inf)
    np.testing.assert_allclose(
        attention_reference(q, k, v, bias=as_bias)[0],
        attention_reference(q, k, v, causal=True)[0],
        rtol=1e-13,
    )


@pytest.mark.parametrize("per_batch", [False, True])
@pytest.mark.parametrize(("seqlen_q", "seqlen_k"), [(5, 9), (9, 5), (6, 6)])
def test_alibi_formula(per_batch, seqlen_q, seqlen_k):
    q, k, v = random_qkv(np.random.default_rng(17), 2, 4, 2, seqlen_q, seqlen_k, 8)
    rng = np.random.default_rng(18)
    slopes = rng.uniform(0.05, 1.0, size=(2, 4) if per_batch else (4,))
    got = attention_reference(q, k, v, alibi_slopes=slopes, window=(2, 1), scale=0.3)
    full_slopes = np.broadcast_to(slopes, (2, 4))
    assert_close(got, naive_features(q, k, v, scale=0.3, window=(2, 1), slopes=full_slopes))
    bias = alibi_bias(slopes, 2, seqlen_q, seqlen_k)
    assert bias.shape == (2, 4, seqlen_q, seqlen_k)
    b, h, i, j = 1, 3, seqlen_q - 1, 0
    assert bias[b, h, i, j] == -full_slopes[b, h] * abs(i + seqlen_k - seqlen_q - j)
    # The last query sits at distance 0 from the last key in every head.
    assert np.all(bias[:, :, -1, -1] == 0.0)


def test_sink_joins_the_denominator():
    q, k, v = random_qkv(np.random.default_rng(19), 2, 4, 2, 5, 8, 8, hdim_v=4)
    sink = np.array([0.0, 1.5, -2.0, 4.0])
    got = attention_reference(q, k, v, sink=sink, causal=True, causal_alignment="bottom_right")
    want = naive_features(q, k, v, scale=1 / math.sqrt(8), alignment="bottom_right",
                          window=(-1, 0), sink=sink)  # fmt: skip
    assert_close(got, want)
    # Probabilities over keys sum to 1 - exp(sink - lse) < 1.
    _, plain_lse = attention_reference(q, k, v, causal=True, causal_alignment="bottom_right")
    np.testing.assert_allclose(np.exp(got[1]), np.exp(plain_lse) + np.exp(sink)[None, :, None])


def test_fully_masked_rows_give_zero_output():
    # bottom_right with sq > sk: the first sq - sk rows see no key.
    q, k, v = random_qkv(np.random.default_rng(20), 1, 2, 1, 6, 3, 8)
    with np.errstate(all="raise"):
        out, lse = attention_reference(q, k, v, causal=True, causal_alignment="bottom_right")
        sink = np.array([0.25, -3.0])
        out_sink, lse_sink = attention_reference(
            q, k, v, causal=True, causal_alignment="bottom_right", sink=sink
        )
    assert np.all(out[:, :, :3] == 0.0) and np.all(np.isneginf(lse[:, :, :3]))
    assert np.all(out_sink[:, :, :3] == 0.0)
    np.testing.assert_array_equal(lse_sink[0, :, :3], np.repeat(sink[:, None], 3, axis=1))
    assert np.isfinite(lse_sink).all() and np.isfinite(lse[:, :, 3:]).all()


def test_dropout_scales_kept_probabilities():
    q, k, v = random_qkv(np.random.default_rng(21), 2, 4, 2, 5, 7, 8)
    keep = np.random.default_rng(22).random((2, 4, 5, 7)) >= 0.4
    sink = np.full(4, 0.5)
    got = attention_reference(q, k, v, dropout_p=0.4, dropout_keep=keep, sink=sink, scale=0.7)
    want = naive_features(q, k, v, scale=0.7, sink=sink, keep=keep, p=0.4)
    assert_close(got, want)
    # The LSE is that of the softmax before dropout.
    np.testing.assert_array_equal(got[1], attention_reference(q, k, v, sink=sink, scale=0.7)[1])
    everything = attention_reference(q, k, v, dropout_p=0.4, dropout_keep=np.ones_like(keep))
    np.testing.assert_allclose(everything[0], attention_reference(q, k, v)[0] / 0.6, rtol=1e-13)
    nothing = attention_reference(q, k, v, dropout_p=0.4, dropout_keep=np.zeros_like(keep))
    assert np.all(nothing[0] == 0.0)


def test_all_features_together():
    q, k, v = random_qkv(np.random.default_rng(23), 2, 4, 2, 7, 10, 8, hdim_v=16)
    rng = np.random.default_rng(24)
    bias = rng.standard_normal((2, 1, 7, 10))
    sink = rng.standard_normal(4)
    keep = rng.random((2, 4, 7, 10)) >= 0.25
    got = attention_reference(
        q, k, v, window=(3, 1), causal_alignment="bottom_right", scale=0.6, softcap=1.5,
        bias=bias, sink=sink, dropout_p=0.25, dropout_keep=keep,
    )  # fmt: skip
    want = naive_features(
        q, k, v, scale=0.6, alignment="bottom_right", window=(3, 1), softcap=1.5,
        bias=np.broadcast_to(bias, (2, 4, 7, 10)), sink=sink, keep=keep, p=0.25,
    )  # fmt: skip
    assert_close(got, want)


# ---- layouts of V, head dims ----


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_column_major_v_is_the_same_attention(layout):
    q, k, v = random_qkv(np.random.default_rng(25), 2, 4, 2, 5, 9, 8, hdim_v=12)
    to_layout = (0, 2, 1, 3) if layout == "bshd" else (0, 1, 2, 3)
    row_major = attention_reference(
        q.transpose(to_layout), k.transpose(to_layout), v.transpose(to_layout), layout=layout,
        causal=True,
    )  # fmt: skip
    # Column-major V is [b, hk, dv, sk] in either layout.
    col_major = attention_reference(
        q.transpose(to_layout), k.transpose(to_layout), np.swapaxes(v, 2, 3), layout=layout,
        causal=True, v_col_major=True,
    )  # fmt: skip
    np.testing.assert_array_equal(row_major[0], col_major[0])
    np.testing.assert_array_equal(row_major[1], col_major[1])
    assert row_major[0].shape == q.transpose(to_layout).shape[:3] + (12,)


@pytest.mark.parametrize(("hdim", "hdim_v"), [(8, 4), (4, 16), (16, 8)])
def test_value_head_dim_differs_from_query_head_dim(hdim, hdim_v):
    q, k, v = random_qkv(np.random.default_rng(26), 1, 6, 2, 4, 5, hdim, hdim_v=hdim_v)
    got = attention_reference(q, k, v, window=(1, 2), sink=np.zeros(6))
    want = naive_features(q, k, v, scale=1 / math.sqrt(hdim), window=(1, 2), sink=np.zeros(6))
    assert got[0].shape == (1, 6, 4, hdim_v)
    assert_close(got, want)


# ---- group (varlen) mode ----


def pack(lengths, heads, hdim, rng):
    return rng.standard_normal((int(sum(lengths)), heads, hdim))


def offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def per_sequence(q, k, v, cu_q, cu_k, b, **options):
    """Sequence b of a packed batch through the batch-mode reference (bhsd in, bshd out)."""
    q_b = q[cu_q[b] : cu_q[b + 1]][None]
    k_b, v_b = k[cu_k[b] : cu_k[b + 1]][None], v[cu_k[b] : cu_k[b + 1]][None]
    return attention_reference(q_b, k_b, v_b, layout="bshd", **options)


@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
def test_varlen_equals_per_sequence_batches(alignment):
    rng = np.random.default_rng(27)
    lens_q, lens_k = [3, 1, 0, 6, 1, 4], [5, 1, 2, 6, 0, 2]
    max_q, max_k, hq, hk = 6, 6, 4, 2
    cu_q, cu_k = offsets(lens_q), offsets(lens_k)
    q, k, v = pack(lens_q, hq, 8, rng), pack(lens_k, hk, 8, rng), pack(lens_k, hk, 4, rng)
    bias = rng.standard_normal((6, 1, max_q, max_k))
    sink = rng.standard_normal(hq)
    keep = rng.random((6, hq, max_q, max_k)) >= 0.2
    options = {"causal_alignment": alignment, "window": (2, 0), "softcap": 4.0, "scale": 0.5,
               "sink": sink, "dropout_p": 0.2}  # fmt: skip
    out, lse = varlen_attention_reference(
        q, k, v, cu_q, cu_k, bias=bias, dropout_keep=keep, **options
    )
    assert out.shape == (int(cu_q[-1]), hq, 4) and lse.shape == (hq, int(cu_q[-1]))
    for b in range(6):
        lq, lk = lens_q[b], lens_k[b]
        o_b, lse_b = per_sequence(q, k, v, cu_q, cu_k, b, bias=bias[b : b + 1, :, :lq, :lk],
                                  dropout_keep=keep[b : b + 1, :, :lq, :lk], **options)  # fmt: skip
        np.testing.assert_array_equal(out[cu_q[b] : cu_q[b + 1]], o_b[0])
        np.testing.assert_array_equal(lse[:, cu_q[b] : cu_q[b + 1]], lse_b[0])
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    # Sequence 4 has one query and no keys: o = 0, lse = sink.
    np.testing.assert_array_equal(out[cu_q[4]], 0.0)
    np.testing.assert_array_equal(lse[:, cu_q[4]], sink)


def test_varlen_skips_short_sequences_and_leaves_nan():
    rng = np.random.default_rng(28)
    lens_q, lens_k = [1, 4, 2, 0, 3], [3, 4, 1, 2, 3]
    cu_q, cu_k = offsets(lens_q), offsets(lens_k)
    q, k, v = pack(lens_q, 2, 8, rng), pack(lens_k, 1, 8, rng), pack(lens_k, 1, 8, rng)
    out, lse = varlen_attention_reference(q, k, v, cu_q, cu_k, skip_min_seqlen_q=3, causal=True)
    for b, length in enumerate(lens_q):
        rows = slice(cu_q[b], cu_q[b + 1])
        if length < 3:
            assert np.isnan(out[rows]).all() and np.isnan(lse[:, rows]).all()
        else:
            want = per_sequence(q, k, v, cu_q, cu_k, b, causal=True)
            np.testing.assert_array_equal(out[rows], want[0][0])
    unskipped, _ = varlen_attention_reference(q, k, v, cu_q, cu_k, causal=True)
    assert not np.isnan(unskipped).any()


def test_varlen_alibi_column_major_v_and_bias_broadcast():
    rng = np.random.default_rng(29)
    lens_q, lens_k = [2, 5, 1], [4, 3, 1]
    cu_q, cu_k = offsets(lens_q), offsets(lens_k)
    q, k, v = pack(lens_q, 4, 8, rng), pack(lens_k, 4, 8, rng), pack(lens_k, 4, 8, rng)
    slopes = rng.uniform(0.1, 0.9, size=(3, 4))
    got = varlen_attention_reference(q, k, v, cu_q, cu_k, alibi_slopes=slopes)
    for b in range(3):
        want = per_sequence(q, k, v, cu_q, cu_k, b, alibi_slopes=slopes[b])
        np.testing.assert_array_equal(got[0][cu_q[b] : cu_q[b + 1]], want[0][0])
    # V as [hk, dv, total_k] (tokens contiguous) is the same attention.
    col = varlen_attention_reference(
        q, k, np.ascontiguousarray(v.transpose(1, 2, 0)), cu_q, cu_k, alibi_slopes=slopes,
        v_col_major=True,
    )  # fmt: skip
    np.testing.assert_array_equal(got[0], col[0])
    # A per-head bias [hq, max_sq, max_sk] broadcasts over the batch.
    head_bias = rng.standard_normal((4, 5, 4))
    biased = varlen_attention_reference(q, k, v, cu_q, cu_k, bias=head_bias)
    want = per_sequence(q, k, v, cu_q, cu_k, 1, bias=head_bias[None, :, :5, :3])
    np.testing.assert_array_equal(biased[0][cu_q[1] : cu_q[2]], want[0][0])


# ---- Philox dropout stream ----


def philox_scalar(counter, key):
    """Philox4x32-10 on Python ints, written independently of the vectorised one."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        product0, product1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        hi0, lo0 = product0 >> 32, product0 & 0xFFFFFFFF
        hi1, lo1 = product1 >> 32, product1 & 0xFFFFFFFF
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return (c0, c1, c2, c3)


# Random123's kat_vectors for philox4x32 with 10 rounds: (counter, key, output).
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    (
        (0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF),
        (0xFFFFFFFF, 0xFFFFFFFF),
        (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
    ),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize(("counter", "key", "expected"), PHILOX_KAT)
def test_philox_known_answers(counter, key, expected):
    assert philox_scalar(counter, key) == expected
    assert tuple(int(word) for word in philox4x32(counter, key)) == expected
    # Vectorised: a batch of counters gives each one's own answer.
    batch = philox4x32([np.array([x, 0]) for x in counter], key)
    assert tuple(int(word[0]) for word in batch) == expected


@pytest.mark.parametrize(
    ("seed", "offset"),
    [(0, 0), (1234, 5), (0xDEADBEEF_01234567, 0x00000003_FFFFFFF0), (2**64 - 1, 2**64 - 1)],
)
def test_dropout_randval_follows_the_header(seed, offset):
    batch, nhead_q, seqlen_q, seqlen_k = 2, 3, 4, 137
    randval = philox_dropout_randval(seed, offset, batch, nhead_q, seqlen_q, seqlen_k)
    assert randval.shape == (batch, nhead_q, seqlen_q, seqlen_k) and randval.dtype == np.uint8
    key = (seed & 0xFFFFFFFF, (seed >> 32) ^ (offset >> 32))
    for b, h, i, j in [(0, 0, 0, 0), (1, 2, 3, 36), (0, 1, 2, 15), (1, 0, 1, 16), (1, 1, 0, 33),
                       (0, 2, 1, 63), (1, 2, 2, 64), (0, 0, 3, 136), (1, 1, 1, 101)]:
        counter = (j // 64 * 4 + j % 8 // 2, i, b * nhead_q + h, offset & 0xFFFFFFFF)
        words = philox_scalar(counter, key)
        little_endian = b"".join(word.to_bytes(4, "little") for word in words)
        assert randval[b, h, i, j] == little_endian[j % 64 // 8 * 2 + j % 2], (b, h, i, j)
    # Each call's 16 bytes go to 16 distinct keys of its 64-key block.
    j = np.arange(64)
    calls_bytes = sorted(zip((j % 8 // 2).tolist(), (j % 64 // 8 * 2 + j % 2).tolist()))
    assert calls_bytes == [(call, byte) for call in range(4) for byte in range(16)]
    # The Hopper forward reads byte b of call g as fragment column 16 g + b of a lane's wgmma
    # accumulator row (philox_dropout.cuh, apply_per_call): lane q of a quad holds keys
    # 8 c + 2 q and 8 c + 2 q + 1 in fragment columns 2 c and 2 c + 1.
    for lane in range(4):
        for column in range(32):
            key = 8 * (column // 2) + 2 * lane + column % 2
            call = key // 64 * 4 + key % 8 // 2
            assert (call, key % 64 // 8 * 2 + key % 2) == (column // 16 * 4 + lane, column % 16)
    # A prefix of the keys (or queries) is the same stream: lengths do not shift it.
    shorter = philox_dropout_randval(seed, offset, batch, nhead_q, seqlen_q - 1, 20)
    np.testing.assert_array_equal(shorter, randval[:, :, : seqlen_q - 1, :20])


def test_dropout_keep_threshold():
    randval = np.arange(256, dtype=np.uint8)
    assert dropout_keep(randval, 0.0).all()
    # floor(0.3 * 256) = 76: bytes 0..75 drop.
    keep = dropout_keep(randval, 0.3)
    assert not keep[:76].any() and keep[76:].all()
    assert dropout_keep(randval, 0.999).sum() == 1
    stream = philox_dropout_randval(7, 0, 2, 4, 64, 64)
    assert dropout_keep(stream, 0.25).mean() == pytest.approx(0.75, abs=0.02)
    with pytest.raises(ValueError):
        dropout_keep(randval, 1.0)
