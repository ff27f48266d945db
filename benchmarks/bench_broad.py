"""Broad suite: ckfmha beside torch SDPA's flash and cuDNN backends on shapes models use.

The cases (``broad_cases.py``): GQA groups 1/4/8, 12/24/40 query heads, head dims 64, 96, 128,
192x128 and 256, lengths 1000-20000 that are not powers of two, causal and not, a few with
seqlen_q != seqlen_k (causal ones aligned bottom-right), decode steps over 1k-32k keys at batch
1-64, and the 18 standard cases of bench_fwd.py and of bench_bwd.py (marked standard), so
that a weak corner shows beside the suites the README quotes. Forward and backward are rated in
TFLOP/s (FlashAttention convention, ``BroadCase.flops``), decode in GB/s of Q, K/V and O moved,
beside the device-to-device copy bandwidth measured in the same run. ckfmha's output is
compared with each peer's (relative L2) so that a fast wrong kernel shows. A peer that refuses
a case gets no rate, with its reasons in the JSON; GQA reaches it through ``enable_gqa`` where it
takes that, else as K/V expanded with repeat_interleave before (outside) the timed region.

About four minutes on an H100 at the default settings by broad_cases.estimated_seconds (assumed
rates from the standard suites' results plus a fixed cost per case; ``--list`` prints it, and a
run prints its wall time beside it). Kernels outside the prebuilt core compile on first use
(20-50 s each, before their timing): ``python -m ckfmha build --kernels default --arch sm_90a
-j 16`` fills the cache first.

    python benchmarks/bench_broad.py --commit $(git rev-parse --short HEAD)
    python benchmarks/bench_broad.py --list                  # cases and estimate, no GPU needed
    python benchmarks/bench_broad.py --quick --kinds fwd bwd  # smoke run: a few cases a kind
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from bench_bwd import sdpa_backward
from bench_bwd import standard_suite as bwd_standard_suite
from bench_fwd import (
    STANDARD_HDIMS,
    STANDARD_SEQLENS,
    fmt,
    geomean,
    matmul_tflops,
    median_ms,
    ratio,
    results_stem,
    run_record,
    sdpa,
    warm_up_device,
)
from bench_fwd import standard_suite as fwd_standard_suite
from broad_cases import (
    KINDS,
    BroadCase,
    estimated_run_seconds,
    estimated_seconds,
    quick_cases,
    select,
    suite,
)
from broad_plot import plot_ratio_records
from torch.nn.attention import SDPBackend
from torch.nn.attention.bias import causal_lower_right

import ckfmha

PEERS = {"torch_flash": SDPBackend.FLASH_ATTENTION, "torch_cudnn": SDPBackend.CUDNN_ATTENTION}
IMPLS = ("ckfmha", *PEERS)
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
RESULTS = Path(__file__).resolve().parent / "results" / "broad"
# ckfmha's output against a peer's above this relative L2 error marks the row: two correct bf16
# kernels differ by a few 1e-3 in the forward and about 1e-2 in the backward, a wrong one by ~1.
REL_L2_LIMIT = {"fwd": 2e-2, "bwd": 5e-2, "decode": 2e-2}
COPY_BYTES = 1 << 31  # a copy large enough to run at the HBM rate, not from L2
WARMUP, ITERS, REPEATS = 3, 10, 5  # the defaults the run-time estimate is quoted at
TORCH_SOURCE_LOCATION = re.compile(r"\s*\(Triggered internally at [^)]*\)")


@dataclass
class Measurement:
    """One implementation on one case: its median time, its rate, how it was called."""

    ms: float | None = None
    rate: float | None = None  # TFLOP/s for fwd and bwd, GB/s for decode
    gqa: str | None = None  # "none" (group 1), "native", "enable_gqa" or "repeat_interleave"
    mask: str | None = None  # "none", "is_causal", "causal_lower_right", "dense_mask", ckfmha's
    # False: the peer ran with a handicap (a dense mask), so its ratio stays out of the summaries.
    comparable: bool = True
    error: str | None = None


@dataclass
class Row:
    case: BroadCase
    results: dict[str, Measurement] = field(default_factory=dict)
    kernel: str = ""
    rel_l2: dict[str, float] = field(default_factory=dict)  # ckfmha's output against each peer's

    def ratio(self, peer: str) -> float | None:
        """ckfmha's rate over the peer's (its speed-up), None where either has no rate."""
        ours, theirs = self.results.get("ckfmha"), self.results.get(peer)
        if ours is None or theirs is None or not theirs.comparable:
            return None
        return ratio(ours.rate, theirs.rate)

    @property
    def suspect(self) -> bool:
        return any(err > REL_L2_LIMIT[self.case.kind] for err in self.rel_l2.values())


@dataclass
class PeerInputs:
    """One way of handing a case to an SDPA backend."""

    k: Any
    v: Any
    is_causal: bool
    kwargs: dict[str, Any]
    gqa: str
    mask: str
    comparable: bool


def one_line(text: str) -> str:
    """A message's first line, without torch's "(Triggered internally at file:line.)"."""
    lines = TORCH_SOURCE_LOCATION.sub("", text).strip().splitlines()
    return lines[0][:200] if lines else ""


def first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {one_line(str(exc))}"


def refusal(exc: BaseException, caught: list[warnings.WarningMessage]) -> str:
    """The error, with the reasons torch gives as warnings when no SDPA kernel fits."""
    reasons = dict.fromkeys(one_line(str(w.message)) for w in caught)
    return "; ".join([first_line(exc), *filter(None, reasons)])


def peer_inputs(case: BroadCase, peer: str, k: Any, v: Any) -> Iterator[PeerInputs]:
    """The ways to hand the case to the peer, best first; the K/V expansion happens here,
    before any timing, and only when enable_gqa was refused."""
    sq, sk = case.seqlen_q, case.seqlen_k
    is_causal, mask_kwargs, mask, comparable = case.causal, {}, "none", True
    if case.causal:
        mask = "is_causal"
    if case.causal and sq != sk:
        is_causal = False
        if peer == "torch_flash":
            # SDPA's CausalBias runs a lower-right mask on flash's own bottom-right causal kernel.
            mask_kwargs, mask = {"attn_mask": causal_lower_right(sq, sk)}, "causal_lower_right"
        else:
            # Elsewhere SDPA would materialize it on every call: built once here instead, and
            # the ratio left out of the summaries (reading a dense mask is extra work).
            dense = torch.ones(sq, sk, dtype=torch.bool, device="cuda").tril(sk - sq)
            mask_kwargs, mask, comparable = {"attn_mask": dense}, "dense_mask", False
    if case.group == 1:
        yield PeerInputs(k, v, is_causal, mask_kwargs, "none", mask, comparable)
        return
    yield PeerInputs(k, v, is_causal, {**mask_kwargs, "enable_gqa": True}, "enable_gqa", mask,
                     comparable)  # fmt: skip
    k_all, v_all = (t.repeat_interleave(case.group, dim=1) for t in (k, v))
    yield PeerInputs(k_all, v_all, is_causal, mask_kwargs, "repeat_interleave", mask, comparable)


def prepare_peer(case: BroadCase, peer: str, q: Any, k: Any, v: Any,
                 do: Any) -> tuple[Callable[[], Any] | None, Measurement, Any]:  # fmt: skip
    """The peer's call in the first way it accepts the case, how it was called, and its
    first output (a backward's gradients with dK/dV summed over the group); else no call and
    its reasons."""
    errors = []
    for inputs in peer_inputs(case, peer, k, v):
        caught: list[warnings.WarningMessage] = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if case.kind == "bwd":
                    fn = sdpa_backward(PEERS[peer], q, inputs.k, inputs.v, do, inputs.is_causal,
                                       **inputs.kwargs)  # fmt: skip
                else:
                    fn = sdpa(PEERS[peer], q, inputs.k, inputs.v, inputs.is_causal,
                              **inputs.kwargs)  # fmt: skip
                out = fn()
                torch.cuda.synchronize()
        except (RuntimeError, ValueError, TypeError) as exc:  # a backend refusing the case
            errors.append(f"{inputs.gqa}: {refusal(exc, caught)}")
            torch.cuda.empty_cache()
            continue
        if case.kind == "bwd" and inputs.gqa == "repeat_interleave":
            dq, dk, dv = out
            out = (dq, *(t.unflatten(1, (case.nhead_k, case.group)).sum(2) for t in (dk, dv)))
        measurement = Measurement(gqa=inputs.gqa, mask=inputs.mask, comparable=inputs.comparable)
        return fn, measurement, out
    return None, Measurement(error=" | ".join(errors)), None


def prepare_ckfmha(case: BroadCase, q: Any, k: Any, v: Any,
                   do: Any) -> tuple[Callable[[], Any] | None, Measurement, Any]:  # fmt: skip
    """ckfmha's call (a backward given O and LSE from a forward made here) and first output."""
    mask = f"causal_{case.causal_alignment}" if case.causal else "none"
    measurement = Measurement(gqa="native" if case.group > 1 else "none", mask=mask)
    options = {"causal": case.causal, "causal_alignment": case.causal_alignment}
    try:
        if case.kind == "bwd":
            o, lse = ckfmha.fwd(q, k, v, return_lse=True, **options)
            fn: Callable[[], Any] = lambda: ckfmha.bwd(do, q, k, v, o, lse, **options)
        else:
            fn = lambda: ckfmha.fwd(q, k, v, **options)
        out = fn()
        torch.cuda.synchronize()
    except (RuntimeError, ckfmha.CkfmhaError) as exc:
        measurement.error = first_line(exc)
        return None, measurement, None
    return fn, measurement, out


def ckfmha_kernel(case: BroadCase) -> str:
    """The kernel ckfmha's dispatcher picks (the backward's main stage; decode: the plan)."""
    fields = {"batch": case.batch, "nhead_q": case.nhead_q, "nhead_k": case.nhead_k,
              "seqlen_q": case.seqlen_q, "seqlen_k": case.seqlen_k, "hdim": case.hdim,
              "hdim_v": case.hdim_v, "dtype": case.dtype, "causal": case.causal,
              "causal_alignment": case.causal_alignment}  # fmt: skip
    dispatcher = ckfmha.Dispatcher()
    try:
        if case.kind == "bwd":
            return dispatcher.select_bwd(**fields)[1]
        if case.kind == "decode":
            return dispatcher.explain(**fields).rstrip().splitlines()[-1].strip()
        return dispatcher.select(**fields)
    except ckfmha.CkfmhaError as exc:
        return f"(none: {first_line(exc)})"


def rel_l2(ours: Any, theirs: Any) -> float:
    """||ours - theirs|| / ||theirs|| in fp32; for gradients, the largest over dq, dk, dv."""
    if isinstance(ours, tuple):
        return max(rel_l2(a, b) for a, b in zip(ours, theirs))
    theirs = theirs.float()
    return float((ours.float() - theirs).norm() / theirs.norm())


def make_inputs(case: BroadCase) -> tuple[Any, Any, Any, Any]:
    dtype = TORCH_DTYPES[case.dtype]

    def randn(*shape: int) -> Any:
        return torch.randn(shape, device="cuda", dtype=dtype)

    b, sq, sk = case.batch, case.seqlen_q, case.seqlen_k
    q = randn(b, case.nhead_q, sq, case.hdim)
    k = randn(b, case.nhead_k, sk, case.hdim)
    v = randn(b, case.nhead_k, sk, case.hdim_v)
    do = randn(b, case.nhead_q, sq, case.hdim_v) if case.kind == "bwd" else None
    return q, k, v, do


def run_case(case: BroadCase, args: argparse.Namespace) -> Row:
    row = Row(case, kernel=ckfmha_kernel(case))
    q, k, v, do = make_inputs(case)
    work = case.bytes_moved / 1e6 if case.kind == "decode" else case.flops / 1e9
    outputs = {}
    for name in IMPLS:
        if name == "ckfmha":
            fn, measurement, out = prepare_ckfmha(case, q, k, v, do)
        else:
            fn, measurement, out = prepare_peer(case, name, q, k, v, do)
        row.results[name] = measurement
        if fn is None:
            print(f"    {name} unavailable: {(measurement.error or '')[:160]}")
            continue
        outputs[name] = out
        try:
            measurement.ms = median_ms(fn, args.warmup, args.iters, args.repeats)
            measurement.rate = work / measurement.ms
        except (RuntimeError, ckfmha.CkfmhaError) as exc:
            measurement.error = first_line(exc)
        del fn
    if "ckfmha" in outputs:
        for peer in PEERS:
            if peer in outputs:
                row.rel_l2[peer] = rel_l2(outputs["ckfmha"], outputs[peer])
    del q, k, v, do, outputs
    torch.cuda.empty_cache()
    return row


def copy_gbps(args: argparse.Namespace) -> float:
    """Device-to-device copy bandwidth: bytes read plus bytes written by one Tensor.copy_."""
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), args.warmup, args.iters, args.repeats)
    return 2 * COPY_BYTES / ms / 1e6


