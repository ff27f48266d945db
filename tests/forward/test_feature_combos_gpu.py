"""Every documented forward feature combination runs from a plain install: kernels the library
lacks compile on first use. Each case is checked against the float64 reference with fresh
random inputs (GQA, odd lengths) and a NaN-poisoned output."""

from __future__ import annotations

import itertools
import zlib
from typing import Any

import numpy as np
import pytest

import ckfmha
from ckfmha import first_use, jit
from ckfmha.reference import attention_reference, dropout_keep, philox_dropout_randval

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

torch = pytest.importorskip("torch") if ckfmha.device_count() > 0 else None

REL_L2_TOL = {"fp16": 2e-3, "bf16": 1.5e-2}

# The README's forward features alone and in the pairs users ask for (Gemma 2: soft-cap with a
# window; gpt-oss: sinks with a window; ALiBi models: causal ALiBi), plus all of them at once.
FEATURE_SETS = [
    {"softcap"},
    {"softcap", "causal"},
    {"softcap", "window"},
    {"alibi"},
    {"alibi", "causal"},
    {"sink"},
    {"sink", "window"},
    {"dropout"},
    {"dropout", "causal"},
    {"bias"},
    {"bias", "window"},
    {"softcap", "alibi", "sink", "dropout", "causal"},
]
CASES = [
    (dtype, hdim, sorted(features))
    for dtype, hdim, features in itertools.product(("bf16", "fp16"), (64, 128, 256), FEATURE_SETS)
]


def _options(features: list[str], generator: Any, hq: int, sq: int, sk: int) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if "causal" in features:
        options.update(causal=True, causal_alignment="bottom_right")
    if "window" in features:
        options["window"] = (37, 5)
    if "softcap" in features:
        options["softcap"] = 30.0
    if "alibi" in features:
        options["alibi_slopes"] = (torch.rand(hq, generator=generator) * 0.5 + 0.01).cuda()
    if "sink" in features:
        options["sink"] = (torch.randn(hq, generator=generator) * 2).cuda()
    if "bias" in features:
        options["bias"] = torch.randn(1, hq, sq, sk, generator=generator).cuda()
    if "dropout" in features:
        options.update(dropout_p=0.25, dropout_seed=int(torch.randint(1, 2**40, (1,),
                       generator=generator)), dropout_offset=1 << 20)
    return options


def _key(dtype: str, hdim: int, features: list[str]) -> first_use.FwdKey:
    mask = 2 if "causal" in features else 4 if "window" in features else 0
    bias = 2 if "alibi" in features else 1 if "bias" in features else 0
    return first_use.FwdKey(
        dtype={"fp16": 0, "bf16": 1}[dtype], mode=0, hdim_q=hdim, hdim_v=hdim, mask=mask,
        bias=bias, dropout="dropout" in features, softcap="softcap" in features,
        sink="sink" in features, v_col_major=False, kv_storage=0, page_layout=0,
        forced_splits=False, decode_shaped=False,
    )  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def prebuilt() -> None:
    """Compiles every case's missing kernels in one parallel build first (the cases' own first
    calls would compile them one at a time); each call then finds its kernel registered."""
    missing = {
        name for dtype, hdim, features in CASES
        for name in first_use.missing_kernels(_key(dtype, hdim, features))
    }  # fmt: skip
    if missing:
        jit.build(sorted(missing))


@pytest.mark.parametrize(("dtype", "hdim", "features"), CASES,
                         ids=[f"{d}-d{h}-{'+'.join(f)}" for d, h, f in CASES])
def test_documented_feature_combination_runs(dtype: str, hdim: int, features: list[str]) -> None:
    generator = torch.Generator().manual_seed(zlib.crc32(f"{dtype}{hdim}{features}".encode()))
    b, hq, hk, sq, sk = 2, 6, 2, 173, 301
    torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    q, k, v = (torch.randn(b, h, s, hdim, generator=generator).to("cuda", torch_dtype)
               for h, s in ((hq, sq), (hk, sk), (hk, sk)))
    options = _options(features, generator, hq, sq, sk)
    if "bias" in options:
        options["bias"] = options["bias"].to(torch_dtype)
    out = torch.full((b, hq, sq, hdim), float("nan"), device="cuda", dtype=torch_dtype)
    ckfmha.fwd(q, k, v, out=out, **options)
    torch.cuda.synchronize()

    def f64(t: Any) -> np.ndarray:
        return t.detach().to("cpu", torch.float64).numpy()

    reference_options = {key: f64(value) if hasattr(value, "detach") else value
                         for key, value in options.items()
                         if key not in ("dropout_seed", "dropout_offset")}
    if "dropout" in features:
        randval = philox_dropout_randval(options["dropout_seed"], options["dropout_offset"],
                                         b, hq, sq, sk)
        reference_options["dropout_keep"] = dropout_keep(randval, options["dropout_p"])
    ref, _ = attention_reference(f64(q), f64(k), f64(v), **reference_options)
    got = f64(out)
    assert not np.isnan(got).any(), "unwritten outputs"
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert rel < REL_L2_TOL[dtype], f"relative L2 error {rel:.3e} against float64"
