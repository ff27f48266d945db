"""Compile units: kernel instances grouped so that one compiler process builds several.

nvcc's front end spends most of an instance's compile time instantiating templates that every
instance of the same kernel template shares (CuTe layouts, copies, MMA atoms); a second
instance of that template in the same translation unit adds a fraction of the first one's
cost (`benchmarks/notes/compile_time.md`). So instances of one (arch, template) are
compiled together, in as many units as there are parallel jobs to feed, at most
`MAX_INSTANCES_PER_UNIT` each so that one unit's memory and its wall time stay bounded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .signature import KernelConfig

# A unit of 12 sm80 forward instances peaks near 6 GB of compiler memory; more would also
# leave the last units of a parallel build running alone.
MAX_INSTANCES_PER_UNIT = 12


@dataclass(frozen=True)
class CompileUnit:
    """Instances of one arch and one kernel template, compiled as one translation unit."""

    name: str
    arch: str
    configs: tuple[KernelConfig, ...]


def _shape_key(config: KernelConfig) -> tuple[object, ...]:
    """Instances of one head-dim pair and tile share the most template instantiations."""
    sig, alg = config.signature, config.algorithm
    return (sig.hdim_q, sig.hdim_v, alg.tile_m, alg.tile_n, alg.warps, alg.stages, config.name)


def _split_evenly(items: Sequence[KernelConfig], parts: int) -> list[tuple[KernelConfig, ...]]:
    size, extra = divmod(len(items), parts)
    chunks, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        chunks.append(tuple(items[start:end]))
        start = end
    return chunks


def plan_units(
    configs: Sequence[KernelConfig],
    jobs: int,
    template_of: dict[str, str],
    max_per_unit: int = MAX_INSTANCES_PER_UNIT,
) -> list[CompileUnit]:
    """Groups configs by (arch, template header) and splits each group into units of at most
    ceil(len(configs) / jobs) (and `max_per_unit`) instances, largest units first so that a
    parallel build starts its longest work first. `template_of` maps a config name to its
    template header. With as many jobs as instances, every instance is a unit of its own."""
    if not configs:
        return []
    per_unit = max(1, min(max_per_unit, math.ceil(len(configs) / max(1, jobs))))
    groups: dict[tuple[str, str], list[KernelConfig]] = {}
    for config in configs:
        groups.setdefault((config.algorithm.arch, template_of[config.name]), []).append(config)
    units = []
    for (arch, header), members in sorted(groups.items()):
        members.sort(key=_shape_key)
        # The header's path below the kernel folder: sm80/fwd_launch.cuh and
        # sm90/fwd_launch.cuh share a file name.
        stem = header.removeprefix("ckfmha/kernel/").split(".", 1)[0].replace("/", "_")
        parts = math.ceil(len(members) / per_unit)
        for index, chunk in enumerate(_split_evenly(members, parts)):
            units.append(CompileUnit(f"unit_{arch}_{stem}_{index}", arch, chunk))
    units.sort(key=lambda unit: -len(unit.configs))
    return units
