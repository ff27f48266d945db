"""Compile time per kernel instance: one instance per translation unit against compile units.

    python benchmarks/compile_time.py --kernels default --arch sm_90a --filter '^fwd_' \
        --sample 24 --jobs 16 --out benchmarks/results/compile

Compiles the same sample of instances twice, in a scratch directory: each instance in a
translation unit of its own (how every instance was built before compile units), then as the
compile units the build makes for --jobs parallel processes (generator/units.py). Reports the
wall time of each way and its core-seconds per instance (the sum of the compiler processes' wall
times, which run one core each), and writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from generator import build, emit
from generator.build_config import BuildConfig
from generator.toolchain import CompileJob, CudaToolchain


def _timed_compile(toolchain: CudaToolchain, job: CompileJob) -> float:
    job.object.parent.mkdir(parents=True, exist_ok=True)
    command = toolchain.compile_command(job, job.object.with_suffix(".d"))
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"compile failed: {' '.join(command)}\n{result.stderr[-4000:]}")
    return time.perf_counter() - start


def _run(toolchain: CudaToolchain, jobs: list[CompileJob], workers: int) -> dict[str, float]:
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        seconds = list(pool.map(lambda job: _timed_compile(toolchain, job), jobs))
    return {"wall_s": time.perf_counter() - start, "core_s": sum(seconds),
            "processes": len(jobs), "longest_s": max(seconds)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kernels", default="default")
    parser.add_argument("--arch", default="sm_90a")
    parser.add_argument("--filter", default=None, help="regex over kernel names")
    parser.add_argument("--sample", type=int, default=16, help="instances (evenly spaced)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--plan-jobs", type=int, default=None,
                        help="jobs the units are planned for (default --jobs): the full build "
                        "plans for all its kernels, so a small sample planned for fewer jobs "
                        "gets units of the size the build's have")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--commit", default="unknown")
    args = parser.parse_args()

    config = BuildConfig(archs=(args.arch,), kernels=args.kernels, jobs=args.jobs,
                         kernel_filter=args.filter)
    accepted = build.select_from_config(config).accepted
    step = max(1, len(accepted) // args.sample)
    sample = accepted[::step][: args.sample]
    toolchain = CudaToolchain(build.arch_specs_for([args.arch]),
                              include_dirs=[ROOT / "cpp" / "include"])
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        emitted = emit.emit(work / "src", sample, [], build.load_specs(),
                            jobs=args.plan_jobs or args.jobs)
        single = [CompileJob(p, work / "single" / f"{p.name}.o", args.arch)
                  for p in emitted.instances]
        units = [CompileJob(p, work / "units" / f"{p.name}.o", u.arch) for p, u in emitted.units]
        separate = _run(toolchain, single, args.jobs)
        grouped = _run(toolchain, units, args.jobs)
    report = {
        "suite": "compile_time", "commit": args.commit, "kernels": args.kernels,
        "arch": args.arch, "filter": args.filter, "instances": len(sample), "jobs": args.jobs,
        "plan_jobs": args.plan_jobs or args.jobs,
        "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
        "nvcc": toolchain.version(),
        "one_per_unit": {**separate, "core_s_per_instance": separate["core_s"] / len(sample)},
        "compile_units": {**grouped, "core_s_per_instance": grouped["core_s"] / len(sample)},
    }
    for way in ("one_per_unit", "compile_units"):
        r = report[way]
        print(f"{way:>13}: {r['processes']:3d} processes, wall {r['wall_s']:6.1f} s, "
              f"{r['core_s_per_instance']:5.1f} core-s per instance, longest {r['longest_s']:.1f} s")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        label = re.sub(r"[^A-Za-z0-9]+", "-", args.filter or "all").strip("-")
        name = f"compile_{args.arch}_{label}"
        path = args.out / f"{name}_{args.commit}.json"
        path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