def summarize(rows: list[Row], copy_rate: float | None) -> dict[str, dict[str, Any]]:
    """Per kind: geomean ratios against each peer (all cases, the standard ones, the others),
    the worst case, how many cases each implementation could not run, the largest error."""
    summary: dict[str, dict[str, Any]] = {}
    for kind in KINDS:
        kind_rows = [r for r in rows if r.case.kind == kind]
        if not kind_rows:
            continue
        entry: dict[str, Any] = {"cases": len(kind_rows)}
        subsets = {"all": kind_rows, "standard": [r for r in kind_rows if r.case.standard],
                   "broad": [r for r in kind_rows if not r.case.standard]}  # fmt: skip
        for peer in PEERS:
            for subset, subset_rows in subsets.items():
                entry[f"geomean_vs_{peer}_{subset}"] = geomean([r.ratio(peer) for r in subset_rows])
            rated = [(r.ratio(peer), r.case.label) for r in kind_rows if r.ratio(peer)]
            worst = min(rated, default=None)
            entry[f"worst_vs_{peer}"] = {"ratio": worst[0], "case": worst[1]} if worst else None
        for name in IMPLS:
            entry[f"{name}_no_rate"] = sum(r.results[name].rate is None for r in kind_rows)
        errors = [max(r.rel_l2.values()) for r in kind_rows if r.rel_l2]
        entry["max_rel_l2"] = max(errors, default=None)
        entry["rel_l2_over_limit"] = [r.case.label for r in kind_rows if r.suspect]
        if kind == "decode" and copy_rate:
            fractions = [r.results["ckfmha"].rate / copy_rate for r in kind_rows
                         if r.results["ckfmha"].rate]  # fmt: skip
            entry["median_fraction_of_copy"] = statistics.median(fractions) if fractions else None
        summary[kind] = entry
    return summary


