"""fp8 (e4m3) attention forward: ckfmha over fp8 q, k and v beside ckfmha bf16, torch SDPA's
flash and cuDNN backends (bf16), and cuDNN's own fp8 SDPA, in the same run.

For each shape q, k and v are drawn in bf16 and quantised to e4m3 with per-tensor amax / 448
scales, and again with per-block scales (amax / 448 of each 128 tokens of a head: the
``ckfmha_fp8_block`` column); ckfmha fp8 writes bf16. cuDNN's fp8 SDPA (the cudnn frontend's ``sdpa_fp8`` graph,
when ``import cudnn`` works) takes the same codes and scales; it is asked for a bf16 output
and, where it refuses one (Hopper writes fp8 O), for an e4m3 output; the row says which.
Reported: TFLOP/s by the FlashAttention convention (4*b*h*sq*sk*d, halved for causal),
fp8 over ckfmha bf16 and over cuDNN fp8, and the fp8 output's relative L2 distance to the bf16
one (quantisation error, a sanity check; the GPU tests bound the kernel's own error).
FlashAttention-3's published fp8 forward figures ride along for comparison.

Shapes: the FA3 standard set (hidden 2048, heads 2048 / d, 16k tokens: seqlen 512 .. 16k,
batch 16k / seqlen) at d 64/128/256, causal and not, then a broad set (GQA 4 and 8, odd
lengths, 12/24/40 heads). ``--quick`` keeps a few of each.

    python benchmarks/bench_fp8_fwd.py --commit $(git rev-parse --short HEAD) \
        --out benchmarks/results/fp8_fwd [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from bench_fwd import geomean, median_ms, ratio, results_stem, run_record, sdpa, warm_up_device
from broad_cases import BroadCase
from torch.nn.attention import SDPBackend

import ckfmha

TOTAL_TOKENS = 16384
HIDDEN = 2048
FP8_MAX = 448.0
FP8_SCALE_BLOCK = 128
FA3_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
HDIMS = (64, 128, 256)
# FlashAttention-3 (Shah et al. 2024, fig. 7): fp8 forward, non-causal, 16k tokens, hidden
# 2048, H100 SXM5; TFLOP/s by hdim at its best sequence length.
FA3_FP8_TFLOPS = {64: 613, 128: 1008, 256: 1171}


def flops(case: BroadCase) -> float:
    """The FlashAttention-3 convention its fp8 figures use: 4*b*h*sq*sk*d, halved for causal."""
    full = 4.0 * case.batch * case.nhead_q * case.seqlen_q * case.seqlen_k * case.hdim
    return full / 2 if case.causal else full


@dataclass
class Row:
    case: BroadCase
    tflops: dict[str, float | None] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    cudnn_fp8_output: str | None = None
    fp8_rel_l2_vs_bf16: float | None = None
    fp8_block_rel_l2_vs_bf16: float | None = None


def fa3_suite(hdims: list[int], seqlens: list[int]) -> list[BroadCase]:
    return [BroadCase("fwd", TOTAL_TOKENS // s, HIDDEN // d, HIDDEN // d, s, s, d, d, causal,
                      standard=True)
            for d in hdims for s in seqlens for causal in (False, True)]  # fmt: skip


def broad_suite(quick: bool) -> list[BroadCase]:
    """GQA groups 4 and 8, odd lengths 1000..20000, 12/24/40 query heads, sq != sk."""
    shapes = [
        # (batch, hq, hk, sq, sk, d, causal)
        (4, 24, 6, 4097, 4097, 128, True),
        (2, 40, 5, 8191, 8191, 128, False),
        (16, 12, 3, 1000, 1000, 64, False),
        (1, 24, 3, 20000, 20000, 128, True),
        (2, 40, 10, 3001, 12007, 256, False),
        (8, 12, 12, 2049, 2049, 256, True),
        (1, 40, 5, 15000, 15000, 64, True),
        (3, 24, 24, 1000, 7777, 128, False),
    ]
    cases = [BroadCase("fwd", b, hq, hk, sq, sk, d, d, causal)
             for b, hq, hk, sq, sk, d, causal in shapes]  # fmt: skip
    return cases[:3] if quick else cases


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """e4m3 codes of x with a per-tensor amax / 448 scale."""
    amax = float(x.abs().amax())
    scale = amax / FP8_MAX if amax > 0 else 1.0
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def quantize_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 codes of x [b, h, s, d] with per-block scales: amax / 448 of each 128 tokens of a
    head, fp32 [b, h, ceil(s / 128)] (CKFMHA_FP8_SCALE_BLOCK)."""
    b, h, s, d = x.shape
    blocks = -(-s // FP8_SCALE_BLOCK)
    padded = torch.nn.functional.pad(x.float(), (0, 0, 0, blocks * FP8_SCALE_BLOCK - s))
    amax = padded.view(b, h, blocks, FP8_SCALE_BLOCK * d).abs().amax(dim=-1)
    scales = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    per_token = scales.repeat_interleave(FP8_SCALE_BLOCK, dim=-1)[..., :s, None]
    return (x.float() / per_token).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scales


def cudnn_fp8(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor,
              scales: tuple[float, float, float], causal: bool,
              ) -> tuple[Callable[[], Any], str]:  # fmt: skip
    """A cuDNN fp8 SDPA forward over bhsd e4m3 codes (cudnn frontend graph API), with its
    output dtype ("bf16", or "fp8_e4m3" where cuDNN writes fp8 only). Raises on any failure
    (no cudnn module, no engine for the shape), which the caller records."""
    import cudnn

    d = q8.shape[-1]
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    values = [*scales, 1.0, 1.0, 1.0]  # descale q, k, v; descale_s, scale_s, scale_o
    scalars = [torch.full((1, 1, 1, 1), x, device="cuda", dtype=torch.float32) for x in values]
    failures = []
    for out_name, out_type in (("bf16", cudnn.data_type.BFLOAT16),
                               ("fp8_e4m3", cudnn.data_type.FP8_E4M3)):  # fmt: skip
        try:
            graph = cudnn.pygraph(
                io_data_type=cudnn.data_type.FP8_E4M3,
                intermediate_data_type=cudnn.data_type.FLOAT,
                compute_data_type=cudnn.data_type.FLOAT,
                handle=handle,
            )
            tensors = [graph.tensor_like(t) for t in (q8, k8, v8)]
            scale_tensors = [graph.tensor_like(t) for t in scalars]
            o, _, amax_s, amax_o = graph.sdpa_fp8(
                *tensors, *scale_tensors, is_inference=True, attn_scale=1.0 / math.sqrt(d),
                use_causal_mask=causal)  # fmt: skip
            out = torch.empty(q8.shape, device="cuda", dtype=(
                torch.bfloat16 if out_name == "bf16" else torch.float8_e4m3fn))  # fmt: skip
            o.set_output(True).set_dim(list(out.shape)).set_stride(
                list(out.stride())).set_data_type(out_type)  # fmt: skip
            amaxes = [torch.empty((1, 1, 1, 1), device="cuda") for _ in range(2)]
            for tensor, like in zip((amax_s, amax_o), amaxes):
                tensor.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1])
                tensor.set_data_type(cudnn.data_type.FLOAT)
            graph.validate()
            graph.build_operation_graph()
            graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            graph.check_support()
            graph.build_plans()
        except Exception as exc:  # noqa: BLE001 (cudnn raises its own types: "not here")
            failures.append(f"{out_name} output: {str(exc).splitlines()[0][:160]}")
            continue
        workspace = torch.empty(graph.get_workspace_size(), device="cuda", dtype=torch.uint8)
        pack = dict(zip(tensors + scale_tensors + [o, amax_s, amax_o],
                        [q8, k8, v8, *scalars, out, *amaxes]))  # fmt: skip

        def run(graph: Any = graph, pack: dict = pack, workspace: Any = workspace) -> Any:
            graph.execute(pack, workspace, handle=handle)

        return run, out_name
    raise RuntimeError("; ".join(failures))


