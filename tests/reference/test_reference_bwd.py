"""The float64 backward reference against central finite differences of the forward one."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ckfmha.reference import attention_reference, varlen_attention_reference
from ckfmha.reference_bwd import attention_backward_reference, varlen_attention_backward_reference

EPS = 1e-6
# Central differences of a smooth float64 function: truncation ~eps^2, rounding ~1e-16/eps.
FD_TOL = 1e-7


def numeric_grad(loss, x: np.ndarray) -> np.ndarray:
    """d loss / d x by central differences, one element at a time."""
    grad = np.zeros_like(x)
    flat, out = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        saved = flat[i]
        flat[i] = saved + EPS
        up = loss()
        flat[i] = saved - EPS
        down = loss()
        flat[i] = saved
        out[i] = (up - down) / (2 * EPS)
    return grad


def check_against_fd(q, k, v, do, extra_inputs: dict[str, np.ndarray], **options: Any) -> None:
    """Every gradient the reference returns equals the finite difference of sum(dO * O)."""
    inputs = {"q": q, "k": k, "v": v, **extra_inputs}

    def loss() -> float:
        out, _ = attention_reference(
            inputs["q"], inputs["k"], inputs["v"],
            **{name: inputs[name] for name in extra_inputs}, **options,
        )  # fmt: skip
        return float((np.nan_to_num(out) * do).sum())

    grads = attention_backward_reference(
        q, k, v, do, **{name: inputs[name] for name in extra_inputs}, **options
    )
    expected = {"q": grads.dq, "k": grads.dk, "v": grads.dv, "bias": grads.dbias,
                "sink": grads.dsink}  # fmt: skip
    for name, x in inputs.items():
        got = expected[name]
        assert got is not None and got.shape == x.shape, name
        assert np.isfinite(got).all(), name
        np.testing.assert_allclose(got, numeric_grad(loss, x), rtol=0, atol=FD_TOL,
                                   err_msg=f"d/d{name}")  # fmt: skip


def random_problem(seed: int, batch=1, hq=2, hk=1, sq=5, sk=7, d=4, dv=3, layout="bhsd"):
    rng = np.random.default_rng(seed)

    def shape(h: int, s: int, dim: int) -> tuple[int, ...]:
        return (batch, s, h, dim) if layout == "bshd" else (batch, h, s, dim)

    return (
        rng.standard_normal(shape(hq, sq, d)),
        rng.standard_normal(shape(hk, sk, d)),
        rng.standard_normal(shape(hk, sk, dv)),
        rng.standard_normal(shape(hq, sq, dv)),
        rng,
    )


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"causal": True},
        {"causal": True, "causal_alignment": "bottom_right"},
        {"window": (2, 1)},
        {"window": (1, 0), "causal_alignment": "bottom_right"},
        {"softcap": 1.5, "scale": 0.7},
    ],
    ids=["none", "causal_tl", "causal_br", "window_tl", "window_br", "softcap"],
)
@pytest.mark.parametrize("shape", [(1, 2, 1, 5, 7, 4, 3), (2, 3, 3, 6, 4, 4, 4)])
def test_masks_gqa_and_softcap_match_finite_differences(shape, options):
    q, k, v, do, _ = random_problem(1, *shape)
    check_against_fd(q, k, v, do, {}, **options)


def test_bias_gradient_is_reduced_to_the_bias_shape():
    q, k, v, do, rng = random_problem(2, batch=2, hq=2, hk=1, sq=4, sk=5)
    for bias_shape in [(2, 2, 4, 5), (1, 2, 4, 5), (2, 1, 1, 5), (4, 5)]:
        bias = rng.standard_normal(bias_shape)
        check_against_fd(q, k, v, do, {"bias": bias}, causal=True, causal_alignment="bottom_right")


def test_alibi_sink_and_softcap_together():
    q, k, v, do, rng = random_problem(3, batch=1, hq=4, hk=2, sq=6, sk=6)
    sink = rng.standard_normal(4)
    check_against_fd(q, k, v, do, {"sink": sink}, alibi_slopes=[0.1, 0.2, 0.3, 0.4],
                     softcap=2.0, window=(3, 1))  # fmt: skip


def test_dropout_uses_the_forward_keep_mask():
    q, k, v, do, rng = random_problem(4, batch=1, hq=2, hk=2, sq=5, sk=6)
    keep = rng.random((1, 2, 5, 6)) >= 0.3
    check_against_fd(q, k, v, do, {}, dropout_p=0.3, dropout_keep=keep)


def test_bshd_layout_is_a_transpose():
    q, k, v, do, _ = random_problem(5, batch=2, hq=4, hk=2, sq=3, sk=5, layout="bshd")
    got = attention_backward_reference(q, k, v, do, layout="bshd", causal=True)
    t = [x.transpose(0, 2, 1, 3) for x in (q, k, v, do)]
    want = attention_backward_reference(*t, causal=True)
    for a, b in ((got.dq, want.dq), (got.dk, want.dk), (got.dv, want.dv)):
        np.testing.assert_allclose(a.transpose(0, 2, 1, 3), b, rtol=1e-13, atol=1e-13)


def test_forward_parts_match_the_forward_reference_and_delta():
    q, k, v, do, rng = random_problem(6, batch=2, hq=4, hk=2, sq=9, sk=7, d=8, dv=8)
    bias = rng.standard_normal((1, 4, 9, 7))
    keep = rng.random((2, 4, 9, 7)) >= 0.25
    options = {"window": (3, 2), "causal_alignment": "bottom_right", "softcap": 3.0, "bias": bias,
                   "dropout_p": 0.25, "dropout_keep": keep, "sink": rng.standard_normal(4)}  # fmt: skip
    grads = attention_backward_reference(q, k, v, do, **options)
    out, lse = attention_reference(q, k, v, **options)
    np.testing.assert_allclose(grads.o, out, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(grads.lse, lse, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(grads.delta, (do * out).sum(-1), rtol=1e-12, atol=1e-12)


def test_fully_masked_rows_have_zero_gradients():
    # Bottom-right causal with more queries than keys: the first rows see nothing.
    q, k, v, do, _ = random_problem(7, batch=1, hq=2, hk=1, sq=6, sk=3)
    grads = attention_backward_reference(q, k, v, do, causal=True, causal_alignment="bottom_right")
    assert np.isfinite(grads.dq).all() and np.isfinite(grads.dk).all()
    np.testing.assert_array_equal(grads.dq[:, :, :3], 0.0)
    np.testing.assert_array_equal(grads.delta[:, :, :3], 0.0)
    check_against_fd(q, k, v, do, {}, causal=True, causal_alignment="bottom_right")


def test_rejects_bad_shapes():
    q, k, v, do, _ = random_problem(8)
    with pytest.raises(ValueError, match="do has shape"):
        attention_backward_reference(q, k, v, do[..., :2])
    with pytest.raises(ValueError, match="causal or window"):
        attention_backward_reference(q, k, v, do, causal=True, window=(1, 1))


def offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def test_varlen_matches_finite_differences_with_empty_sequences():
    rng = np.random.default_rng(9)
    lens_q, lens_k = [3, 0, 2, 1], [4, 2, 0, 3]
    cu_q, cu_k = offsets(lens_q), offsets(lens_k)
    hq, hk, d, dv = 2, 1, 4, 3
    q = rng.standard_normal((sum(lens_q), hq, d))
    k = rng.standard_normal((sum(lens_k), hk, d))
    v = rng.standard_normal((sum(lens_k), hk, dv))
    do = rng.standard_normal((sum(lens_q), hq, dv))
    bias = rng.standard_normal((1, hq, 3, 4))
    options = {"causal": True, "causal_alignment": "bottom_right", "softcap": 2.0}
    grads = varlen_attention_backward_reference(q, k, v, do, cu_q, cu_k, bias=bias, **options)
    inputs = {"q": q, "k": k, "v": v, "bias": bias}

    def loss() -> float:
        out, _ = varlen_attention_reference(inputs["q"], inputs["k"], inputs["v"], cu_q, cu_k,
                                            bias=inputs["bias"], **options)  # fmt: skip
        return float((np.nan_to_num(out) * do).sum())

    for name, got in (("q", grads.dq), ("k", grads.dk), ("v", grads.dv), ("bias", grads.dbias)):
        assert got.shape == inputs[name].shape
        np.testing.assert_allclose(got, numeric_grad(loss, inputs[name]), rtol=0, atol=FD_TOL,
                                   err_msg=name)  # fmt: skip
    # Keys of sequence 1 (no queries) get no gradient.
    np.testing.assert_array_equal(grads.dk[4:6], 0.0)
    np.testing.assert_array_equal(grads.dv[4:6], 0.0)


def test_sink_gradient_with_rows_that_see_no_key_and_dropout():
    """dsink sums exp(sink - lse) * D over batch and queries: rows that see no key (o = 0,
    lse = sink) add nothing, and with dropout D comes from the dropped O."""
    q, k, v, do, rng = random_problem(10, batch=2, hq=4, hk=2, sq=6, sk=3)
    sink = rng.standard_normal(4) + 1.0
    keep = rng.random((2, 4, 6, 3)) >= 0.3
    options = {"causal": True, "causal_alignment": "bottom_right", "dropout_p": 0.3,
               "dropout_keep": keep}  # fmt: skip
    check_against_fd(q, k, v, do, {"sink": sink}, **options)
    grads = attention_backward_reference(q, k, v, do, sink=sink, **options)
    # The first three rows see no key: their share of the softmax is all the sink's.
    np.testing.assert_allclose(grads.lse[:, :, :3], np.broadcast_to(sink[None, :, None],
                                                                    (2, 4, 3)))  # fmt: skip
    share = np.exp(sink[None, :, None] - grads.lse)
    np.testing.assert_allclose(grads.dsink, -(share * grads.delta).sum(axis=(0, 2)),
                               rtol=1e-12, atol=1e-12)  # fmt: skip


def test_varlen_sink_gradient_matches_finite_differences():
    """Group mode: dsink sums over every sequence's queries; a sequence with queries and no
    keys (o = 0) and one with no queries add nothing."""
    rng = np.random.default_rng(11)
    lens_q, lens_k = [3, 0, 1, 2], [4, 2, 0, 3]
    cu_q, cu_k = offsets(lens_q), offsets(lens_k)
    hq, hk, d = 4, 2, 4
    q = rng.standard_normal((sum(lens_q), hq, d))
    k = rng.standard_normal((sum(lens_k), hk, d))
    v = rng.standard_normal((sum(lens_k), hk, d))
    do = rng.standard_normal((sum(lens_q), hq, d))
    sink = rng.standard_normal(hq)
    options = {"window": (1, 0), "softcap": 2.0}
    grads = varlen_attention_backward_reference(q, k, v, do, cu_q, cu_k, sink=sink, **options)

    def loss() -> float:
        out, _ = varlen_attention_reference(q, k, v, cu_q, cu_k, sink=sink, **options)
        return float((np.nan_to_num(out) * do).sum())

    assert grads.dsink is not None and grads.dsink.shape == (hq,)
    np.testing.assert_allclose(grads.dsink, numeric_grad(loss, sink), rtol=0, atol=FD_TOL)
    share = np.exp(sink[:, None] - grads.lse)
    np.testing.assert_allclose(grads.dsink, -(share * grads.delta).sum(axis=1), rtol=1e-12,
                               atol=1e-12)  # fmt: skip