def row_notes(row: Row) -> str:
    notes = ["std"] if row.case.standard else []
    notes += [f"{name.removeprefix('torch_')}:expanded-kv" for name, m in row.results.items()
              if m.gqa == "repeat_interleave"]  # fmt: skip
    notes += [f"{name.removeprefix('torch_')}:dense-mask" for name, m in row.results.items()
              if not m.comparable]  # fmt: skip
    notes += [f"{name.removeprefix('torch_')}:refused" for name, m in row.results.items()
              if m.rate is None]  # fmt: skip
    if row.suspect:
        notes.append("REL-L2-OVER-LIMIT")
    return " ".join(notes)


def cell(value: float | None, spec: str, width: int) -> str:
    return f"{fmt(value, spec):>{width}}"


def print_tables(rows: list[Row], summary: dict[str, dict[str, Any]],
                 copy_rate: float | None) -> None:  # fmt: skip
    for kind in KINDS:
        kind_rows = [r for r in rows if r.case.kind == kind]
        if not kind_rows:
            continue
        unit = "GB/s" if kind == "decode" else "TFLOP/s"
        extra = f" {'%copy':>6s}" if kind == "decode" else ""
        print(f"\n{kind} ({unit}; /peer: ckfmha's speed-up over it; rel L2: the largest against "
              f"a peer)")  # fmt: skip
        print(f"{'case':38s} {'ckfmha':>8s} {'flash':>8s} {'cudnn':>8s} {'/flash':>7s} "
              f"{'/cudnn':>7s} {'rel L2':>8s}{extra}  notes")  # fmt: skip
        for r in kind_rows:
            rates = [r.results[name].rate for name in IMPLS]
            share = ratio(rates[0], copy_rate)
            extra = f" {cell(100 * share if share else None, '.1f', 6)}" if kind == "decode" else ""
            print(f"{r.case.label:38s} {' '.join(cell(x, '.1f', 8) for x in rates)} "
                  f"{cell(r.ratio('torch_flash'), '.2f', 7)} {cell(r.ratio('torch_cudnn'), '.2f', 7)} "
                  f"{cell(max(r.rel_l2.values(), default=None), '.1e', 8)}{extra}  {row_notes(r)}")
        s = summary[kind]
        for peer in PEERS:
            worst = s[f"worst_vs_{peer}"]
            print(f"  vs {peer}: geomean {fmt(s[f'geomean_vs_{peer}_all'], '.3f')} (standard "
                  f"{fmt(s[f'geomean_vs_{peer}_standard'], '.3f')}, broad "
                  f"{fmt(s[f'geomean_vs_{peer}_broad'], '.3f')}); worst "
                  + (f"{worst['ratio']:.3f} {worst['case']}" if worst else "-")
                  + f"; no rate in {s[f'{peer}_no_rate']} of {s['cases']}")  # fmt: skip
        print(f"  ckfmha: no rate in {s['ckfmha_no_rate']}; largest rel L2 "
              f"{fmt(s['max_rel_l2'], '.1e')}; over the limit: {s['rel_l2_over_limit'] or 'none'}")
        if kind == "decode" and s.get("median_fraction_of_copy") is not None:
            print(f"  ckfmha at a median {100 * s['median_fraction_of_copy']:.1f}% of the copy "
                  f"bandwidth ({copy_rate:.0f} GB/s, read + written)")