def run_case(case: BroadCase, args: argparse.Namespace, cudnn_note: str | None) -> Row:
    row = Row(case)
    shape_q = (case.batch, case.nhead_q, case.seqlen_q, case.hdim)
    shape_k = (case.batch, case.nhead_k, case.seqlen_k, case.hdim)
    q, k, v = (torch.randn(s, device="cuda", dtype=torch.bfloat16)
               for s in (shape_q, shape_k, shape_k))  # fmt: skip
    (q8, qs), (k8, ks), (v8, vs) = quantize(q), quantize(k), quantize(v)
    (qb, qbs), (kb, kbs), (vb, vbs) = quantize_blocks(q), quantize_blocks(k), quantize_blocks(v)
    gqa = {"enable_gqa": True} if case.nhead_k != case.nhead_q else {}
    causal = {"causal": True, "causal_alignment": case.causal_alignment} if case.causal else {}
    out8, out8b, out16 = torch.empty_like(q), torch.empty_like(q), torch.empty_like(q)
    impls: dict[str, Callable[[], Any]] = {
        "ckfmha_fp8": lambda: ckfmha.fwd(q8, k8, v8, q_scale=qs, k_scale=ks, v_scale=vs,
                                         out=out8, **causal),
        "ckfmha_fp8_block": lambda: ckfmha.fwd(qb, kb, vb, q_scale=qbs, k_scale=kbs,
                                               v_scale=vbs, out=out8b, **causal),
        "ckfmha_bf16": lambda: ckfmha.fwd(q, k, v, out=out16, **causal),
        "torch_flash": sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, case.causal, **gqa),
        "torch_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, case.causal, **gqa),
    }  # fmt: skip
    if cudnn_note is not None:
        row.skipped["cudnn_fp8"] = cudnn_note
    elif case.nhead_k != case.nhead_q or case.seqlen_q != case.seqlen_k:
        # Kept to the shapes cuDNN's fp8 graph is documented for: equal heads and lengths.
        row.skipped["cudnn_fp8"] = "GQA or seqlen_q != seqlen_k not set up for cuDNN fp8"
    else:
        try:
            impls["cudnn_fp8"], row.cudnn_fp8_output = cudnn_fp8(q8, k8, v8, (qs, ks, vs),
                                                                 case.causal)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 (recorded: no cuDNN fp8 graph for this shape)
            row.skipped["cudnn_fp8"] = str(exc)[:300]
    for name, fn in impls.items():
        try:
            ms = median_ms(fn, args.warmup, args.iters, args.repeats)
            row.tflops[name] = flops(case) / ms / 1e9
        except (RuntimeError, ckfmha.CkfmhaError) as exc:  # a backend refusing this shape
            row.tflops[name] = None
            row.skipped[name] = str(exc).splitlines()[0][:300]
    if row.tflops.get("ckfmha_fp8") and row.tflops.get("ckfmha_bf16"):
        diff = (out8.float() - out16.float()).norm() / out16.float().norm()
        row.fp8_rel_l2_vs_bf16 = float(diff)
    if row.tflops.get("ckfmha_fp8_block") and row.tflops.get("ckfmha_bf16"):
        diff = (out8b.float() - out16.float()).norm() / out16.float().norm()
        row.fp8_block_rel_l2_vs_bf16 = float(diff)
    return row


