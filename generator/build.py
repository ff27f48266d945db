"""Generate -> compile -> link: one path for setup.py (libckfmha.so) and the JIT (modules)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import emit
from .build_config import BuildConfig
from .enumerate import Rejection, Selection, select_for_arches
from .receipts import compile_filter, get_receipt
from .signature import KernelConfig
from .specs import ArchSpec, get_arch, load_specs
from .toolchain import CompileJob, ProgressFn, Toolchain


@dataclass(frozen=True)
class LibraryBuild:
    library: Path
    kernels: tuple[KernelConfig, ...]
    rejected: tuple[Rejection, ...]
    objects: tuple[Path, ...]


def select_from_config(
    config: BuildConfig, specs: Mapping[str, ArchSpec] | None = None
) -> Selection:
    specs = specs or load_specs()
    return select_for_arches(
        get_receipt(config.kernels), config.archs, specs, compile_filter(config.kernel_filter)
    )


def arch_specs_for(
    archs: Iterable[str], specs: Mapping[str, ArchSpec] | None = None
) -> list[ArchSpec]:
    specs = specs or load_specs()
    return [get_arch(specs, name) for name in dict.fromkeys(archs)]


def _object_for(source: Path, object_dir: Path) -> Path:
    # Keep the suffix so foo.cpp and foo.cu cannot collide.
    return object_dir / f"{source.name}.o"


def build_shared_library(
    toolchain: Toolchain,
    kernels: Sequence[KernelConfig],
    output: Path,
    work_dir: Path,
    *,
    rejected: Sequence[Rejection] = (),
    runtime_sources: Sequence[Path] = (),
    table_symbol: str = emit.BUILTIN_TABLE_SYMBOL,
    jobs: int = 1,
    progress: ProgressFn | None = None,
    specs: Mapping[str, ArchSpec] | None = None,
) -> LibraryBuild:
    """Emits sources into work_dir/generated, objects into work_dir/obj, links `output`.

    The toolchain's include dirs must contain work_dir/generated (for ckfmha_kernels.h).
    """
    specs = specs or load_specs()
    generated = work_dir / "generated"
    emitted = emit.emit(generated, kernels, rejected, specs, table_symbol, jobs)
    compile_jobs = [
        CompileJob(src, _object_for(src, work_dir / "obj" / unit.arch), unit.arch)
        for src, unit in emitted.units
    ]
    compile_jobs.append(
        CompileJob(emitted.table, _object_for(emitted.table, work_dir / "obj"), None)
    )
    compile_jobs.extend(
        CompileJob(src, _object_for(src, work_dir / "obj" / "runtime"), None)
        for src in runtime_sources
    )
    objects = toolchain.compile_many(compile_jobs, jobs, progress)
    toolchain.link_shared(objects, output)
    return LibraryBuild(output, tuple(kernels), tuple(rejected), tuple(objects))