def row_record(row: Row) -> dict[str, Any]:
    case = row.case
    return {
        **asdict(case), "label": case.label, "group": case.group,
        "causal_alignment": case.causal_alignment, "tokens": case.tokens, "flops": case.flops,
        "bytes": case.bytes_moved, "rate_unit": "GB/s" if case.kind == "decode" else "TFLOP/s",
        "kernel": row.kernel, "rel_l2": row.rel_l2,
        "impls": {name: asdict(m) for name, m in row.results.items()},
        **{f"ratio_vs_{peer}": row.ratio(peer) for peer in PEERS},
    }  # fmt: skip


def build_cases(dtype: str, quick: bool, kinds: list[str]) -> list[BroadCase]:
    if quick:
        return select(quick_cases(dtype), kinds)
    fwd = fwd_standard_suite(list(STANDARD_HDIMS), list(STANDARD_SEQLENS))
    bwd = bwd_standard_suite(list(STANDARD_HDIMS), list(STANDARD_SEQLENS))
    return select(suite(fwd, bwd, dtype), kinds)


def calls_per_impl(warmup: int, iters: int, repeats: int) -> int:
    """Calls each implementation makes on a case: the first (checked), warm-up, timed."""
    return 1 + warmup + iters * repeats


def print_cases(cases: list[BroadCase], calls: int) -> None:
    print(f"{'#':>3s} {'kind':6s} {'case':38s} {'std':3s} {'GFLOP | MB':>10s} {'est s':>6s}")
    for i, c in enumerate(cases):
        work = c.bytes_moved / 1e6 if c.kind == "decode" else c.flops / 1e9
        print(f"{i:3d} {c.kind:6s} {c.label:38s} {'std' if c.standard else '':3s} "
              f"{work:10.0f} {estimated_seconds(c, calls):6.2f}")
    counts = ", ".join(f"{sum(c.kind == kind for c in cases)} {kind}" for kind in KINDS)
    print(f"{len(cases)} cases ({counts}); estimated {estimated_run_seconds(cases, calls):.0f} s "
          f"on an H100 at {calls} calls per implementation (broad_cases.estimated_seconds)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    parser.add_argument("--warmup", type=int, default=WARMUP)
    parser.add_argument("--iters", type=int, default=ITERS)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: a few broad cases of each kind")  # fmt: skip
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--list", action="store_true",
                        help="print the cases and the estimated run time, then exit (no GPU)")
    parser.add_argument("--commit", default="unknown", help="commit the library was built from")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for JSON and plot")
    args = parser.parse_args()

    cases = build_cases(args.dtype, args.quick, args.kinds)
    calls = calls_per_impl(args.warmup, args.iters, args.repeats)
    if args.list:
        print_cases(cases, calls)
        return
    if not torch.cuda.is_available():
        parser.error("timing needs a CUDA device (--list works without one)")

    device = torch.cuda.get_device_name()
    estimate = estimated_run_seconds(cases, calls)
    print(f"device: {device}  dtype: {args.dtype}  commit: {args.commit}  {len(cases)} cases, "
          f"estimated {estimate:.0f} s")
    start = time.perf_counter()
    warm_up_device()
    copy_rate = copy_gbps(args) if "decode" in args.kinds else None
    rows = []
    for i, case in enumerate(cases):
        print(f"[{i + 1}/{len(cases)}] {case.kind} {case.label}", flush=True)
        rows.append(run_case(case, args))
    matmul_rate = matmul_tflops(TORCH_DTYPES[args.dtype])
    wall_s = time.perf_counter() - start
    summary = summarize(rows, copy_rate)
    print_tables(rows, summary, copy_rate)
    print(f"\nmatmul {matmul_rate:.0f} TFLOP/s; copy {fmt(copy_rate, '.0f')} GB/s; "
          f"{len(rows)} cases in {wall_s:.0f} s (estimated {estimate:.0f} s)")

    args.out.mkdir(parents=True, exist_ok=True)
    record = {
        **run_record("broad", device, args.commit, args.dtype), "ckfmha": ckfmha.__version__,
        "settings": {"warmup": args.warmup, "iters": args.iters, "repeats": args.repeats,
                     "quick": args.quick, "kinds": args.kinds},
        "flops_convention": "2*b*hq*pairs*(hdim + hdim_v), pairs = sq*sk, half of it when "
                            "causal with sq == sk, counted exactly when causal with sq != sk "
                            "(bottom-right); bwd 2.5x",
        "bytes_convention": "decode: q and K/V read, O written, each once; copy: bytes read + "
                            "written by one Tensor.copy_",
        "peer_calls": "gqa enable_gqa where the backend takes it, else repeat_interleave: K/V "
                      "expanded before the timed region (a backward's dK/dV then per query head, "
                      "summed over the group for the error only); mask dense_mask: a boolean "
                      "mask built outside the timed region, ratio left out of the summary",
        "copy_gbps": copy_rate, "matmul_tflops": matmul_rate, "wall_s": wall_s,
        "estimated_s": estimate, "summary": summary,
        "rows": [row_record(r) for r in rows],
    }  # fmt: skip
    stem = results_stem(record)
    if args.kinds != list(KINDS):  # a run of some kinds names them: broad-fwd-decode_...
        stem = stem.replace("broad", "broad-" + "-".join(args.kinds), 1)
    path = args.out / f"{stem}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    plot_ratio_records(record["rows"], args.out / f"{stem}.png",
                       f"{device}, {args.dtype}, commit {args.commit}")  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
