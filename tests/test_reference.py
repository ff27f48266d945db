"""The float64 reference against a plain per-row softmax loop and its defining properties."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ckfmha.reference import attention_reference, causal_mask


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
