"""What each forward feature costs on the Hopper template, at shapes outside the standard suite.

For every (shape, feature) the same problem runs on three kernels, forced by name from the
registry: the Hopper (sm90_tma_wgmma) kernel with the feature, the Hopper kernel without it
(the plain problem), and the sm80 template's kernel with the feature (what sm_90a ran before
the Hopper template took features). Peers in the same run: torch SDPA's cuDNN backend on the
plain problem, and on the bias problem (attn_mask), and its flash backend on the dropout one.
A key-padding bias also runs as a bias of every query row (``full``), which is what the
kernels get from a mask that is not recognised as padding.
TFLOP/s count 4 * d FLOPs per visible (query, key) pair.

    python benchmarks/bench_feature_cost.py --commit $(git rev-parse --short HEAD) \
        --out benchmarks/results/feature_cost
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from bench_fwd import geomean, median_ms, results_stem, run_record, sdpa, warm_up_device
from torch.nn.attention import SDPBackend

import ckfmha

# The feature sets models use with each mask (the default kernel set's signatures): soft-cap
# (Gemma 2), ALiBi (BLOOM, MPT), sinks (gpt-oss) and dropout with causal masks, all four
# together; a key-padding bias ([b, 1, 1, s], one row broadcast over the queries: padded
# batches) with and without a causal mask; an additive bias (relative positions) and dropout
# without a mask.
CAUSAL_FEATURES = ("softcap", "alibi", "sink", "dropout", "alibi+dropout",
                   "bias+dropout+softcap+sink", "padding")
UNMASKED_FEATURES = ("bias", "padding", "dropout")


@dataclass(frozen=True)
class Shape:
    batch: int
    heads_q: int
    heads_k: int
    seqlen: int
    hdim: int
    causal: bool

    @property
    def label(self) -> str:
        mask = " causal" if self.causal else ""
        return (f"b{self.batch} h{self.heads_q}/{self.heads_k} s{self.seqlen} "
                f"d{self.hdim}{mask}")

    @property
    def flops(self) -> float:
        pairs = self.seqlen * (self.seqlen + 1) / 2 if self.causal else self.seqlen**2
        return 4.0 * self.batch * self.heads_q * self.hdim * pairs


# GQA groups of 1, 3 and 5, head counts 12/24/40, d64 and d128, both masks; key counts that
# are whole 16-byte bias rows (the Hopper kernel's bias ring) and odd ones (its register path).
SHAPES = (
    Shape(2, 16, 16, 4096, 128, True),
    Shape(1, 40, 8, 3001, 128, False),
    Shape(2, 24, 8, 4000, 128, False),
    Shape(4, 24, 8, 2048, 64, True),
    Shape(2, 12, 12, 4097, 64, False),
    Shape(4, 24, 24, 2000, 64, False),
)


def feature_options(feature: str, shape: Shape, dtype: torch.dtype) -> dict[str, Any]:
    """ckfmha.fwd's keyword arguments for a feature set ("a+b": all of them)."""
    options: dict[str, Any] = {}
    h, s = shape.heads_q, shape.seqlen
    for name in feature.split("+"):
        if name == "softcap":
            options["softcap"] = 30.0
        elif name == "alibi":
            options["alibi_slopes"] = torch.rand(h, device="cuda") * 0.1 + 0.01
        elif name == "bias":
            # Broadcast over the batch, as padding masks and relative-position biases come.
            options["bias"] = torch.randn(1, h, s, s, device="cuda", dtype=dtype).expand(
                shape.batch, h, s, s)
        elif name == "padding":
            # Each sequence valid up to its own length (at least half), -inf past it.
            lengths = torch.randint(s // 2, s + 1, (shape.batch,), device="cuda")
            keys = torch.arange(s, device="cuda")
            padded = keys[None, :] >= lengths[:, None]
            bias = torch.zeros(shape.batch, 1, 1, s, device="cuda", dtype=dtype)
            options["bias"] = bias.masked_fill(padded[:, None, None, :], float("-inf"))
        elif name == "sink":
            options["sink"] = torch.randn(h, device="cuda")
        elif name == "dropout":
            options.update(dropout_p=0.1, dropout_seed=1234, dropout_offset=0)
    return options


def bias_kind(options: dict[str, Any]) -> str:
    """The registry's bias field for a feature's keyword arguments (``feature_options``)."""
    return "alibi" if "alibi_slopes" in options else "elementwise" if "bias" in options else "none"


def heads_expanded(k: torch.Tensor, v: torch.Tensor, heads_q: int) -> tuple[torch.Tensor, ...]:
    """K and V repeated to the query heads: SDPA's cuDNN backend takes an additive mask but
    expands GQA itself only in its flash backend."""
    return tuple(t.repeat_interleave(heads_q // t.shape[1], dim=1) for t in (k, v))


def kernel_name(pipeline: str, dtype: str, shape: Shape, options: dict[str, Any]) -> str | None:
    """The registered batch-mode LSE kernel of ``pipeline`` that serves the problem."""
    wanted = {
        "family": "fwd", "pipeline": pipeline, "dtype": dtype, "mode": "batch",
        "hdim_q": shape.hdim, "hdim_v": shape.hdim, "lse": True,
        "mask": "causal" if shape.causal else "none", "bias": bias_kind(options),
        "dropout": "dropout_p" in options, "softcap": "softcap" in options,
        "sink": "sink" in options, "v_col_major": False, "kv_quant": "none", "q_quant": "none",
    }  # fmt: skip
    names = registered_kernels(wanted)
    if len(names) > 1:
        # Several tiles of one signature (the d64 192-row companion of row-broadcast biases):
        # the one the dispatcher picks for this problem.
        bias = options.get("bias")
        problem = ckfmha.FwdProblem(
            batch=shape.batch, nhead_q=shape.heads_q, nhead_k=shape.heads_k,
            seqlen_q=shape.seqlen, hdim=shape.hdim, dtype=dtype, causal=shape.causal, lse=True,
            bias=wanted["bias"], bias_rows_broadcast=rows_broadcast(bias),
            sink=wanted["sink"], dropout_p=options.get("dropout_p", 0.0),
            softcap=options.get("softcap", 0.0))  # fmt: skip
        chosen = ckfmha.Dispatcher().select(problem)
        return chosen if chosen in names else names[0]
    return names[0] if names else None


def rows_broadcast(bias: torch.Tensor | None) -> bool:
    """Whether a bias repeats one row for every query (size 1 or stride 0 there)."""
    return bias is not None and (bias.shape[-2] == 1 or bias.stride(-2) == 0)


def registered_kernels(wanted: dict[str, Any]) -> list[str]:
    """The registered kernels for this device's arch whose fields match ``wanted``."""
    arch = ckfmha.device_arch()
    return [
        k["name"] for k in ckfmha.Registry().kernels()
        if all(k[key] == value for key, value in wanted.items()) and k["arch"] == arch
    ]  # fmt: skip


def registered_kernel(wanted: dict[str, Any]) -> str | None:
    """The first registered kernel for this device's arch whose fields match ``wanted``."""
    names = registered_kernels(wanted)
    return names[0] if names else None


def timed(fn: Callable[[], Any], args: argparse.Namespace) -> float:
    return median_ms(fn, args.warmup, args.iters, args.repeats)


def run_row(shape: Shape, feature: str, dtype: torch.dtype, dtype_name: str,
            args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    b, hq, hk, s, d = shape.batch, shape.heads_q, shape.heads_k, shape.seqlen, shape.hdim
    q = torch.randn(b, hq, s, d, device="cuda", dtype=dtype)
    k = torch.randn(b, hk, s, d, device="cuda", dtype=dtype)
    v = torch.randn(b, hk, s, d, device="cuda", dtype=dtype)
    options = feature_options(feature, shape, dtype)
    mask = {"causal": True} if shape.causal else {}
    row: dict[str, Any] = {"shape": shape.label, "feature": feature, "flops": shape.flops}
    runs = {
        "hopper_feature": ("sm90_tma_wgmma", options),
        "hopper_plain": ("sm90_tma_wgmma", {}),
        "sm80_feature": ("sm80_cpasync_mma", options),
    }
    for column, (pipeline, opts) in runs.items():
        name = kernel_name(pipeline, dtype_name, shape, opts)
        row[f"{column}_kernel"] = name
        row[f"{column}_ms"] = (
            timed(lambda n=name, o=opts: ckfmha.fwd(q, k, v, kernel=n, return_lse=True,
                                                     **mask, **o), args)
            if name else None
        )  # fmt: skip
    gqa = {"enable_gqa": hq != hk}
    row["cudnn_plain_ms"] = timed(sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, shape.causal, **gqa),
                                  args)
    if feature in ("bias", "padding"):
        # The bias as SDPA's additive mask, causality folded in (SDPA takes a mask or
        # is_causal, not both).
        kk, vv = heads_expanded(k, v, hq)
        row["cudnn_feature_ms"] = timed(
            sdpa(SDPBackend.CUDNN_ATTENTION, q, kk, vv, False,
                 attn_mask=whole_mask(options["bias"], shape)), args)  # fmt: skip
    if feature == "padding":
        # The same padding as a bias of every query row, [b, 1, s, s]: what a mask that is not
        # recognised as padding costs.
        full = options["bias"].expand(b, 1, s, s).contiguous()
        name = kernel_name("sm90_tma_wgmma", dtype_name, shape, {"bias": full})
        row["hopper_full_kernel"] = name
        row["hopper_full_ms"] = (
            timed(lambda: ckfmha.fwd(q, k, v, kernel=name, return_lse=True, bias=full, **mask),
                  args) if name else None)  # fmt: skip
    if feature == "dropout":
        row["flash_feature_ms"] = timed(
            sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, shape.causal, dropout_p=0.1, **gqa), args)
    for key in [key for key in row if key.endswith("_ms")]:
        if row[key]:
            row[key.replace("_ms", "_tflops")] = shape.flops / row[key] / 1e9
    plain, feat, old = row["hopper_plain_ms"], row["hopper_feature_ms"], row["sm80_feature_ms"]
    row["feature_vs_plain"] = plain / feat if plain and feat else None
    row["hopper_vs_sm80"] = old / feat if old and feat else None
    return row


def whole_mask(bias: torch.Tensor, shape: Shape) -> torch.Tensor:
    """``bias`` over every query row, with -inf above the diagonal for a causal shape."""
    s = shape.seqlen
    whole = bias.expand(bias.shape[0], bias.shape[1], s, s)
    if not shape.causal:
        return whole
    above = torch.ones(s, s, dtype=torch.bool, device=bias.device).triu(1)
    return whole.masked_fill(above, float("-inf"))


def _cell(value: float | None, spec: str, width: int) -> str:
    return format(value, spec) if value else "-".rjust(width)


def print_rows(rows: list[dict[str, Any]]) -> None:
    print(f"{'shape':30s} {'feature':26s} {'feat':>6s} {'plain':>6s} {'sm80':>6s} "
          f"{'full':>6s} {'cudnn':>6s} {'/plain':>7s} {'/sm80':>7s}")
    for r in rows:
        cells = [_cell(r.get(f"{key}_tflops"), "6.0f", 6)
                 for key in ("hopper_feature", "hopper_plain", "sm80_feature", "hopper_full",
                             "cudnn_feature")]
        cells += [_cell(r[key], "7.3f", 7) for key in ("feature_vs_plain", "hopper_vs_sm80")]
        print(f"{r['shape']:30s} {r['feature']:26s} {' '.join(cells)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--commit", default="unknown", help="commit the library was built from")
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON")
    parser.add_argument("--features", default=None,
                        help="comma-separated features to run (default: every one)")
    args = parser.parse_args()
    only = set(args.features.split(",")) if args.features else None

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    device = torch.cuda.get_device_name()
    warm_up_device()
    rows = [
        run_row(shape, feature, dtype, args.dtype, args)
        for shape in SHAPES
        for feature in (CAUSAL_FEATURES if shape.causal else UNMASKED_FEATURES)
        if only is None or feature in only
    ]
    print(f"device: {device}  dtype: {args.dtype}  commit: {args.commit}  (TFLOP/s)")
    print_rows(rows)
    summarize_and_write(rows, "feature_cost", "4*b*h*sq*sk*d, halved for causal", device, args)


def summarize_and_write(rows: list[dict[str, Any]], benchmark: str, flops_convention: str,
                        device: str, args: argparse.Namespace) -> None:  # fmt: skip
    """Print the geomeans of the feature kernels against the plain and the sm80 ones, and write
    the rows as ``benchmark``'s JSON under ``args.out`` (if given)."""
    summary: dict[str, Any] = {
        key: geomean([r[key] for r in rows if r[key]])
        for key in ("feature_vs_plain", "hopper_vs_sm80")
    }
    summary["rows_below_0.90_of_plain"] = sum(
        1 for r in rows if r["feature_vs_plain"] and r["feature_vs_plain"] < 0.90)
    print({k: (round(v, 3) if isinstance(v, float) and math.isfinite(v) else v)
           for k, v in summary.items()})
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        record = {
            **run_record(benchmark, device, args.commit, args.dtype),
            "flops_convention": flops_convention,
            "summary": summary,
            "rows": rows,
        }
        (args.out / f"{results_stem(record)}.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
