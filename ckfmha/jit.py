"""Compile kernels the installed library lacks, cache them on disk, and register them.

    import ckfmha.jit
    ckfmha.jit.build("default", arch="sm_90a")       # a kernel set (receipt) by name
    ckfmha.jit.build(["fwd_fp16_batch_d64x64_none_lse__sm_80_..."])

Each kernel becomes its own shared module (exporting ckfmha_module_kernel_table),
so a later build only compiles what is new. Building needs nvcc and the CUTLASS/CuTe
headers (``pip install ckfmha[jit]``) but no GPU; loading needs only the library.
"""

from __future__ import annotations

import difflib
import importlib
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from ckfmha import _cache
from ckfmha._arch import parse_arch
from ckfmha._progress import ElapsedLine, Progress
from ckfmha.errors import UnsupportedError


class ToolchainError(RuntimeError):
    """nvcc or the CUTLASS/CuTe headers are missing: the message says how to install them."""

__all__ = [
    "ToolchainError",
    "arch_spec_name",
    "build",
    "default_cache_dir",
    "generator_modules",
    "preferred_configs",
    "resolve",
]

default_cache_dir = _cache.default_cache_dir


@dataclass(frozen=True)
class GeneratorModules:
    """The generator's modules, whichever package they were found in."""

    build: ModuleType
    emit: ModuleType
    enumerate: ModuleType
    receipts: ModuleType
    rules: ModuleType
    names: ModuleType
    signature: ModuleType
    specs: ModuleType
    toolchain: ModuleType


def kernel_include_dir() -> Path:
    """ckfmha's own headers, which kernel instances include (installed or in a checkout)."""
    import ckfmha

    return Path(ckfmha.get_include()[-1])


def generator_modules() -> GeneratorModules:
    names = (
        "build", "emit", "enumerate", "names", "receipts", "rules", "signature", "specs",
        "toolchain",
    )  # fmt: skip
    return GeneratorModules(
        **{name: importlib.import_module(f"generator.{name}") for name in names}
    )


def arch_spec_name(arch: int | str | None, specs: Mapping[str, Any]) -> str:
    """An arch_specs.json key for ``arch``; None means the current device's arch."""
    if isinstance(arch, str) and arch.strip() in specs:
        return arch.strip()
    number = parse_arch(arch)
    if number < 0:
        from ckfmha._device import device_arch

        number = device_arch()
    matches = sorted(name for name, spec in specs.items() if spec.arch_number == number)
    if not matches:
        raise UnsupportedError(
            f"no arch spec for sm_{number}; arch_specs.json knows {', '.join(sorted(specs))}", 2
        )
    # Prefer the arch-specific target (sm_90a): its kernels use the features that need it.
    return next((name for name in matches if name.endswith("a")), matches[0])


def _parse_name(gen: GeneratorModules, specs: Mapping[str, Any], name: str) -> Any:
    """The config a kernel name stands for, checked against the generator's rules."""
    config = gen.names.parse_kernel_name(name)
    if config is None:
        return None
    arch = specs.get(config.algorithm.arch)
    if arch is None:
        raise ValueError(f"kernel {name!r} names arch {config.algorithm.arch!r}, which "
                         f"arch_specs.json does not know ({', '.join(sorted(specs))})")
    reasons = gen.rules.check(config, arch)
    if reasons:
        raise ValueError(f"kernel {name!r} cannot be built: {'; '.join(reasons)}")
    return config


def _suggestions(gen: GeneratorModules, specs: Mapping[str, Any], name: str) -> str:
    known = {
        config.name
        for receipt in gen.receipts.RECEIPTS.values()
        for arch_name in specs
        for config in gen.enumerate.select(receipt, specs[arch_name]).accepted
    }
    close = difflib.get_close_matches(name, list(known), n=3)
    return f"; did you mean {', '.join(close)}?" if close else ""


def resolve(configs: str | Iterable[Any], arch: int | str | None = None) -> list[Any]:
    """KernelConfigs for a kernel set name, kernel names, or KernelConfig objects.

    ``arch`` applies to a kernel set; kernel names carry their own arch. Any name the
    generator would write is accepted, in a kernel set or not, if its rules allow the config.
    """
    gen = generator_modules()
    specs = gen.specs.load_specs()
    if isinstance(configs, str) and configs.strip() in gen.receipts.RECEIPTS:
        receipt = gen.receipts.get_receipt(configs)
        selection = gen.enumerate.select(receipt, specs[arch_spec_name(arch, specs)])
        return list(selection.accepted)
    items = [configs] if isinstance(configs, str) else list(configs)
    resolved = []
    for item in items:
        if isinstance(item, gen.signature.KernelConfig):
            resolved.append(item)
            continue
        if not isinstance(item, str):
            raise TypeError(
                f"expected a kernel set name, kernel names or KernelConfigs, got {item!r}"
            )
        config = _parse_name(gen, specs, item.strip())
        if config is None:
            raise ValueError(
                f"unknown kernel {item!r}: not a kernel set "
                f"({', '.join(gen.receipts.RECEIPTS)}) nor a kernel name"
                f"{_suggestions(gen, specs, item)}"
            )
        resolved.append(config)
    return list({config.name: config for config in resolved}.values())


def preferred_configs(
    signature: Any, spec: Any, excluded: Sequence[str] = (), bias_per_query: bool = False
) -> list[Any]:
    """The configs the generator accepts for ``signature`` on arch ``spec`` from its preferred
    template (the one the dispatcher ranks first) outside ``excluded``: the default tile, or
    every tile for the families whose tile the dispatcher picks by shape. With
    ``bias_per_query`` (an elementwise bias with a row per query) kernels that take only
    row-broadcast biases are left out. [] if no template takes it."""
    gen = generator_modules()
    receipt = gen.receipts.Receipt(
        name="first-use", description="", signatures=(signature,), all_tiles=False
    )
    accepted = [
        c for c in gen.enumerate.select(receipt, spec).accepted
        if c.algorithm.pipeline not in excluded
        and not (bias_per_query and gen.rules.bias_rows_only(c))
    ]  # fmt: skip
    return gen.enumerate.preferred_only(accepted)


