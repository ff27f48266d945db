"""Host time per call: ckfmha's Python and torch entry points beside SDPA's backends.

A problem small enough that the GPU finishes each call's kernels before the host has issued
the next call, so that the time per call of a few hundred calls queued without a wait is the
host's: argument checks, planning, allocation, autograd bookkeeping and the launches. Three
kinds of call per implementation:

- ``fwd``: the forward with no input requiring a gradient;
- ``fwd_grad``: the forward recording autograd's graph (q, k and v require a gradient);
- ``fwd_bwd``: that forward and ``o.backward(grad)``, a training step's attention.

Every call of a kind is timed beside the same kind through SDPA's flash and cuDNN backends in
the same run, taking turns within each round, and the best of several rounds counts (a round
is disturbed by the host, never helped by it).

    python benchmarks/bench_host.py --commit $(git rev-parse --short HEAD) \
        --out benchmarks/results/host
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from bench_fwd import results_stem, run_record, warm_up_device
from torch.nn.attention import SDPBackend, sdpa_kernel

import ckfmha
import ckfmha.torch

# (batch, heads, seqlen, hdim): tiny problems, a decode-sized one and a short prefill; the
# GPU time of each kind stays under its host time (the run checks and says so otherwise).
SHAPES = ((1, 8, 128, 64), (2, 16, 256, 64))
KINDS = ("fwd", "fwd_grad", "fwd_bwd")
PEERS = {"torch_flash": SDPBackend.FLASH_ATTENTION, "torch_cudnn": SDPBackend.CUDNN_ATTENTION}


def host_us(calls: dict[str, Callable[[], Any]], count: int, rounds: int) -> dict[str, float]:
    """Microseconds per call of ``count`` calls issued back to back, for each implementation:
    the best of ``rounds`` rounds, the implementations taking turns within each round so that
    a slow spell of the host falls on all of them alike."""
    for fn in calls.values():
        for _ in range(min(count, 50)):
            fn()
    torch.cuda.synchronize()
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(rounds):
        for name, fn in calls.items():
            start = time.perf_counter()
            for _ in range(count):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / count * 1e6)
            torch.cuda.synchronize()
    return best


def gpu_us(fn: Callable[[], Any], calls: int) -> float | None:
    """GPU time per call, from a CUDA graph of ``calls`` calls (no host work between them);
    None, with the reason printed, where the call cannot be captured."""
    try:
        return _graph_us(fn, calls)
    except RuntimeError as error:
        print(f"  (no CUDA graph: {error})", flush=True)
        return None


def _graph_us(fn: Callable[[], Any], calls: int) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def forwards(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict[str, Callable[[], Any]]:
    """Each implementation's causal forward over q, k, v (which may require a gradient)."""

    def peer(backend: SDPBackend) -> Callable[[], Any]:
        def call() -> Any:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        return call

    return {"ckfmha": lambda: ckfmha.torch.attention(q, k, v, causal=True),
            **{name: peer(backend) for name, backend in PEERS.items()}}  # fmt: skip


def kind_calls(shape: tuple[int, ...], dtype: torch.dtype) -> dict[str, dict[str, Callable]]:
    """kind -> implementation -> one call of that kind."""
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    grad = torch.randn(shape, device="cuda", dtype=dtype)
    plain, recorded = forwards(q, k, v), forwards(qg, kg, vg)

    def step(forward: Callable[[], Any]) -> Callable[[], None]:
        def call() -> None:
            forward().backward(grad)

        return call

    no_grad = {"ckfmha.fwd": lambda: ckfmha.fwd(q, k, v, causal=True), **plain}
    return {"fwd": no_grad, "fwd_grad": recorded,
            "fwd_bwd": {name: step(fn) for name, fn in recorded.items()}}  # fmt: skip


def check_outputs(shape: tuple[int, ...], dtype: torch.dtype) -> float:
    """ckfmha's causal forward against SDPA flash's on these inputs (max abs difference): the
    calls timed compute the same thing."""
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(3))
    ours = ckfmha.torch.attention(q, k, v, causal=True)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        theirs = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return float((ours.float() - theirs.float()).abs().max())


def run_shape(shape: tuple[int, ...], dtype: torch.dtype, args: argparse.Namespace) -> dict:
    row: dict[str, Any] = {"shape": "b{} h{} s{} d{}".format(*shape), "causal": True,
                           "max_abs_diff_vs_flash": check_outputs(shape, dtype)}  # fmt: skip
    for kind, calls in kind_calls(shape, dtype).items():
        host = host_us(calls, args.calls, args.rounds)
        gpu = {name: gpu_us(fn, 20) for name, fn in calls.items()}
        row[kind] = {"host_us": host, "gpu_us": gpu,
                     "ratio_vs_torch_flash": host["ckfmha"] / host["torch_flash"],
                     "ratio_vs_torch_cudnn": host["ckfmha"] / host["torch_cudnn"]}  # fmt: skip
        # A GPU slower than the host would make these GPU times, not host times.
        row[kind]["host_bound"] = all(gpu[name] is None or gpu[name] < host[name]
                                      for name in gpu)  # fmt: skip
    return row


def print_row(row: dict[str, Any]) -> None:
    for kind in KINDS:
        cells = "  ".join(f"{name} {us:6.1f}" for name, us in row[kind]["host_us"].items())
        print(f"{row['shape']:18s} {kind:9s} {cells}  /flash "
              f"{row[kind]['ratio_vs_torch_flash']:.2f}  /cudnn "
              f"{row[kind]['ratio_vs_torch_cudnn']:.2f}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    parser.add_argument("--calls", type=int, default=300, help="calls per timed round")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--commit", default="unknown", help="commit the library was built from")
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON")
    args = parser.parse_args()

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    device = torch.cuda.get_device_name()
    warm_up_device()
    rows = []
    print(f"device: {device}  dtype: {args.dtype}  commit: {args.commit}  (host us per call)")
    for shape in SHAPES:
        rows.append(run_shape(shape, dtype, args))
        print_row(rows[-1])
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        record = {**run_record("host", device, args.commit, args.dtype),
                  "method": f"best of {args.rounds} rounds of {args.calls} calls issued "
                            "without a wait, implementations taking turns in each round; GPU "
                            "time from a CUDA graph of 20 calls",
                  "rows": rows}  # fmt: skip
        (args.out / f"{results_stem(record)}.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