def cudnn_available() -> str | None:
    """None when the cudnn frontend imports, else why not (recorded in every row)."""
    try:
        import cudnn

        return None if hasattr(cudnn, "pygraph") else "cudnn module has no pygraph"
    except Exception as exc:  # noqa: BLE001 (ImportError, or a shared library underneath)
        return f"import cudnn failed: {str(exc).splitlines()[0][:200]}"


def fmt(x: float | None, spec: str) -> str:
    return format(x, spec) if x is not None else "-"


def print_table(rows: list[Row]) -> None:
    names = ("ckfmha_fp8", "ckfmha_fp8_block", "ckfmha_bf16", "torch_flash", "torch_cudnn",
             "cudnn_fp8")  # fmt: skip
    print(f"{'case':36s} " + " ".join(f"{n:>11s}" for n in names)
          + f" {'fp8/bf16':>8s} {'fp8/cuDNN8':>10s} {'rel L2':>7s}")  # fmt: skip
    for r in rows:
        t = r.tflops
        print(f"{r.case.label:36s} " + " ".join(fmt(t.get(n), "11.1f") for n in names)
              + f" {fmt(ratio(t.get('ckfmha_fp8'), t.get('ckfmha_bf16')), '8.2f')}"
              f" {fmt(ratio(t.get('ckfmha_fp8'), t.get('cudnn_fp8')), '10.2f')}"
              f" {fmt(r.fp8_rel_l2_vs_bf16, '7.1e')}")  # fmt: skip


