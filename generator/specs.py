"""Loads arch_specs.json, the single source of truth for what each GPU arch can build."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from generator.signature import Signature

SPECS_FILE_NAME = "arch_specs.json"


class SpecsError(ValueError):
    """arch_specs.json is missing or malformed, or an arch name is unknown."""


@dataclass(frozen=True)
class TileSpec:
    """One tile choice from the table; tile_k is implied by the head dim. Row-wise backward
    stages have no key tile: their entries omit tile_n (0) and stages (1)."""

    tile_m: int
    tile_n: int
    warps: int
    stages: int
    ctas_per_sm: int = 1
    # Signature fields this tile is limited to ("mask": ("none",), ...); empty: every
    # signature. A signature's default tile is the first entry that applies to it.
    when: tuple[tuple[str, tuple[str | bool, ...]], ...] = ()
    # Built beside the default tile in every kernel set, not only in sets of every tile: the
    # dispatcher picks between the two per problem (the Hopper d64 192-row tile takes
    # row-broadcast biases only, the default 128-row tile every other bias).
    companion: bool = False

    def applies_to(self, signature: Signature) -> bool:
        # A field another family's signature has (rope, page_layout) limits the tile to
        # signatures that have it.
        return all(getattr(signature, key, None) in values for key, values in self.when)


@dataclass(frozen=True)
class ArchSpec:
    name: str
    compute_capability: tuple[int, int]
    gencode: str
    max_dynamic_smem_per_block: int
    registers_per_sm: int
    max_registers_per_thread: int
    max_threads_per_block: int
    dtypes: tuple[str, ...]
    pipelines: tuple[str, ...]
    # tiles[family][pipeline][(hdim_q, hdim_v)]; the first tile of each list is the default.
    tiles: Mapping[str, Mapping[str, Mapping[tuple[int, int], tuple[TileSpec, ...]]]]

    @property
    def arch_number(self) -> int:
        """10*major+minor, the value the runtime compares with the device's arch."""
        major, minor = self.compute_capability
        return 10 * major + minor

    def tiles_for(
        self, family: str, pipeline: str, hdim_q: int, hdim_v: int | None = None
    ) -> tuple[TileSpec, ...]:
        key = (hdim_q, hdim_q if hdim_v is None else hdim_v)
        return self.tiles.get(tile_table_family(family), {}).get(pipeline, {}).get(key, ())

    def hdims_for(self, family: str, pipeline: str) -> tuple[tuple[int, int], ...]:
        """(hdim_q, hdim_v) pairs with a tile table."""
        return tuple(sorted(self.tiles.get(tile_table_family(family), {}).get(pipeline, {})))


# Families without a table of their own: the paged kernels are the split-KV body with a paged
# address mode, so they take its tiles (and the dispatcher picks among them the same way).
SHARED_TILE_TABLES = {"fwd_pagedkv": "fwd_splitkv", "batch_prefill": "fwd_splitkv"}


def tile_table_family(family: str) -> str:
    """The family whose tile table `family` uses."""
    return SHARED_TILE_TABLES.get(family, family)


def hdim_label(hdim_q: int, hdim_v: int) -> str:
    """Tile-table key: "128" for equal head dims, "192x128" otherwise."""
    return str(hdim_q) if hdim_q == hdim_v else f"{hdim_q}x{hdim_v}"


def parse_hdim_label(label: str) -> tuple[int, int]:
    q, _, v = label.partition("x")
    return int(q), int(v or q)


def find_specs_file() -> Path:
    """A source checkout (and an editable install) keeps it at the repository root; a built
    package carries a copy that setup.py places beside these modules."""
    here = Path(__file__).resolve().parent
    for candidate in (here / SPECS_FILE_NAME, here.parent / SPECS_FILE_NAME):
        if candidate.is_file():
            return candidate
    raise SpecsError(
        f"{SPECS_FILE_NAME} not found in {here} or {here.parent}; it ships at the repository "
        "root and inside the installed generator package"
    )


