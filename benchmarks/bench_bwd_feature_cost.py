"""What each backward feature costs on the Hopper template (the main stage), beside the plain one.

For every (shape, feature) the same backward runs on three main stages, forced by name from
the registry: the Hopper (sm90_tma_wgmma) kernel with the feature, the Hopper kernel without it
(the plain problem's gradients), and the sm80 template's kernel with the feature (what sm_90a
ran before the Hopper template took the feature). O and LSE come from ckfmha's plain forward
(the kernels' time does not depend on the values, and not every feature's forward is in the
default set at every head dim). Peer in the same run: torch SDPA's cuDNN backward on the plain
problem, its flash backward with the same dropout probability on dropout rows, and its cuDNN
backward with the key padding as an additive mask on padding rows. Rows whose feature has no
Hopper main stage in the build are left out.
TFLOP/s count 2.5 * 4 * d FLOPs per visible (query, key) pair.

    python benchmarks/bench_bwd_feature_cost.py --commit $(git rev-parse --short HEAD) \
        --out benchmarks/results/bwd_feature_cost
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from bench_bwd import BWD_FLOPS_FACTOR, sdpa_backward
from bench_feature_cost import (
    SHAPES,
    Shape,
    bias_kind,
    feature_options,
    heads_expanded,
    print_rows,
    registered_kernel,
    summarize_and_write,
    whole_mask,
)
from bench_fwd import add_run_arguments, median_ms, warm_up_device
from torch.nn.attention import SDPBackend

import ckfmha

# What the backward's Hopper template takes: soft-caps (Gemma 2), ALiBi (BLOOM, MPT), dropout and
# key-padding biases ([b, 1, 1, s]: padded batches), with causal masks, plus soft-capped d256
# (Gemma 2's head dim); key padding without a mask as well (encoders).
FEATURES = ("softcap", "alibi", "dropout", "padding")
BWD_SHAPES = (*[s for s in SHAPES if s.causal], Shape(2, 16, 8, 4096, 256, True))
UNMASKED_FEATURES = ("padding",)


def kernel_name(pipeline: str, dtype: str, shape: Shape, options: dict[str, Any]) -> str | None:
    """The registered batch-mode main stage of ``pipeline`` that serves the problem."""
    wanted = {
        "family": "bwd_dq_dk_dv", "pipeline": pipeline, "dtype": dtype, "mode": "batch",
        "hdim_q": shape.hdim, "hdim_v": shape.hdim, "mask": "causal" if shape.causal else "none",
        "bias": bias_kind(options),
        "dropout": "dropout_p" in options, "softcap": "softcap" in options, "dbias": False,
    }  # fmt: skip
    return registered_kernel(wanted)


def run_row(shape: Shape, feature: str, dtype: torch.dtype, dtype_name: str,
            args: argparse.Namespace) -> dict[str, Any] | None:  # fmt: skip
    b, hq, hk, s, d = shape.batch, shape.heads_q, shape.heads_k, shape.seqlen, shape.hdim
    q = torch.randn(b, hq, s, d, device="cuda", dtype=dtype)
    k = torch.randn(b, hk, s, d, device="cuda", dtype=dtype)
    v = torch.randn(b, hk, s, d, device="cuda", dtype=dtype)
    do = torch.randn_like(q)
    options = feature_options(feature, shape, dtype)
    mask = {"causal": True} if shape.causal else {}
    flops = BWD_FLOPS_FACTOR * shape.flops
    row: dict[str, Any] = {"shape": shape.label, "feature": feature, "flops": flops}
    runs = {
        "hopper_feature": ("sm90_tma_wgmma", options),
        "hopper_plain": ("sm90_tma_wgmma", {}),
        "sm80_feature": ("sm80_cpasync_mma", options),
    }
    names = {column: kernel_name(pipeline, dtype_name, shape, opts)
             for column, (pipeline, opts) in runs.items()}  # fmt: skip
    if names["hopper_feature"] is None:
        return None
    o, lse = ckfmha.fwd(q, k, v, return_lse=True, **mask)
    for column, (_, opts) in runs.items():
        name = names[column]
        row[f"{column}_kernel"] = name
        row[f"{column}_ms"] = (
            median_ms(lambda n=name, opts=opts: ckfmha.bwd(
                do, q, k, v, o, lse, kernel=n, **mask, **opts), args.warmup, args.iters,
                args.repeats)
            if name else None
        )  # fmt: skip
    row["cudnn_plain_ms"] = median_ms(
        sdpa_backward(SDPBackend.CUDNN_ATTENTION, q, k, v, do, shape.causal,
                      enable_gqa=hq != hk), args.warmup, args.iters, args.repeats)  # fmt: skip
    if feature == "padding":
        # The padding as SDPA's additive mask, causality folded in.
        kk, vv = heads_expanded(k, v, hq)
        row["cudnn_feature_ms"] = median_ms(
            sdpa_backward(SDPBackend.CUDNN_ATTENTION, q, kk, vv, do, False,
                          attn_mask=whole_mask(options["bias"], shape)),
            args.warmup, args.iters, args.repeats)  # fmt: skip
    if feature == "dropout":
        row["flash_feature_ms"] = median_ms(
            sdpa_backward(SDPBackend.FLASH_ATTENTION, q, k, v, do, shape.causal,
                          enable_gqa=hq != hk, dropout_p=options["dropout_p"]),
            args.warmup, args.iters, args.repeats)  # fmt: skip
    for key in [key for key in row if key.endswith("_ms")]:
        if row[key]:
            row[key.replace("_ms", "_tflops")] = flops / row[key] / 1e9
    plain, feat, old = row["hopper_plain_ms"], row["hopper_feature_ms"], row["sm80_feature_ms"]
    row["feature_vs_plain"] = plain / feat if plain and feat else None
    row["hopper_vs_sm80"] = old / feat if old and feat else None
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(parser, warmup=3, iters=10, repeats=5, out_help="directory for the JSON")
    args = parser.parse_args()

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    device = torch.cuda.get_device_name()
    warm_up_device()
    cases = [(shape, feature) for shape in BWD_SHAPES for feature in FEATURES]
    cases += [(shape, feature) for shape in SHAPES if not shape.causal
              for feature in UNMASKED_FEATURES]  # fmt: skip
    measured = (run_row(shape, feature, dtype, args.dtype, args) for shape, feature in cases)
    rows = [row for row in measured if row is not None]
    print(f"device: {device}  dtype: {args.dtype}  commit: {args.commit}  (backward, TFLOP/s)")
    print_rows(rows)
    for r in rows:
        flash = r.get("flash_feature_tflops")
        masked = r.get("cudnn_feature_tflops")
        print(f"  {r['shape']:30s} {r['feature']:10s} cuDNN plain "
              f"{r.get('cudnn_plain_tflops') or 0:6.0f}"
              + (f"  flash with dropout {flash:6.0f}" if flash else "")
              + (f"  cuDNN with the mask {masked:6.0f}" if masked else ""))
    summarize_and_write(rows, "bwd_feature_cost", "2.5 * 4*b*h*sq*sk*d, halved for causal",
                        device, args)

if __name__ == "__main__":
    main()
