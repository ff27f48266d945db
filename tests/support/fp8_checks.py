"""What both fp8 forward GPU suites (per-tensor/per-head and per-block scales) share: the bounds
of the outputs against the float64 reference on the dequantised inputs and the check that
applies them, NaN-poisoned outputs, mask options, and one varlen call checked end to end."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from support.gpu_compare import f64, torch_dtype

# Bounds against the reference on the dequantised inputs. Each e4m3 product is exact, but
# Hopper's fp8 wgmma keeps fewer mantissa bits than fp32 while it accumulates over the head
# dim: a score carries an absolute error of up to about 2^-11 of the largest scores of the
# problem (measured on an H100: 0.42 at logits of 775, rows with outlier channels). The other
# term is P: the kernel rounds the probabilities to e4m3 for the P V product, 3 mantissa
# bits, a relative error up to 2^-4 per probability (bf16's is 2^-9). Over many keys these
# errors average out; over a few dominant keys they do not, and the output moves by up to
# ~2^-4 of the largest |V|. Hence a relative-L2 bound, and a max-abs bound as a fraction of
# max |V| (the output is a convex combination of V rows, so that is its magnitude) which
# grows with the score error: a score error e moves O by at most 2 e max |V|. The LSE comes
# from the scores before P is rounded, so only the score error reaches it. Measured on an
# H100 (4913e40): relative L2 1.7e-2 to 2.6e-2 on normal inputs and 3.5e-3 to 1.5e-2 with
# outliers; max abs 1.1e-3 to 1.5e-2 of max |V| on normal inputs, 1.9e-2 to 1.0e-1 with
# outliers (logits of 400 to 800).
REL_L2_TOL = 3e-2
MAX_ABS_OF_V = 6e-2
LSE_ABS_TOL = 1e-2
LSE_REL_TOL = 1e-5
SCORE_ERROR_OF_MAX_LOGIT = 2e-3  # about 4x the 2^-11 seen


def max_logit(q: np.ndarray, k: np.ndarray, scale: float, head_axis: int) -> float:
    """The largest |scale * q . k| over every query and key row and every query head with its
    K/V head (a bound across sequences too, for packed varlen inputs), in float64 on the GPU."""
    import torch  # only on the GPU runs that call this

    qt, kt = (torch.from_numpy(np.moveaxis(x, head_axis, -2)).cuda() for x in (q, k))
    qt, kt = qt.reshape(-1, *qt.shape[-3:]), kt.reshape(-1, *kt.shape[-3:])  # [b, s, h, d]
    kt = kt.repeat_interleave(qt.shape[-2] // kt.shape[-2], dim=-2)
    scores = torch.einsum("bihd,bjhd->bhij", qt, kt)
    return float(scores.abs().max()) * scale


def check(out: Any, lse: Any, ref: np.ndarray, ref_lse: np.ndarray, v: np.ndarray,
          what: str, logit: float) -> float:  # fmt: skip
    """O and the LSE against the reference with the fp8 bounds, `logit` being max_logit of
    the inputs; returns O's relative L2."""
    score_error = SCORE_ERROR_OF_MAX_LOGIT * logit
    o64 = f64(out)
    rows = ~np.isnan(ref)
    assert np.array_equal(np.isnan(o64), ~rows), f"unwritten or overwritten outputs ({what})"
    err = np.where(rows, o64 - np.nan_to_num(ref), 0.0)
    rel = float(np.linalg.norm(err) / max(np.linalg.norm(np.nan_to_num(ref)), 1e-30))
    assert rel < REL_L2_TOL, f"relative L2 error {rel:.3e} ({what})"
    bound = (MAX_ABS_OF_V + 2 * score_error) * max(float(np.abs(v).max(initial=0.0)), 1e-30)
    worst = float(np.abs(err).max(initial=0.0))
    assert worst < bound, f"max abs error {worst:.3e} > {bound:.3e} ({what})"
    lse64 = f64(lse)
    written = ~np.isnan(ref_lse)
    assert np.array_equal(np.isnan(lse64), ~written), f"LSE rows unwritten ({what})"
    finite = np.isfinite(ref_lse)
    np.testing.assert_array_equal(np.isfinite(lse64[written]), finite[written], err_msg=what)
    np.testing.assert_allclose(lse64[finite], ref_lse[finite], rtol=LSE_REL_TOL,
                               atol=LSE_ABS_TOL + score_error, err_msg=what)  # fmt: skip
    return rel


def poisoned(shape: tuple[int, ...], dtype: Any) -> Any:
    """A device tensor of NaN: any element a kernel leaves unwritten stays NaN."""
    import torch

    return torch.full(shape, float("nan"), device="cuda", dtype=dtype)


def mask_options(mask: Any) -> dict[str, Any]:
    """fwd's keyword arguments for a case's mask: "none", "causal" (top-left), "causal_br"
    (bottom-right), or a (left, right) window."""
    if mask == "none":
        return {}
    if mask in ("causal", "causal_br"):
        alignment = "bottom_right" if mask == "causal_br" else "top_left"
        return {"causal": True, "causal_alignment": alignment}
    return {"window": mask, "causal_alignment": "bottom_right"}


def check_varlen(codes: tuple[Any, Any, Any], values: tuple[np.ndarray, ...],
                 cu_seqlens: tuple[np.ndarray, np.ndarray], hdim: int, mask: Any,
                 out_name: str, scales: dict[str, Any], what: str) -> None:  # fmt: skip
    """fwd_varlen over packed e4m3 q, k and v (``codes``, standing for ``values`` [tokens,
    heads, d] in float64) into poisoned outputs, checked against the float64 reference."""
    import torch

    import ckfmha
    from ckfmha.reference import varlen_attention_reference

    cu_q, cu_k = cu_seqlens
    total_q, hq = values[0].shape[:2]
    out = poisoned((total_q, hq, hdim), torch_dtype(out_name))
    lse = poisoned((hq, total_q), torch.float32)
    options = {"scale": 1.0 / math.sqrt(hdim), **mask_options(mask)}
    ckfmha.fwd_varlen(
        *codes, torch.from_numpy(cu_q).cuda(), torch.from_numpy(cu_k).cuda(),
        max_seqlen_q=int(np.diff(cu_q).max()), max_seqlen_k=int(np.diff(cu_k).max()),
        return_lse=True, out=out, lse_out=lse, out_dtype=out_name, **scales, **options,
    )  # fmt: skip
    torch.cuda.synchronize()
    ref, ref_lse = varlen_attention_reference(*values, cu_q, cu_k, **options)
    logit = max_logit(values[0][None], values[1][None], options["scale"], 2)
    check(out, lse, ref, ref_lse, values[2], what, logit)
