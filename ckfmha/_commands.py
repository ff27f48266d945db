"""``python -m ckfmha build`` (fill the kernel cache) and ``python -m ckfmha doctor`` (what this
installation has and what a first call would compile)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ckfmha import first_use, jit
from ckfmha._registry import Registry


def build_command(args: argparse.Namespace) -> int:
    """Compiles a kernel set or named kernels for each arch into the cache, with a progress bar."""
    gen = jit.generator_modules()
    specs = gen.specs.load_specs()
    names = [n for n in args.kernels.split(",") if n.strip()]
    is_set = len(names) == 1 and names[0].strip() in gen.receipts.RECEIPTS
    archs = [a for a in args.arch.replace(";", ",").split(",") if a] if args.arch else [None]
    if not is_set and args.arch:
        print("note: --arch applies to kernel sets; kernel names carry their own arch",
              file=sys.stderr)
        archs = [None]
    total = 0
    for arch in archs:
        target = jit.arch_spec_name(arch, specs) if is_set else None
        built = jit.build(
            names[0] if is_set else names,
            max_workers=args.jobs,
            cache_dir=args.cache_dir,
            arch=target,
            progress=True,
            load=False,
        )
        total += len(built)
        label = f"kernel set '{names[0]}' for {target}" if is_set else "named kernels"
        print(f"{label}: {len(built)} kernels available")
    cache = Path(args.cache_dir) if args.cache_dir else jit.default_cache_dir()
    print(f"{total} kernels in the library or the cache ({cache})")
    return 0


def _toolchain_lines() -> list[str]:
    toolchain = jit.generator_modules().toolchain
    lines = []
    try:
        nvcc = toolchain.find_nvcc()
        version = toolchain.CudaToolchain([], [], nvcc=nvcc, cutlass_include=Path("/")).version()
        lines.append(f"nvcc:            {nvcc} ({version})")
    except toolchain.ToolchainError as error:
        lines.append(f"nvcc:            missing: {error}")
    try:
        lines.append(f"CUTLASS headers: {toolchain.find_cutlass_include()}")
    except toolchain.ToolchainError as error:
        lines.append(f"CUTLASS headers: missing: {error}")
    lines.append(f"ckfmha headers:  {jit.kernel_include_dir()}")
    return lines


def _gpu_lines() -> list[str]:
    from ckfmha._device import device_arch, device_count

    count = device_count()
    if count == 0:
        return ["GPUs:            none visible (kernels build without one; runs need one)"]
    arches = ", ".join(f"cuda:{i} sm_{device_arch(i)}" for i in range(count))
    return [f"GPUs:            {count} ({arches})"]


def _library_lines(registry: Registry) -> list[str]:
    import ckfmha

    by_arch: dict[str, int] = {}
    for record in registry.kernels():
        by_arch[record["arch_name"]] = by_arch.get(record["arch_name"], 0) + 1
    counts = ", ".join(f"{n} for {arch}" for arch, n in sorted(by_arch.items())) or "none"
    cache = jit.default_cache_dir()
    modules = jit.cached_modules(cache)
    jit_state = "on" if first_use.enabled() else "off (CKFMHA_JIT=0)"
    return [
        f"ckfmha:          {ckfmha.__version__}, library in {ckfmha.get_library_dir()}",
        f"kernels:         {len(registry)} registered ({counts})",
        f"cache:           {cache} ({len(modules)} kernel entries, any version)",
        f"first use:       compiling on first use is {jit_state}",
    ]


def doctor_command(args: argparse.Namespace, problem: object | None) -> int:
    registry = Registry()
    lines = _library_lines(registry) + _toolchain_lines() + _gpu_lines()
    if problem is not None:
        from ckfmha._fwd import first_use_key

        key = first_use.key_of(first_use_key(problem))
        wanted = first_use.missing_kernels(key, args.arch)
        if wanted:
            noun = "kernel" if len(wanted) == 1 else "kernels"
            lines.append(f"first call:      compiles {len(wanted)} {noun}:")
            lines.extend(f"                 {name}" for name in wanted)
        else:
            lines.append("first call:      compiles nothing (its kernels are registered)")
    print("\n".join(lines))
    return 0
