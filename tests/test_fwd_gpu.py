"""Forward kernels on the GPU against the float64 NumPy reference.

Every registered forward kernel that runs on this device is forced by name
and checked on fresh random inputs (never zeros) with the output poisoned
with NaN first, so an unwritten element fails the test.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import ckfmha
from ckfmha.reference import attention_reference

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch") if ckfmha.device_count() > 0 else None

# bf16 keeps 8 mantissa bits, fp16 11: tolerances on |out - ref| relative to
# the reference's norm, and on the LSE (fp32 arithmetic throughout).
REL_L2_TOL = {"fp16": 2e-3, "bf16": 1.5e-2}
MAX_ABS_TOL = {"fp16": 1e-2, "bf16": 6e-2}
LSE_TOL = 1e-3

SEQLEN_PAIRS = [
    (1, 1),
    (1, 17),
    (17, 1),
    (17, 257),
    (257, 17),
    (257, 1000),
    (1000, 257),
    (1000, 1000),
]


def _device_kernels() -> list[dict[str, Any]]:
    if ckfmha.device_count() == 0:
        return []
    arch = ckfmha.device_arch()
    return [k for k in ckfmha.Registry().kernels() if k["family"] == "fwd" and _runs_on(k, arch)]


def _runs_on(kernel: dict[str, Any], arch: int) -> bool:
    # Mirrors the runtime: "a" targets run only on their own arch, plain SASS
    # on later minors of the same major.
    if kernel["arch_name"].endswith("a"):
        return kernel["arch"] == arch
    return kernel["arch"] // 10 == arch // 10 and kernel["arch"] <= arch


KERNELS = _device_kernels()
KERNEL_IDS = [k["name"] for k in KERNELS]


def _torch_dtype(name: str) -> Any:
    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]


def _random(shape: tuple[int, ...], dtype: str, generator: Any) -> Any:
    return torch.randn(shape, generator=generator, dtype=torch.float32).to(
        device="cuda", dtype=_torch_dtype(dtype)
    )


def _as_f64(t: Any) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


def _cases(kernel: dict[str, Any]) -> Iterator[dict[str, Any]]:
    causal = kernel["mask"] == "causal"
    alignments = ["top_left", "bottom_right"] if causal else ["top_left"]
    for i, (sq, sk) in enumerate(SEQLEN_PAIRS):
        yield {
            "sq": sq,
            "sk": sk,
            "batch": 2 if sq * sk < 500_000 else 1,
            # Alternate MHA, GQA and MQA, and both memory layouts.
            "heads": [(4, 4), (4, 2), (6, 1)][i % 3],
            "layout": ["bhsd", "bshd"][i % 2],
            "alignment": alignments[i % len(alignments)],
        }


def _check(kernel: dict[str, Any], case: dict[str, Any], generator: Any) -> None:
    dtype, d, dv = kernel["dtype"], kernel["hdim_q"], kernel["hdim_v"]
    (hq, hk), b, sq, sk = case["heads"], case["batch"], case["sq"], case["sk"]
    bshd = case["layout"] == "bshd"

    def shape(heads: int, seqlen: int, dim: int) -> tuple[int, ...]:
        return (b, seqlen, heads, dim) if bshd else (b, heads, seqlen, dim)

    q = _random(shape(hq, sq, d), dtype, generator)
    k = _random(shape(hk, sk, d), dtype, generator)
    v = _random(shape(hk, sk, dv), dtype, generator)
    out = torch.full(shape(hq, sq, dv), float("nan"), device="cuda", dtype=q.dtype)
    lse = torch.full((b, hq, sq), float("nan"), device="cuda", dtype=torch.float32)
    causal = kernel["mask"] == "causal"
    scale = 1.0 / math.sqrt(d) * (0.75 if case["sq"] % 2 else 1.0)

    got, got_lse = ckfmha.fwd(
        q,
        k,
        v,
        causal=causal,
        causal_alignment=case["alignment"],
        scale=scale,
        return_lse=True,
        layout=case["layout"],
        out=out,
        lse_out=lse,
        kernel=kernel["name"],
    )
    torch.cuda.synchronize()
    assert got.data_ptr() == out.data_ptr(), "out= must be written in place"

    ref, ref_lse = attention_reference(
        _as_f64(q),
        _as_f64(k),
        _as_f64(v),
        causal=causal,
        causal_alignment=case["alignment"],
        scale=scale,
        layout=case["layout"],
    )
    o64, lse64 = _as_f64(got), _as_f64(got_lse)
    assert not np.isnan(o64).any(), "output has NaN: elements left unwritten"
    assert not np.isnan(lse64).any(), "LSE has NaN: rows left unwritten"
    err = o64 - ref
    rel = np.linalg.norm(err) / max(np.linalg.norm(ref), 1e-30)
    assert rel < REL_L2_TOL[dtype], f"relative L2 error {rel:.3e} ({case})"
    assert np.abs(err).max() < MAX_ABS_TOL[dtype], f"max abs error {np.abs(err).max():.3e}"
    finite = np.isfinite(ref_lse)
    np.testing.assert_array_equal(np.isfinite(lse64), finite)
    np.testing.assert_allclose(lse64[finite], ref_lse[finite], rtol=0, atol=LSE_TOL)


@pytest.mark.parametrize("kernel", KERNELS, ids=KERNEL_IDS)
def test_kernel_matches_reference(kernel: dict[str, Any]) -> None:
    generator = torch.Generator().manual_seed(hash(kernel["name"]) % 2**31)
    for case in _cases(kernel):
        _check(kernel, case, generator)


@pytest.mark.skipif(not KERNELS, reason="no forward kernel for this device")
def test_automatic_selection_and_results_on_same_stream() -> None:
    q = torch.randn(2, 8, 300, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 2, 300, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = ckfmha.fwd(q, k, v, causal=True)
    stream.synchronize()
    assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == q.dtype
    ref, _ = attention_reference(_as_f64(q), _as_f64(k), _as_f64(v), causal=True)
    rel = np.linalg.norm(_as_f64(out) - ref) / np.linalg.norm(ref)
    assert rel < REL_L2_TOL["bf16"]


@pytest.mark.skipif(not KERNELS, reason="no forward kernel for this device")
def test_numpy_inputs_are_staged() -> None:
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((1, 2, n, 64)).astype(np.float16) for n in (33, 70, 70))
    out = ckfmha.fwd(q, k, v)
    assert isinstance(out, np.ndarray) and out.dtype == np.float16
    ref, _ = attention_reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < REL_L2_TOL["fp16"]


@pytest.mark.skipif(not KERNELS, reason="no forward kernel for this device")
def test_unsupported_head_dim_raises_with_supported_list() -> None:
    q = torch.randn(1, 2, 16, 72, device="cuda", dtype=torch.float16)
    with pytest.raises(ckfmha.UnsupportedError, match="head dims"):
        ckfmha.fwd(q, q, q)


@pytest.mark.skipif(not KERNELS, reason="no forward kernel for this device")
def test_misaligned_rows_are_rejected() -> None:
    base = torch.randn(1, 2, 16, 65, device="cuda", dtype=torch.float16)
    view = base[..., 1:]  # head dim 64 but rows start at odd element offsets
    with pytest.raises(ckfmha.UnsupportedError, match="16-byte"):
        ckfmha.fwd(view, view, view)
