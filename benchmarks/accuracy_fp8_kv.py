"""Accuracy of fp8 (e4m3) K/V attention against float64, beside the bf16 K/V kernel.

For random inputs and for outlier-heavy ones (a few channels per key 20-60x the others, the
rows that make amax / 448 scales coarse for everything else), per-tensor scales amax / 448
(not powers of two), the relative L2 error of:

- ``fp8_vs_dequant``: the fp8 kernel against float64 attention over the dequantised K/V
  (code * scale): the kernel's own error;
- ``bf16_dequant_vs_dequant``: the bf16 K/V kernel fed bf16(code * scale), against the same
  reference: what storing the dequantised cache in bf16 would cost;
- ``fp8_vs_bf16_kernel``: the fp8 output against the bf16 K/V kernel's on the original values;
- ``quantisation``: float64 attention over the dequantised K/V against float64 attention over
  the original values: what e4m3 storage itself costs.

    python benchmarks/accuracy_fp8_kv.py --commit $(git rev-parse --short HEAD) \
        --out benchmarks/results/fp8_kv
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
from pathlib import Path
from typing import Any

import torch

import ckfmha

E4M3_MAX = 448.0
# (batch, nhead_q, nhead_k, seqlen_q, seqlen_k, hdim): decode, GQA decode, a short prefill.
SHAPES = (
    (4, 32, 8, 1, 4097, 128),
    (2, 40, 8, 1, 20000, 128),
    (3, 12, 12, 5, 1000, 64),
    (1, 24, 3, 37, 3001, 128),
)


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref).norm() / ref.norm())


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """float64 attention, causal bottom-right (query i sees keys up to sk - sq + i)."""
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    s = torch.einsum("bhqd,bhkd->bhqk", q.double(), k) * scale
    sq, sk = q.shape[2], k.shape[2]
    rows = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
    s = s.masked_fill(torch.arange(sk, device=q.device)[None, :] > rows, float("-inf"))
    return torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, dim=-1), v)


def values(shape: tuple[int, ...], outliers: bool, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32)
    if outliers:
        d = shape[-1]
        channels = torch.randint(0, d, (2,), generator=gen, device="cuda")
        size = 20 + 40 * torch.rand(shape[:-1] + (2,), generator=gen, device="cuda")
        x.scatter_(-1, channels.expand(shape[:-1] + (2,)), size * torch.sign(
            torch.randn(shape[:-1] + (2,), generator=gen, device="cuda")))  # fmt: skip
    return x


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, float]:
    scale = float(x.abs().max()) / E4M3_MAX
    return (x / scale).to(torch.float8_e4m3fn), scale


def one_case(shape: tuple[int, ...], outliers: bool, seed: int) -> dict[str, Any]:
    b, hq, hk, sq, sk, d = shape
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = values((b, hq, sq, d), False, gen).to(torch.bfloat16)
    k = values((b, hk, sk, d), outliers, gen)
    v = values((b, hk, sk, d), outliers, gen)
    scale = d**-0.5
    k8, k_scale = quantize(k)
    v8, v_scale = quantize(v)
    k_deq, v_deq = k8.double() * k_scale, v8.double() * v_scale
    mask = {"causal": True, "causal_alignment": "bottom_right"}
    out_fp8 = ckfmha.fwd(q, k8, v8, k_scale=k_scale, v_scale=v_scale, scale=scale, **mask)
    out_bf16_deq = ckfmha.fwd(
        q, k_deq.to(torch.bfloat16), v_deq.to(torch.bfloat16), scale=scale, **mask
    )
    out_bf16 = ckfmha.fwd(q, k.to(torch.bfloat16), v.to(torch.bfloat16), scale=scale, **mask)
    torch.cuda.synchronize()
    ref_deq = reference(q, k_deq, v_deq, scale)
    ref_orig = reference(q, k.double(), v.double(), scale)
    return {
        "batch": b, "nhead_q": hq, "nhead_k": hk, "seqlen_q": sq, "seqlen_k": sk, "hdim": d,
        "inputs": "outliers" if outliers else "random", "k_scale": k_scale, "v_scale": v_scale,
        "fp8_vs_dequant": rel_l2(out_fp8, ref_deq),
        "bf16_dequant_vs_dequant": rel_l2(out_bf16_deq, ref_deq),
        "fp8_vs_bf16_kernel": rel_l2(out_fp8, out_bf16.double()),
        "bf16_vs_original": rel_l2(out_bf16, ref_orig),
        "quantisation": float((ref_deq - ref_orig).norm() / ref_orig.norm()),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", default="unknown", help="commit the library was built from")
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON")
    args = parser.parse_args()
    rows = [
        one_case(shape, outliers, seed)
        for seed, (shape, outliers) in enumerate(
            (shape, outliers) for shape in SHAPES for outliers in (False, True)
        )
    ]
    keys = ("fp8_vs_dequant", "bf16_dequant_vs_dequant", "fp8_vs_bf16_kernel",
            "bf16_vs_original", "quantisation")  # fmt: skip
    print(f"{'shape':<28} {'inputs':<8} " + " ".join(f"{k:>23}" for k in keys))
    for r in rows:
        shape = f"b{r['batch']} h{r['nhead_q']}/{r['nhead_k']} q{r['seqlen_q']} k{r['seqlen_k']} d{r['hdim']}"
        print(f"{shape:<28} {r['inputs']:<8} " + " ".join(f"{r[k]:>23.2e}" for k in keys))
    if args.out is not None:
        device = torch.cuda.get_device_name().replace(" ", "_")
        day = dt.date.today().isoformat()
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"accuracy_{device}_{day}_{args.commit}.json"
        meta = {"device": torch.cuda.get_device_name(), "commit": args.commit,
                "host": platform.node(), "torch": torch.__version__}  # fmt: skip
        path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
