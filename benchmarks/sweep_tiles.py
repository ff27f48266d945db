"""Tile, pipeline-depth and occupancy sweep of the sm80-path forward kernel.

Builds each candidate (tile_m, tile_n, warps, stages, ctas_per_sm) through the runtime
JIT, forces it by name on the standard long-sequence shape (16k tokens, hidden 2048,
bf16) and times it beside torch SDPA's flash and cuDNN backends on the same inputs. The
winners go into arch_specs.json; the run is recorded in benchmarks/notes/forward_sm80.md.

    python benchmarks/sweep_tiles.py --commit $(git rev-parse --short HEAD) --out DIR
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from bench_fwd import HIDDEN, TOTAL_TOKENS, median_ms, sdpa
from torch.nn.attention import SDPBackend

import ckfmha
import ckfmha.jit

# (tile_m, tile_n, warps, stages, ctas_per_sm) per head dim; the first is the current default.
CANDIDATES: dict[int, list[tuple[int, int, int, int, int]]] = {
    64: [(128, 64, 4, 1, 1), (128, 64, 4, 2, 1), (128, 128, 4, 1, 1), (128, 128, 4, 2, 1),
         (64, 64, 4, 2, 3)],
    128: [(128, 32, 4, 1, 1), (128, 32, 4, 2, 1), (128, 64, 4, 1, 1), (128, 64, 4, 2, 1)],
    256: [(64, 64, 4, 1, 1), (64, 32, 4, 2, 1), (128, 64, 8, 1, 1)],
}


@dataclass
class Candidate:
    hdim: int
    causal: bool
    config: Any  # generator KernelConfig


def candidate_configs(arch: str, hdims: list[int], dtype: str) -> list[Candidate]:
    gen = ckfmha.jit.generator_modules()
    spec = gen.specs.load_specs()[arch]
    found = []
    for hdim in hdims:
        for causal in (False, True):
            sig = gen.signature.FwdSignature(dtype, "batch", hdim, hdim,
                                             "causal" if causal else "none", True)
            for m, n, w, stages, ctas in CANDIDATES[hdim]:
                alg = gen.signature.Algorithm(arch, "sm80_cpasync_mma", m, n, hdim, w, stages,
                                              ctas)
                config = gen.signature.KernelConfig(sig, alg)
                reasons = gen.rules.check(config, spec)
                if reasons:
                    print(f"skip {config.name}: {reasons[0]}")
                    continue
                found.append(Candidate(hdim, causal, config))
    return found


def time_case(hdim: int, causal: bool, candidates: list[Candidate],
              args: argparse.Namespace) -> list[dict[str, Any]]:
    """Times the peers and every candidate of this head dim and mask on one set of inputs."""
    batch, heads = TOTAL_TOKENS // args.seqlen, HIDDEN // hdim
    shape = (batch, heads, args.seqlen, hdim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4.0 * batch * heads * args.seqlen**2 * hdim / (2 if causal else 1)
    peers = {
        "torch_flash": sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, causal),
        "torch_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, causal),
    }
    reference = peers["torch_flash"]().float()
    peer_tflops = {name: flops / median_ms(fn, args.warmup, args.iters, args.repeats) / 1e9
                   for name, fn in peers.items()}
    rows = []
    for cand in (c for c in candidates if c.hdim == hdim and c.causal == causal):
        alg = cand.config.algorithm

        def run(name: str = cand.config.name) -> Any:
            return ckfmha.fwd(q, k, v, causal=causal, kernel=name)

        diff = float((run().float() - reference).abs().max())
        tflops = flops / median_ms(run, args.warmup, args.iters, args.repeats) / 1e9
        rows.append({
            "hdim": hdim, "causal": causal, "kernel": cand.config.name,
            "tile_m": alg.tile_m, "tile_n": alg.tile_n, "warps": alg.warps,
            "stages": alg.stages, "ctas_per_sm": alg.ctas_per_sm, "tflops": tflops,
            **peer_tflops, "vs_flash": tflops / peer_tflops["torch_flash"],
            "max_abs_diff_vs_flash": diff,
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hdims", type=int, nargs="+", default=sorted(CANDIDATES))
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--arch", default="sm_90a")
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    candidates = candidate_configs(args.arch, args.hdims, "bf16")
    ckfmha.jit.build([c.config for c in candidates], max_workers=args.jobs)
    rows = [row for hdim in args.hdims for causal in (False, True)
            for row in time_case(hdim, causal, candidates, args)]
    device = torch.cuda.get_device_name()
    print(f"device: {device}  commit: {args.commit}  seqlen {args.seqlen} bf16")
    print(f"{'hdim':>4s} {'causal':>6s} {'tile':>16s} {'TFLOPS':>7s} {'flash':>7s} "
          f"{'/flash':>6s} {'maxdiff':>8s}")
    for r in rows:
        tile = f"{r['tile_m']}x{r['tile_n']}w{r['warps']}s{r['stages']}c{r['ctas_per_sm']}"
        print(f"{r['hdim']:4d} {r['causal']!s:>6s} {tile:>16s} {r['tflops']:7.1f} "
              f"{r['torch_flash']:7.1f} {r['vs_flash']:6.2f} {r['max_abs_diff_vs_flash']:8.1e}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        date = dt.date.today().isoformat()
        record = {"benchmark": "sweep_tiles", "device": device, "date": date,
                  "commit": args.commit, "seqlen": args.seqlen, "dtype": "bf16",
                  "torch": torch.__version__, "rows": rows}
        path = args.out / f"sweep_{device.replace(' ', '_')}_{date}_{args.commit}.json"
        path.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