@dataclass(frozen=True)
class _Planned:
    config: Any
    path: Path


def _plan(
    gen: GeneratorModules,
    kernels: Sequence[Any],
    specs: Mapping[str, Any],
    cache_dir: Path,
    toolchain: Any,
) -> list[_Planned]:
    """Where each kernel's module lives in the cache: the key covers the kernel's generated
    source, the compiler version and the kernel headers and CUTLASS headers it includes."""
    from ckfmha import __version__

    headers = _cache.headers_digest(kernel_include_dir(), toolchain.cutlass_include)
    planned = []
    for config in kernels:
        digest = _cache.source_hash(
            gen.emit.render_instance(config),
            gen.emit.render_table([config], specs, gen.emit.MODULE_TABLE_SYMBOL),
            headers,
        )
        directory = _cache.module_dir(
            cache_dir, __version__, toolchain.version(), config.algorithm.arch
        )
        planned.append(_Planned(config, _cache.module_path(directory, config.name, digest)))
    return planned


def _compile(
    gen: GeneratorModules,
    toolchain: Any,
    missing: Sequence[_Planned],
    specs: Mapping[str, Any],
    cache_dir: Path,
    max_workers: int,
    progress: bool | str,
) -> None:
    """Compiles the missing kernels as modules of one or more kernels each (compile units,
    generator/units.py), and publishes every kernel's cache entry."""
    destinations = {item.config.name: item.path for item in missing}
    units = gen.emit.units_for([item.config for item in missing], max_workers)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".build-") as scratch:
        jobs = []
        links = []
        for index, unit in enumerate(units):
            work = Path(scratch) / f"unit{index}"
            emitted = gen.emit.emit(
                work / "generated", unit.configs, [], specs, gen.emit.MODULE_TABLE_SYMBOL
            )
            objects = []
            for source, arch in ((emitted.units[0][0], unit.arch), (emitted.table, None)):
                objects.append(work / "obj" / f"{source.name}.o")
                jobs.append(gen.toolchain.CompileJob(source, objects[-1], arch))
            paths = [destinations[config.name] for config in unit.configs]
            links.append((objects, work / "module.so", paths))
        names = [item.config.name for item in missing]
        if progress == "line":
            bar: Any = ElapsedLine(names, units[0].arch)
        else:
            bar = Progress(len(jobs) + len(links), "ckfmha jit", bool(progress))

        def link(objects: list[Path], built: Path, paths: list[Path]) -> None:
            toolchain.link_shared(objects, built)
            _cache.publish_all(built, paths)
            bar.update()

        try:
            toolchain.compile_many(jobs, max_workers, lambda *_: bar.update())
            with ThreadPoolExecutor(max_workers=max_workers) as pool:
                for future in [pool.submit(link, *entry) for entry in links]:
                    future.result()
        finally:
            bar.close()


def _toolchain(gen: GeneratorModules, archs: Sequence[str], specs: Mapping[str, Any]) -> Any:
    try:
        return gen.toolchain.CudaToolchain(
            gen.build.arch_specs_for(archs, specs),
            include_dirs=[kernel_include_dir()],
        )
    except gen.toolchain.ToolchainError as error:
        raise ToolchainError(str(error)) from None


def build(
    configs: str | Iterable[Any],
    max_workers: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    arch: int | str | None = None,
    progress: bool | str = True,
    *,
    skip_registered: bool = True,
    load: bool = True,
) -> list[str]:
    """Make the given kernels available in this process; returns their names.

    configs: a kernel set name ("core", "ci", "default", "full"), kernel names, or generator
    KernelConfig objects. Kernels already registered (built into the library or
    loaded before) are skipped unless ``skip_registered`` is False; cached modules
    are loaded without compiling; the rest compile in parallel (``max_workers``
    nvcc processes, default one per CPU) into ``cache_dir`` (default
    $CKFMHA_CACHE_DIR or ~/.cache/ckfmha). ``arch`` picks the target of a kernel
    set (default: the current device's). ``progress``: a bar (True), nothing (False), or
    "line": one stderr line naming the kernels with the seconds elapsed.
    Two processes that need the same kernels compile them once (a lock on the cache).
    """
    from ckfmha._registry import Registry

    gen = generator_modules()
    specs = gen.specs.load_specs()
    kernels = resolve(configs, arch)
    registry = Registry()
    registered = set(registry.names()) if skip_registered else set()
    todo = [config for config in kernels if config.name not in registered]
    if not todo:
        return [config.name for config in kernels]
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    toolchain = _toolchain(gen, sorted({c.algorithm.arch for c in todo}), specs)
    planned = _plan(gen, todo, specs, root, toolchain)
    if any(not item.path.is_file() for item in planned):
        with _cache.locked(root):
            # Another process may have built them while this one waited for the lock.
            missing = [item for item in planned if not item.path.is_file()]
            if missing:
                workers = max(1, max_workers or os.cpu_count() or 1)
                _compile(gen, toolchain, missing, specs, root, workers, progress)
    if load:
        already = set(registry.names())
        for item in planned:
            if item.config.name not in already:
                registry.load_module(item.path)
                already = set(registry.names())
    return [config.name for config in kernels]


def cached_modules(cache_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Every module in the cache (any version), e.g. to inspect or prune it."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return sorted(root.glob("ckfmha-*/nvcc-*/*/*.so"))