def summary(rows: list[Row]) -> dict[str, Any]:
    def gm(a: str, b: str) -> float | None:
        return geomean([ratio(r.tflops.get(a), r.tflops.get(b)) for r in rows])

    fa3 = {}
    for d, published in FA3_FP8_TFLOPS.items():
        ours = [r.tflops.get("ckfmha_fp8") for r in rows
                if r.case.standard and r.case.hdim == d and not r.case.causal]  # fmt: skip
        best = max((x for x in ours if x), default=None)
        fa3[f"d{d}"] = {"best_ckfmha_fp8": best, "fa3_published": published,
                        "ratio": ratio(best, published)}  # fmt: skip
    return {
        "geomean_fp8_over_ckfmha_bf16": gm("ckfmha_fp8", "ckfmha_bf16"),
        "geomean_block_scales_over_tensor_scales": gm("ckfmha_fp8_block", "ckfmha_fp8"),
        "geomean_fp8_over_cudnn_fp8": gm("ckfmha_fp8", "cudnn_fp8"),
        "geomean_fp8_over_torch_cudnn_bf16": gm("ckfmha_fp8", "torch_cudnn"),
        "best_non_causal_vs_fa3_published": fa3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hdims", type=int, nargs="+", default=list(HDIMS))
    parser.add_argument("--seqlens", type=int, nargs="+", default=list(FA3_SEQLENS))
    parser.add_argument(
        "--quick", action="store_true", help="seqlens 2048 and 16384 of the FA3 set, 3 broad shapes"
    )
    parser.add_argument("--no-broad", action="store_true", help="the FA3 set only")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--commit", default="unknown", help="commit the library was built from")
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON")
    args = parser.parse_args()

    seqlens = [2048, 16384] if args.quick else args.seqlens
    cases = fa3_suite(args.hdims, seqlens)
    if not args.no_broad:
        cases += broad_suite(args.quick)
    device = torch.cuda.get_device_name()
    warm_up_device()
    note = cudnn_available()
    rows = []
    for case in cases:
        rows.append(run_case(case, args, note))
        torch.cuda.empty_cache()  # the case's tensors died with run_case
        print(f"  {case.label}: " + ", ".join(
            f"{n} {fmt(t, '.0f')}" for n, t in rows[-1].tflops.items()), flush=True)  # fmt: skip
    print(f"device: {device}  q/k/v e4m3 (per-tensor scales), bf16 out  commit: {args.commit}")
    print_table(rows)
    result_summary = summary(rows)
    print(json.dumps(result_summary, indent=1))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        record = {
            **run_record("fp8_fwd", device, args.commit, "fp8_e4m3"),
            "output_dtype": "bf16",
            "flops_convention": "4*b*h*sq*sk*d, halved for causal",
            "fa3_published_fp8_tfops": {
                "source": "FlashAttention-3 (Shah et al. 2024), fp8 forward, non-causal, 16k "
                          "tokens, hidden 2048, H100 SXM5",
                "by_hdim": FA3_FP8_TFLOPS,
            },
            "cudnn_frontend": note or "available",
            "summary": result_summary,
            "rows": [{**asdict(r.case), "flops": flops(r.case), "label": r.case.label,
                      **{k: v for k, v in asdict(r).items() if k != "case"}}
                     for r in rows],
        }  # fmt: skip
        path = args.out / f"{results_stem(record)}.json"
        path.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