@functools.cache
def when_fields() -> dict[str, type]:
    """Signature fields a tile's `when` may name, with the type of their values: the text-valued
    and the flag fields of every family's signature (a head dim would need ranges)."""
    from dataclasses import fields

    from generator.signature import AppendKvSignature, BwdSignature, FwdSignature

    kinds = {"str": str, "bool": bool}
    return dict(sorted(
        (f.name, kinds[str(f.type)])
        for cls in (FwdSignature, BwdSignature, AppendKvSignature)
        for f in fields(cls)
        if str(f.type) in kinds
    ))  # fmt: skip


def when_keys() -> tuple[str, ...]:
    return tuple(when_fields())


def _parse_when(raw: Any, where: str) -> tuple[tuple[str, tuple[str | bool, ...]], ...]:
    if not isinstance(raw, Mapping):
        raise SpecsError(f"{where}: 'when' must map signature fields to lists of values")
    parsed = []
    for key, values in sorted(raw.items()):
        if key not in when_fields():
            raise SpecsError(
                f"{where}: 'when' names {key!r}, which is not a text or flag signature field; "
                f"it may name {', '.join(when_keys())}"
            )
        kind = when_fields()[key]
        what = "strings" if kind is str else "booleans (true/false)"
        if (not isinstance(values, list) or not values
                or not all(type(v) is kind for v in values)):
            raise SpecsError(f"{where}: 'when' {key!r} must list one or more {what}, got {values!r}")
        parsed.append((str(key), tuple(values)))
    return tuple(parsed)


def _parse_tile(raw: Mapping[str, Any], where: str) -> TileSpec:
    return TileSpec(
        tile_m=int(raw["tile_m"]),
        tile_n=int(raw.get("tile_n", 0)),
        warps=int(raw["warps"]),
        stages=int(raw.get("stages", 1)),
        ctas_per_sm=int(raw.get("ctas_per_sm", 1)),
        when=_parse_when(raw.get("when", {}), where),
        companion=_parse_flag(raw.get("companion", False), "companion", where),
    )


def _parse_flag(value: Any, key: str, where: str) -> bool:
    if type(value) is not bool:
        raise SpecsError(f"{where}: {key!r} must be true or false, got {value!r}")
    return value


def _parse_arch(name: str, raw: Mapping[str, Any]) -> ArchSpec:
    tiles = {
        family: {
            pipeline: {
                parse_hdim_label(hdim): tuple(
                    _parse_tile(t, f"{name} tiles.{family}.{pipeline}.{hdim}[{i}]")
                    for i, t in enumerate(tile_list)
                )
                for hdim, tile_list in by_hdim.items()
            }
            for pipeline, by_hdim in by_pipeline.items()
        }
        for family, by_pipeline in raw["tiles"].items()
    }
    major, minor = raw["compute_capability"]
    return ArchSpec(
        name=name,
        compute_capability=(int(major), int(minor)),
        gencode=str(raw["gencode"]),
        max_dynamic_smem_per_block=int(raw["max_dynamic_smem_per_block"]),
        registers_per_sm=int(raw["registers_per_sm"]),
        max_registers_per_thread=int(raw["max_registers_per_thread"]),
        max_threads_per_block=int(raw["max_threads_per_block"]),
        dtypes=tuple(raw["dtypes"]),
        pipelines=tuple(raw["pipelines"]),
        tiles=tiles,
    )


@functools.lru_cache(maxsize=8)
def _load_cached(path: Path) -> Mapping[str, ArchSpec]:
    try:
        data = json.loads(path.read_text())
        return {name: _parse_arch(name, raw) for name, raw in data["arches"].items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SpecsError(f"cannot read arch specs from {path}: {exc!r}") from exc


def load_specs(path: Path | None = None) -> Mapping[str, ArchSpec]:
    """Arch name -> ArchSpec. Cached per file, since the file is read-only input."""
    return _load_cached((path or find_specs_file()).resolve())


def get_arch(specs: Mapping[str, ArchSpec], name: str) -> ArchSpec:
    try:
        return specs[name.strip()]
    except KeyError:
        raise SpecsError(
            f"unknown arch {name!r}; supported arches: {', '.join(sorted(specs))}"
        ) from None
