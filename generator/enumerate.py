"""Candidate configs for (kernel set, arch), split into accepted and rejected-with-reasons."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from . import rules
from .receipts import Receipt
from .signature import CONV_FAMILIES, Algorithm, KernelConfig, Signature
from .specs import ArchSpec, get_arch, hdim_label

# Templates in the order the dispatcher prefers them where several fit a problem (dispatcher.cpp,
# pipeline_rank): Hopper's TMA + wgmma, then cp.async + mma.sync; the rest (SIMT, the combine
# and append stages) are the only template of their families, and the direct conv kernel the
# only one of its signatures (those with a channel bucket).
PIPELINE_PREFERENCE = ("sm90_tma_wgmma", "sm90_cpasync_wgmma", "sm80_cpasync_mma")


def pipeline_preference(pipeline: str) -> int:
    """Higher is preferred; pipelines outside PIPELINE_PREFERENCE rank lowest."""
    if pipeline in PIPELINE_PREFERENCE:
        return len(PIPELINE_PREFERENCE) - PIPELINE_PREFERENCE.index(pipeline)
    return 0


# Families whose tiles the dispatcher picks per problem shape (split-KV: the smallest tile_m
# holding the packed GQA rows), so every listed tile is built, not only the default.
SHAPE_CHOSEN_TILE_FAMILIES = ("fwd_splitkv", "fwd_pagedkv", "batch_prefill")


@dataclass(frozen=True)
class Rejection:
    """A candidate that will not be built; `algorithm` is None when no tile exists at all."""

    signature: Signature
    arch: str
    pipeline: str
    algorithm: Algorithm | None
    reasons: tuple[str, ...]

    @property
    def name(self) -> str:
        if self.algorithm is not None:
            return KernelConfig(self.signature, self.algorithm).name
        return f"{self.signature.name}__{self.arch}_{self.pipeline}_notile"


@dataclass
class Selection:
    accepted: list[KernelConfig] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)

    def extend(self, other: Selection) -> None:
        self.accepted.extend(other.accepted)
        self.rejected.extend(other.rejected)


def candidates(
    receipt: Receipt, arch: ArchSpec
) -> Iterable[tuple[Signature, str, Algorithm | None]]:
    """Every (signature, pipeline, algorithm) the receipt asks for on this arch; a signature
    meets only the pipelines that take its dtype and have a template for its family, fp8
    queries only theirs (all of them if none does, so the rejections say why)."""
    for pipeline in arch.pipelines:
        for sig in receipt.signatures:
            if pipeline not in rules.pipelines_for_signature(sig, arch.pipelines):
                continue
            if sig.family in CONV_FAMILIES:
                yield from _conv_candidates(receipt, sig, pipeline, arch)
                continue
            tiles = tuple(
                tile
                for tile in arch.tiles_for(sig.family, pipeline, sig.hdim_q, sig.hdim_v)
                if tile.applies_to(sig)
            )
            if not tiles:
                yield sig, pipeline, None
                continue
            every_tile = receipt.all_tiles or sig.family in SHAPE_CHOSEN_TILE_FAMILIES
            chosen = tiles if every_tile else tiles[:1] + tuple(t for t in tiles[1:] if t.companion)
            for tile in chosen:
                yield (
                    sig,
                    pipeline,
                    Algorithm(
                        arch=arch.name,
                        pipeline=pipeline,
                        tile_m=tile.tile_m,
                        tile_n=tile.tile_n,
                        tile_k=sig.hdim_q,
                        warps=tile.warps,
                        stages=tile.stages,
                        ctas_per_sm=tile.ctas_per_sm,
                    ),
                )


def _conv_candidates(
    receipt: Receipt, sig: Signature, pipeline: str, arch: ArchSpec
) -> Iterable[tuple[Signature, str, Algorithm | None]]:
    """A conv signature with each of the receipt's conv tiles of `pipeline` that apply to it
    (the dispatcher picks by shape; a direct signature has one tile of its channel bucket)."""
    tiles = [t for t in receipt.conv_tiles if t.pipeline == pipeline and t.applies_to(sig)]
    if not tiles:
        yield sig, pipeline, None
    for tile in tiles:
        yield (
            sig,
            pipeline,
            Algorithm(
                arch=arch.name,
                pipeline=pipeline,
                tile_m=tile.tile_m,
                tile_n=tile.tile_n,
                tile_k=tile.tile_k,
                warps=tile.warps,
                stages=tile.stages,
            ),
        )


def _no_tile_reasons(sig: Signature, pipeline: str, arch: ArchSpec) -> tuple[str, ...]:
    if sig.family in CONV_FAMILIES:
        reason = (
            f"the kernel set lists no tiles for {sig.family}/{pipeline} that apply to "
            f"{getattr(sig, 'spatial_dims', 0)}D signatures of "
            f"max_channels={getattr(sig, 'max_channels', 0)} and vector="
            f"{getattr(sig, 'vector', 0)}"
        )
        return (reason,)
    listed = arch.tiles_for(sig.family, pipeline, sig.hdim_q, sig.hdim_v)
    if listed:
        # The table has entries for these head dims, but each is limited (`when`) to
        # signatures this one is not.
        limits = "; ".join(
            ", ".join(f"{key} in {list(values)}" for key, values in tile.when) for tile in listed
        )
        reason = (
            f"no tile of {sig.family}/{pipeline} on {arch.name} at head dims "
            f"{hdim_label(sig.hdim_q, sig.hdim_v)} applies to this signature (entries limited "
            f"to: {limits})"
        )
        return (reason,)
    pairs = arch.hdims_for(sig.family, pipeline)
    hdims = ", ".join(hdim_label(q, v) for q, v in pairs) or "none"
    reason = (
        f"head dims {hdim_label(sig.hdim_q, sig.hdim_v)} have no tile table for {sig.family}/"
        f"{pipeline} on {arch.name}; head dims with tiles: {hdims}"
    )
    return (reason,)


def select(
    receipt: Receipt, arch: ArchSpec, name_filter: re.Pattern[str] | None = None
) -> Selection:
    selection = Selection()
    seen: set[str] = set()
    for sig, pipeline, alg in candidates(receipt, arch):
        if alg is None:
            rejection = Rejection(
                sig, arch.name, pipeline, None, _no_tile_reasons(sig, pipeline, arch)
            )
            if name_filter is None or name_filter.search(rejection.name):
                selection.rejected.append(rejection)
            continue
        config = KernelConfig(sig, alg)
        # Two table entries may coincide (e.g. an alternative equal to the default).
        if config.name in seen or (name_filter is not None and not name_filter.search(config.name)):
            continue
        seen.add(config.name)
        reasons = rules.check(config, arch)
        if reasons:
            selection.rejected.append(Rejection(sig, arch.name, pipeline, alg, tuple(reasons)))
        else:
            selection.accepted.append(config)
    if receipt.preferred_only:
        selection.accepted = preferred_only(selection.accepted)
    return selection


# Templates that run only some problems of their signatures (the conv kernels fed by the copy
# engine take channel counts their copies divide): a set that keeps one template per signature
# keeps these beside it, so that every problem still has a kernel.
PARTIAL_TEMPLATES = rules.CONV_TMA_TEMPLATES


def _partial(config: KernelConfig) -> bool:
    return (config.signature.family, config.algorithm.pipeline) in PARTIAL_TEMPLATES


def preferred_only(accepted: list[KernelConfig]) -> list[KernelConfig]:
    """Each signature's configs from its most preferred accepted template only, and those of
    the partial templates."""
    best: dict[Signature, int] = {}
    for config in accepted:
        if _partial(config):
            continue
        rank = pipeline_preference(config.algorithm.pipeline)
        best[config.signature] = max(best.get(config.signature, rank), rank)
    return [
        c for c in accepted
        if _partial(c) or pipeline_preference(c.algorithm.pipeline) == best.get(c.signature)
    ]  # fmt: skip


def select_for_arches(
    receipt: Receipt,
    arches: Iterable[str],
    specs: Mapping[str, ArchSpec],
    name_filter: re.Pattern[str] | None = None,
) -> Selection:
    """Arches are visited in the given order, duplicates dropped, so output order is stable."""
    selection = Selection()
    for arch_name in dict.fromkeys(arches):
        selection.extend(select(receipt, get_arch(specs, arch_name), name_filter))
    return selection
