"""The float64 reference's forward features, each against an independent per-row loop."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ckfmha.reference import (
    alibi_bias,
    attention_reference,
    dropout_keep,
    philox4x32,
    philox_dropout_randval,
    varlen_attention_reference,
    window_mask,
)


def loop_attention(q, k, v, *, scale, visible=None, logit=None, sink=None, keep=None, p=0.0):
    """Row by row from the definition: bhsd float64, hq == hk; ``logit(b, h, i, j, s)``
    rewrites a scaled score; ``visible[i, j]`` masks; ``sink[h]`` joins the denominator."""
    batch, heads, sq, _ = q.shape
    sk, dv = k.shape[2], v.shape[3]
    out = np.zeros((batch, heads, sq, dv))
    lse = np.full((batch, heads, sq), -np.inf)
    for b in range(batch):
        for h in range(heads):
            for i in range(sq):
                keys = [j for j in range(sk) if visible is None or visible[i, j]]
                scores = []
                for j in keys:
                    s = scale * float(np.dot(q[b, h, i], k[b, h, j]))
                    scores.append(logit(b, h, i, j, s) if logit else s)
                terms = [math.exp(s) for s in scores]
                denom = sum(terms) + (math.exp(sink[h]) if sink is not None else 0.0)
                if denom == 0.0:
                    continue
                lse[b, h, i] = math.log(denom)
                for j, t in zip(keys, terms):
                    weight = t / denom
                    if keep is not None:
                        weight = weight / (1 - p) if keep[b, h, i, j] else 0.0
                    out[b, h, i] += weight * v[b, h, j]
    return out, lse


@pytest.fixture
def qkv():
    rng = np.random.default_rng(7)
    return tuple(rng.standard_normal((2, 3, n, 16)) for n in (9, 13, 13))


@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
@pytest.mark.parametrize("window", [(2, 0), (-1, 3), (1, 1), (0, 0), (-1, -1)])
def test_window_matches_loop(qkv, window, alignment):
    q, k, v = qkv
    scale = 0.3
    got, got_lse = attention_reference(q, k, v, window=window, causal_alignment=alignment,
                                       scale=scale)
    visible = window_mask(9, 13, *window, alignment)
    want, want_lse = loop_attention(q, k, v, scale=scale, visible=visible)
    np.testing.assert_allclose(got, want, atol=1e-12)
    np.testing.assert_allclose(got_lse, want_lse, atol=1e-12)


def test_causal_is_the_window_minus_one_zero(qkv):
    q, k, v = qkv
    for alignment in ("top_left", "bottom_right"):
        a = attention_reference(q, k, v, causal=True, causal_alignment=alignment)
        b = attention_reference(q, k, v, window=(-1, 0), causal_alignment=alignment)
        np.testing.assert_array_equal(a[0], b[0])


def test_softcap_bias_and_alibi_match_loop(qkv):
    q, k, v = qkv
    rng = np.random.default_rng(1)
    bias = rng.standard_normal((1, 3, 9, 13))
    slopes = rng.uniform(0.1, 1.0, size=3)

    def logit(b, h, i, j, s):
        capped = 2.0 * math.tanh(s / 2.0)
        return capped + bias[0, h, i, j] - slopes[h] * abs(i + 13 - 9 - j)

    got = attention_reference(q, k, v, scale=0.5, softcap=2.0,
                              bias=bias + alibi_bias(slopes, 2, 9, 13))
    want, want_lse = loop_attention(q, k, v, scale=0.5, logit=logit)
    np.testing.assert_allclose(got[0], want, atol=1e-12)
    np.testing.assert_allclose(got[1], want_lse, atol=1e-12)
    via_slopes = attention_reference(q, k, v, scale=0.5, softcap=2.0, bias=bias,
                                     alibi_slopes=slopes)
    np.testing.assert_allclose(via_slopes[0], want, atol=1e-12)


def test_sink_joins_denominator_and_fully_masked_rows(qkv):
    q, k, v = qkv
    sink = np.array([0.5, -1.0, 2.0])
    window = (0, 0)
    got, got_lse = attention_reference(q, k, v, window=window, causal_alignment="bottom_right",
                                       sink=sink, scale=0.4)
    visible = window_mask(9, 13, *window, "bottom_right")
    want, want_lse = loop_attention(q, k, v, scale=0.4, visible=visible, sink=sink)
    np.testing.assert_allclose(got, want, atol=1e-12)
    np.testing.assert_allclose(got_lse, want_lse, atol=1e-12)
    # A row that sees no key still has the sink: o = 0 and lse = sink.
    empty = attention_reference(q[:, :, :1], k, v, window=(0, 0), causal_alignment="top_left",
                                sink=sink, scale=0.4, alibi_slopes=None,
                                bias=np.where(np.arange(13) == 0, -np.inf, 0.0))
    assert np.all(empty[0] == 0.0)
    np.testing.assert_allclose(empty[1][0, :, 0], sink)


def test_dropout_scales_kept_probabilities(qkv):
    q, k, v = qkv
    rng = np.random.default_rng(3)
    keep = rng.random((2, 3, 9, 13)) > 0.3
    got, got_lse = attention_reference(q, k, v, dropout_p=0.3, dropout_keep=keep, scale=0.2)
    want, _ = loop_attention(q, k, v, scale=0.2, keep=keep, p=0.3)
    np.testing.assert_allclose(got, want, atol=1e-12)
    np.testing.assert_allclose(got_lse, attention_reference(q, k, v, scale=0.2)[1], atol=1e-12)


def test_value_head_dim_and_column_major_v(qkv):
    q, k, _ = qkv
    v = np.random.default_rng(4).standard_normal((2, 3, 13, 8))
    row = attention_reference(q, k, v)
    col = attention_reference(q, k, np.ascontiguousarray(v.transpose(0, 1, 3, 2)),
                              v_col_major=True)
    np.testing.assert_array_equal(row[0], col[0])
    assert row[0].shape == (2, 3, 9, 8)


def test_varlen_equals_per_sequence_batches():
    rng = np.random.default_rng(5)
    lens_q, lens_k = [0, 1, 5, 3], [4, 1, 6, 0]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)])
    cu_k = np.concatenate([[0], np.cumsum(lens_k)])
    q = rng.standard_normal((cu_q[-1], 4, 8))
    k = rng.standard_normal((cu_k[-1], 2, 8))
    v = rng.standard_normal((cu_k[-1], 2, 8))
    out, lse = varlen_attention_reference(q, k, v, cu_q, cu_k, causal=True,
                                          causal_alignment="bottom_right", skip_min_seqlen_q=2)
    assert out.shape == (9, 4, 8) and lse.shape == (4, 9)
    # Sequence 1 (length 1) is skipped: NaN marks rows a kernel must leave alone.
    assert np.isnan(out[0]).all() and np.isnan(lse[:, 0]).all()
    b = 2
    o_b, lse_b = attention_reference(q[None, 1:6], k[None, 5:11], v[None, 5:11], causal=True,
                                     causal_alignment="bottom_right", layout="bshd")
    np.testing.assert_array_equal(out[1:6], o_b[0])
    np.testing.assert_array_equal(lse[:, 1:6], lse_b[0])
    # A sequence with queries but no keys: zeros and -inf.
    assert b == 2 and np.all(out[6:9] == 0.0) and np.all(np.isneginf(lse[:, 6:9]))


def test_philox_known_answers():
    # Published Philox4x32-10 known-answer vectors.
    cases = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ]
    for counter, key, expected in cases:
        assert tuple(int(w) for w in philox4x32(counter, key)) == expected


def test_dropout_randval_layout_follows_the_header():
    seed, offset = 0x1234_5678_9ABC_DEF0, 0x0000_0007_0000_0003
    randval = philox_dropout_randval(seed, offset, 2, 3, 5, 40)
    assert randval.shape == (2, 3, 5, 40) and randval.dtype == np.uint8
    b, h, i, j = 1, 2, 4, 37
    key = (seed & 0xFFFFFFFF, (seed >> 32) ^ (offset >> 32))
    words = philox4x32((j // 16, i, b * 3 + h, offset & 0xFFFFFFFF), key)
    byte = (int(words[(j % 16) // 4]) >> (8 * (j % 4))) & 0xFF
    assert randval[b, h, i, j] == byte
    keep = dropout_keep(randval, 0.25)
    assert keep.mean() == pytest.approx(0.75, abs=0.1)
    assert np.array_equal(keep, randval >= 64)
