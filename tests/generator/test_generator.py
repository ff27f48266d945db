"""Generator: arch specs, kernel sets, naming, validation rules, CLI and emitted sources."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from support.paths import REPO_ROOT

from generator import emit, rules
from generator.enumerate import select, select_for_arches
from generator.receipts import compile_filter, get_receipt
from generator.signature import (
    CONV_FAMILIES,
    PAGED_FAMILIES,
    Algorithm,
    BwdSignature,
    ConvSignature,
    FwdSignature,
    KernelConfig,
)
from generator.specs import SpecsError, load_specs

ARCHES = ("sm_80", "sm_86", "sm_89", "sm_90a")
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def _config(arch: str = "sm_80", **changes: object) -> KernelConfig:
    """A valid default config, with signature/algorithm fields overridden by name."""
    sig = FwdSignature(dtype="fp16", mode="batch", hdim_q=128, hdim_v=128, mask="causal", lse=True)
    alg = Algorithm(arch, "sm80_cpasync_mma", tile_m=128, tile_n=64, tile_k=128, warps=4, stages=1)
    sig_fields = {k: v for k, v in changes.items() if hasattr(sig, k)}
    alg_fields = {k: v for k, v in changes.items() if k not in sig_fields}
    return KernelConfig(replace(sig, **sig_fields), replace(alg, **alg_fields))


def _reasons(arch: str = "sm_80", **changes: object) -> str:
    return "\n".join(rules.check(_config(arch, **changes), load_specs()[arch]))


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "generator", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


# ---- specs ----


def test_specs_have_the_four_arches() -> None:
    specs = load_specs()
    assert set(ARCHES) <= set(specs)
    assert specs["sm_90a"].arch_number == 90
    assert specs["sm_86"].arch_number == 86
    assert specs["sm_80"].max_dynamic_smem_per_block == 166912
    assert specs["sm_90a"].gencode == "-gencode=arch=compute_90a,code=sm_90a"
    for arch in ARCHES:
        assert specs[arch].tiles_for("fwd", "sm80_cpasync_mma", 128)
        assert {"fp16", "bf16"} <= set(specs[arch].dtypes)


def test_default_tiles_follow_arch_shared_memory() -> None:
    specs = load_specs()
    # 192x128 needs 176 KiB-class tiles at 128 rows: only the big-smem arches get them.
    first = {a: specs[a].tiles_for("fwd", "sm80_cpasync_mma", 192, 128)[0] for a in ARCHES}
    assert (first["sm_80"].tile_m, first["sm_80"].tile_n) == (128, 64)
    assert (first["sm_86"].tile_m, first["sm_86"].tile_n) == (64, 64)


def test_every_listed_tile_is_valid() -> None:
    """The table must only list tiles the rules accept, or 'full' builds would lose kernels."""
    specs = load_specs()
    for arch in ARCHES:
        selection = select(get_receipt("full"), specs[arch])
        # The sm80 template takes every signature of the full set.
        sm80 = [r for r in selection.rejected if r.pipeline == "sm80_cpasync_mma"]
        # Backward head dims whose tiles do not fit an arch's shared memory have no table
        # there (d256 on the 99 KiB arches): the only sm80 rejections allowed.
        missing_table = [
            r for r in sm80
            if r.algorithm is None and r.signature.family == "bwd_dq_dk_dv"
            and (r.signature.hdim_q, r.signature.hdim_v)
            not in specs[arch].hdims_for("bwd_dq_dk_dv", "sm80_cpasync_mma")
        ]  # fmt: skip
        # fp8 K/V needs sm_89's e4m3 conversions: rejected on older archs, for that reason; and
        # its byte stages leave the 16x64 d128 tile over sm_89's 99 KiB per block.
        no_fp8 = [
            r for r in sm80
            if r.signature.kv_quant != "none"
            and any("fp8 K/V needs sm_89" in reason or "(fp8 K/V)" in reason
                    for reason in r.reasons)
        ]  # fmt: skip
        # fp8 queries run on the Hopper template only.
        no_fp8_queries = [
            r for r in sm80
            if r.signature.q_quant != "none"
            and any("fp8 queries run on the sm_90a wgmma template only" in reason
                    for reason in r.reasons)
        ]  # fmt: skip
        # The conv tiles with a 64-wide reduction step (the forward's and the weight
        # gradient's) keep 96 KiB of operand stages and a row or position table: over the
        # 99 KiB per block of sm_86 and sm_89.
        conv_smem = [
            r for r in sm80
            if r.signature.family in CONV_FAMILIES and r.algorithm is not None
            and r.algorithm.tile_k == 64 and arch in ("sm_86", "sm_89")
            and all("exceeds" in reason and "shared memory" in reason for reason in r.reasons)
        ]  # fmt: skip
        allowed = missing_table + no_fp8 + no_fp8_queries + conv_smem
        assert [r for r in sm80 if r not in allowed] == [], [r.reasons for r in sm80]
        # Templates with fewer features reject some signatures, but each listed tile must
        # build for at least one.
        built = {
            (
                c.algorithm.pipeline,
                c.signature.hdim_q,
                c.signature.hdim_v,
                c.algorithm.tile_m,
                c.algorithm.tile_n,
                c.algorithm.warps,
                c.algorithm.stages,
            )
            for c in selection.accepted
        }
        for family in ("fwd", "bwd_dq_dk_dv", "bwd_dot_do_o", "bwd_convert_dq"):
            for pipeline, by_hdim in specs[arch].tiles[family].items():
                for (hdim_q, hdim_v), tiles in by_hdim.items():
                    for t in tiles:
                        key = (pipeline, hdim_q, hdim_v, t.tile_m, t.tile_n, t.warps, t.stages)
                        assert key in built, f"{arch}: no {family} kernel builds with {key}"


# ---- receipts and names ----


def _feature_combos() -> list[dict[str, object]]:
    from generator.pairwise import all_pairs
    from generator.receipts import FEATURE_FACTORS

    return [
        c
        for c in all_pairs(FEATURE_FACTORS)
        if c["mode"] != "batch" or c["bias"] != "none" or c["dropout"] or c["softcap"] or c["sink"]
    ]


def _feature_tiles(arch: object) -> int:
    tiles = arch.tiles["fwd"]["sm80_cpasync_mma"]  # type: ignore[attr-defined]
    per_dtype = sum(len(tiles[(h, h)]) for h in (64, 128))
    return len(_feature_combos()) * 2 * per_dtype


def test_feature_layer_covers_every_pair() -> None:
    from generator.pairwise import covers_all_pairs
    from generator.receipts import FEATURE_FACTORS

    combos = _feature_combos()
    # The all-off combination lives in the mask layer; with it the pairs are all covered.
    baseline = {"mode": "batch", "bias": "none", "dropout": False, "softcap": False, "sink": False}
    with_baseline = combos + [{**baseline, "mask": m} for m in FEATURE_FACTORS["mask"]]
    assert covers_all_pairs(FEATURE_FACTORS, with_baseline)
    assert len(combos) <= 14


def test_all_pairs_is_deterministic_and_covering() -> None:
    from generator.pairwise import all_pairs, covers_all_pairs

    factors = {"a": (0, 1, 2), "b": ("x", "y"), "c": (False, True), "d": (1, 2, 3)}
    combos = all_pairs(factors)
    assert covers_all_pairs(factors, combos)
    assert combos == all_pairs(factors)
    # Far fewer than the 36-way cross product; at least |a| x |d| = 9 are needed.
    assert 9 <= len(combos) <= 12
    assert not covers_all_pairs(factors, combos[:-1])


def test_feature_tokens_appear_only_when_on() -> None:
    config = _config(
        "sm_90a", dtype="bf16", mode="group", hdim_q=192, hdim_v=128, tile_k=192, mask="window",
        bias="alibi", dropout=True, softcap=True, sink=True,
    )  # fmt: skip
    assert config.name == (
        "fwd_bf16_group_d192x128_window_alibi_lse_drop_softcap_sink"
        "__sm_90a_sm80_cpasync_mma_m128n64k192_w4s1"
    )
    assert _config(bias="elementwise").name.startswith("fwd_fp16_batch_d128x128_causal_bias_lse__")


def test_ci_names_are_stable() -> None:
    names = [c.name for c in select(get_receipt("ci"), load_specs()["sm_80"]).accepted]
    tail = "__sm_80_sm80_cpasync_mma_"
    assert names == [
        f"fwd_fp16_batch_d64x64_none_lse{tail}m128n64k64_w4s1",
        f"fwd_fp16_batch_d128x128_causal_lse{tail}m128n32k128_w4s1",
        f"fwd_bf16_group_d64x64_causal_lse{tail}m128n64k64_w4s1",
        f"fwd_bf16_batch_d128x128_none_lse{tail}m128n32k128_w4s1",
        f"fwd_bf16_group_d128x128_window_bias_lse{tail}m128n32k128_w4s1",
        f"fwd_fp16_batch_d64x64_causal_alibi_lse_drop{tail}m128n64k64_w4s1",
        f"fwd_bf16_batch_d192x128_none_lse_softcap_sink{tail}m128n64k192_w4s1",
        f"fwd_fp16_group_d64x64_causal_lse_vcol{tail}m128n64k64_w4s1",
        f"fwd_splitkv_bf16_group_d128x128_window_lse{tail}m16n64k128_w1s2",
        f"fwd_splitkv_bf16_group_d128x128_window_lse{tail}m64n64k128_w4s2",
        f"batch_prefill_bf16_group_d128x128_window_lse{tail}m16n64k128_w1s2",
        f"batch_prefill_bf16_group_d128x128_window_lse{tail}m64n64k128_w4s2",
        f"batch_prefill_bf16_group_d128x128_window_lse_vecpages{tail}m16n64k128_w1s2",
        f"batch_prefill_bf16_group_d128x128_window_lse_vecpages{tail}m64n64k128_w4s2",
        f"bwd_dot_do_o_bf16_batch_d128{tail}m64k128_w4s1",
        f"bwd_dq_dk_dv_bf16_batch_d128x128_causal{tail}m64n128k128_w8s2",
        f"bwd_convert_dq_bf16_batch_d128{tail}m64k128_w4s1",
        f"bwd_dot_do_o_fp16_group_d64{tail}m64k64_w4s1",
        f"bwd_dq_dk_dv_fp16_group_d64x64_window{tail}m128n128k64_w8s2",
        f"bwd_convert_dq_fp16_group_d64{tail}m64k64_w4s1",
        "fwd_fp32_group_d64x64_window_alibi_lse_drop_sink__sm_80_simt_fma_m64n64k64_w4s1",
        "fwd_splitkv_combine_bf16_group_d128x128_none_lse__sm_80_splitkv_combine_m1n4k128_w4s1",
        "fwd_appendkv_bf16_d128x128_rope_half_rotated_paged__sm_80_appendkv_m16k128_w4s1",
        "fwd_appendkv_fp16_d64x64_rope_interleaved__sm_80_appendkv_m32k64_w4s1",
    ]


@pytest.mark.parametrize("arch", ARCHES)
def test_receipt_sizes(arch: str) -> None:
    specs = load_specs()
    sizes = {
        name: len(select(get_receipt(name), specs[arch]).accepted)
        for name in ("ci", "default", "full")
    }
    # sm_90a adds the Hopper template for the plain signatures: 4 of ci; of default, fp16/bf16 x
    # 3 masks x (batch mode at d64/d96/d128/d192x128/d256 + group mode at d64/d128); full adds
    # the signatures without LSE, and builds d64's 128-row tile beside the 192-row default of
    # its unmasked batch-mode signatures (fp16/bf16 x LSE on/off).
    # The Hopper backward main stage: both plans of ci (bf16 d128 causal batch, fp16 d64 window
    # group); fp16/bf16 x d64/d96/d128/d256/d192x128 x 3 masks x batch/group of default and full
    # (one tile each).
    # The fp8 forward (Q, K and V in e4m3): fp16/bf16 x d64/d128/d256 x none/causal x batch/group
    # with LSE in default, and without in full, which also builds the plain 2-stage tile beside
    # the fp8 3-stage one at d128 and d256, and 128 rows beside d64's unmasked batch-mode 192.
    fp8_forward = {"ci": 0, "default": 24, "full": 16 * (1 + 2 + 2) + 2 * 2}
    # The Hopper forward's features (bias, ALiBi, dropout, soft-cap, sinks): the ci set's three
    # feature kernels at fp16/bf16 head dims; the pairwise feature layer (x 2 dtypes x d64/d128)
    # and the 8 training forwards it lacks (x 2 dtypes x d64/d128) in default and full, plus the
    # 192-row companion of the unmasked d64 elementwise bias (x 2 dtypes). Head dim 32:
    # fp16/bf16 x 3 masks, with LSE (default) and also without (full).
    hopper_features = {
        "ci": 3,
        "default": len(_feature_combos()) * 2 * 2 + 8 * 2 * 2 + 2 + 6,
        "full": len(_feature_combos()) * 2 * 2 + 8 * 2 * 2 + 2 + 12,
    }
    # The Hopper backward's features (ALiBi, soft-cap, dropout, a row-broadcast elementwise
    # bias) x 2 dtypes: at d64/d128 the three feature plans without an elementwise bias, the
    # four training plans it adds (soft-cap causal/window, dropout causal/none), and the three
    # plans with a bias but no dbias (soft-capped without a mask, and the training plans with
    # no mask and causal); soft-capped d256 (causal, window); dropout at d192x128 in group mode.
    hopper_bwd_features = 2 * (2 * (3 + 4 + 3) + 2 + 1)
    hopper = {
        name: count + fp8_forward[name] + hopper_features[name]
        for name, count in {"ci": 4 + 2, "default": 42 + 60 + hopper_bwd_features,
                            "full": 84 + 4 + 60 + hopper_bwd_features}.items()
    }
    if arch != "sm_90a":
        hopper = dict.fromkeys(sizes, 0)
    # Split-KV: every tile of one split signature (bf16 d128) and its combine stage in ci;
    # 2 dtypes x d64/d128 x 3 masks x 2 modes x every tile, and 2 x 2 x 2 combines, in default
    # and full. sm_90a lists a third d128 tile (16x32 keys, one wave of a b64 decode).
    split_tiles = specs[arch].tiles["fwd_splitkv"]["sm80_cpasync_mma"]
    d128_tiles = len([t for t in split_tiles[(128, 128)] if not t.when])
    d64_tiles = len([t for t in split_tiles[(64, 64)] if not t.when])
    assert (d64_tiles, d128_tiles) == (2, 3 if arch == "sm_90a" else 2)
    # Tiles listed for fp8 K/V only (sm_89: 16x32 at d128; sm_90a: 16x16 with two and with four
    # byte stages at d64 and d128).
    fp8_only = sum(len([t for t in split_tiles[(h, h)] if t.when]) for h in (64, 128))
    assert fp8_only == {"sm_89": 1, "sm_90a": 4}.get(arch, 0)
    per_signature = 2 * 3 * (d64_tiles + d128_tiles)  # dtypes x masks x tiles
    split = {"ci": d128_tiles + 1, "default": 2 * per_signature + 8, "full": 2 * per_signature + 8}
    # Paged K/V: the batch_prefill twins of the ci split signature (linear and vectorized pages,
    # every tile); both paged families x 2 page layouts x the split signatures' tiles in default
    # and full.
    paged = {"ci": 2 * d128_tiles, "default": 4 * per_signature, "full": 4 * per_signature}
    # fp8 K/V (sm_89 and later): fwd_splitkv and fwd_pagedkv x 2 dtypes x 2 masks, and causal
    # batch_prefill x 2 dtypes, at d64 and d128, every tile that fits and the fp8-only ones, in
    # default and full. On sm_89 (99 KiB per block) only the fp8-only 16x32 tile fits at d128.
    fp8_tiles = {"sm_89": d64_tiles + fp8_only,
                 "sm_90a": d64_tiles + d128_tiles + fp8_only}.get(arch, 0)  # fmt: skip
    fp8 = 10 * fp8_tiles
    fp8_kv = {"ci": 0, "default": fp8, "full": fp8}
    split = {name: split[name] + paged[name] + fp8_kv[name] for name in split}
    # Grouped convolution: fp16/bf16 x 2D/3D x 4 channel vectors x the 4 default mma.sync tiles;
    # full adds two, of which the 64-wide reduction one (with its row table) does not fit the
    # 99 KiB per block of sm_86 and sm_89. sm_90a also builds the 5 default wgmma tiles, and 7
    # in full. The direct kernel: fp16/bf16 x 2D/3D x the 3 built channel buckets, one tile
    # each, in default and full on every arch. The weight gradient: the same 16 implicit-GEMM
    # signatures x its 4 default mma.sync tiles on every arch; full adds one, which does not fit
    # sm_86 and sm_89 either. sm_90a also builds its 4 default wgmma tiles, and 6 in full less
    # the 64x256 tile at 1-channel vectors (4 signatures: too few threads for its gathers). Its
    # direct kernel: fp16/bf16 x 2D/3D x its 4 channel buckets (1, 2, 4, 8), one tile each, in
    # default and full on every arch. The TMA forward on sm_90a: the 4 8-channel signatures x
    # its 5 default tiles, 6 in full; the TMA weight gradient the same 4 x its 4 default tiles,
    # 5 in full.
    fits_64_wide_k = specs[arch].max_dynamic_smem_per_block >= 102400
    conv_full_tiles = 6 if fits_64_wide_k else 5
    conv_wgmma = (5, 7) if arch == "sm_90a" else (0, 0)
    conv_tma = (4 * 5 + 4 * 4, 4 * 6 + 4 * 5) if arch == "sm_90a" else (0, 0)
    bwd_weight_full_tiles = 5 if fits_64_wide_k else 4
    weight_wgmma = (16 * 4, 16 * 6 - 4) if arch == "sm_90a" else (0, 0)
    conv = {
        "ci": 0,
        "default": 16 * (4 + conv_wgmma[0]) + conv_tma[0] + 12 + 16 * 4 + weight_wgmma[0] + 16,
        "full": 16 * (conv_full_tiles + conv_wgmma[1]) + conv_tma[1] + 12
        + 16 * bwd_weight_full_tiles + weight_wgmma[1] + 16,
    }
    sizes = {name: size - conv[name] for name, size in sizes.items()}
    # Two backward plans of three stages each in ci.
    assert sizes["ci"] == 9 + hopper["ci"] + split["ci"] + 6 + 2
    # KV-cache appends: (fp16/bf16 x 5 head dims + fp32 x 2) x 3 RoPE modes x 2 cache kinds, and
    # full builds the decode tile of d64/d128 as well.
    # Appends into fp8 caches (sm_89 and later): fp16/bf16 x d64/d128 x 3 RoPE modes x 2 cache
    # kinds, and in full with the decode tile as well.
    fp8_append = 24 if specs[arch].arch_number >= 89 else 0
    append = {"ci": 2, "default": 72 + fp8_append, "full": 72 + 2 * fp8_append + 3 * 2 * 2 * 3}
    sizes = {name: size - append[name] for name, size in sizes.items()}
    bwd_default, bwd_full = _bwd_sizes(specs[arch])
    sizes = {name: size - (bwd_full if name == "full" else bwd_default if name == "default" else 6)
             for name, size in sizes.items()}  # fmt: skip
    # Training pairs: 8 new forwards x 2 dtypes x d64/d128 (the ninth, an unmasked elementwise
    # bias, is a feature-layer kernel already), and backward main stages for the six whose
    # plan the backward set lacks (soft-cap with causal/window, dropout with causal/none, an
    # unmasked and a causal bias without dbias); their row-wise stages are shared.
    fwd_tiles = specs[arch].tiles["fwd"]["sm80_cpasync_mma"]
    bwd_tiles = specs[arch].tiles["bwd_dq_dk_dv"]["sm80_cpasync_mma"]
    hdims = ((64, 64), (128, 128))
    training = {
        "ci": 0,
        "default": 8 * 2 * 2 + 6 * 2 * 2,
        "full": 8 * 2 * sum(len(fwd_tiles[h]) for h in hdims)
        + 6 * 2 * sum(len(bwd_tiles[h]) for h in hdims),
    }
    sizes = {name: size - training[name] for name, size in sizes.items()}
    # 2 dtypes x 6 head-dim pairs x 3 masks, plain group mode (2 dtypes x d64/d128 x 3
    # masks), plus the pairwise feature layer.
    features = len(_feature_combos()) * 2 * 2
    # Column-major V: batch and group mode x 2 dtypes x d64/d128 x masks none/causal. fp32:
    # d64/d128 x 3 masks, six feature/group combinations, d192x128 and d256.
    assert sizes["default"] == (
        36 + 12 + 16 + features + 6 + 6 + 2 + hopper["default"] + split["default"]
    )
    tiles = specs[arch].tiles["fwd"]["sm80_cpasync_mma"]
    alternatives = sum(len(t) for t in tiles.values())
    # Mask-only kernels come with and without LSE, each with every listed tile.
    group_tiles = _feature_tiles(specs[arch]) // len(_feature_combos()) * 3
    vcol_tiles = group_tiles * 2 // 3 * 2
    simt = specs[arch].tiles["fwd"]["simt_fma"]
    # fp32: every head dim x 3 masks x LSE on/off, plus the six combinations at d64/d128.
    fp32 = 3 * 2 * sum(len(t) for t in simt.values())
    fp32 += 3 * len(simt[(64, 64)]) + 3 * len(simt[(128, 128)])
    assert sizes["full"] == (
        2 * 3 * 2 * alternatives
        + group_tiles
        + vcol_tiles
        + _feature_tiles(specs[arch])
        + fp32
        + hopper["full"]
        + split["full"]
    )


def _bwd_sizes(arch: object) -> tuple[int, int]:
    """Backward kernels of the default and full sets on an arch, from its tile tables: every
    mask x mode at every head dim (for head dims with a table), plus one row-wise kernel per
    (dtype, mode, head dim) they need."""
    tables = arch.tiles["bwd_dq_dk_dv"]["sm80_cpasync_mma"]  # type: ignore[attr-defined]
    # Masks x modes at d64/d128, plus four feature combinations and dbias with no mask and
    # causal there.
    main = [((64, 64), 6 + 4 + 2), ((128, 128), 6 + 4 + 2)]
    main += [(h, 6) for h in ((32, 32), (96, 96), (192, 128), (256, 256))]
    # Soft-capped d256 (causal, window) and dropout at d192x128 (group mode, causal).
    main += [((256, 256), 2), ((192, 128), 1)]
    default = sum(2 * n for h, n in main if h in tables)
    full = sum(2 * n * len(tables[h]) for h, n in main if h in tables)
    # Two one-dtype dbias plans with a soft-cap: bf16 d128 (dropout), fp16 d64 (group mode).
    extra = [h for h in ((128, 128), (64, 64)) if h in tables]
    default += len(extra)
    full += sum(len(tables[h]) for h in extra)
    # dot_do_o over hdim_v (32/64/96/128/256) and convert_dq over hdim_q (32/64/96/128/192/256),
    # each x 2 modes x 2 dtypes.
    rowwise = 2 * 2 * 5 + 2 * 2 * 6
    return default + rowwise, full + rowwise


def test_bwd_plans_share_their_rowwise_stages() -> None:
    receipt = get_receipt("default")
    names = [s.name for s in receipt.signatures]
    assert len(names) == len(set(names))
    assert "bwd_dot_do_o_bf16_batch_d128" in names and "bwd_convert_dq_fp16_batch_d192" in names


def test_names_unique_stable_and_valid() -> None:
    selection = select_for_arches(get_receipt("full"), ARCHES, load_specs())
    names = [c.name for c in selection.accepted]
    assert len(names) == len(set(names))
    for config in selection.accepted:
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", config.symbol)
    assert (
        _config("sm_90a", dtype="bf16", lse=True).name
        == "fwd_bf16_batch_d128x128_causal_lse__sm_90a_sm80_cpasync_mma_m128n64k128_w4s1"
    )
    assert _config(lse=False, mask="none").name.startswith("fwd_fp16_batch_d128x128_none_nolse__")


def test_name_rejects_non_identifier_characters() -> None:
    with pytest.raises(ValueError, match="A-Za-z0-9_"):
        _ = _config(dtype="fp8-e4m3").name


def test_filter_selects_by_regex() -> None:
    selection = select(
        get_receipt("default"), load_specs()["sm_80"], compile_filter("bf16.*causal")
    )
    # 6 batch head dims + 2 plain group head dims, plus the causal feature kernels.
    causal_features = sum(c["mask"] == "causal" for c in _feature_combos())
    # ... and the causal column-major-V kernels at d64/d128 in batch and group mode, the causal
    # split-KV kernels (d64/d128 x batch/group x 2 tiles), the causal paged kernels (2 families
    # x d64/d128 x 2 page layouts x 2 tiles), and the causal backward kernels: 6 head dims in
    # batch and in group mode, and the causal feature combinations (ALiBi in batch
    # mode, all features in group mode), and the causal bf16 dbias kernels (d64/d128); the
    # causal training pairs add 5 forwards (soft-cap, sink, ALiBi, dropout, an elementwise bias)
    # and 3 backward main stages (soft-cap, dropout, the bias) at d64/d128; and the soft-capped
    # d256 and d192x128 dropout backward plans.
    training = 5 * 2 + 3 * 2
    assert len(selection.accepted) == (
        6 + 2 + 4 + causal_features * 2 + 8 + 16 + 6 + 6 + 4 + 2 + training + 2
    )
    assert all("bf16" in c.name and "causal" in c.name for c in selection.accepted)
    with pytest.raises(ValueError, match="invalid kernel filter"):
        compile_filter("(")


def test_unknown_receipt_names_known_sets() -> None:
    with pytest.raises(ValueError, match="known sets: core, ci, default, full"):
        get_receipt("everything")


# ---- rules ----


def test_valid_config_has_no_reasons() -> None:
    assert _reasons() == ""


@pytest.mark.parametrize("mode", ["batch", "group"])
def test_column_major_v_is_valid_in_either_mode(mode: str) -> None:
    # Misaligned sequence starts and odd key counts take the kernel's element-wise path.
    assert _reasons(mode=mode, v_col_major=True) == ""
    text = emit.render_instance(_config(mode=mode, v_col_major=True))
    assert f"/*IsGroupMode=*/{str(mode == 'group').lower()}, /*VColMajor=*/true>;" in text


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"tile_m": 256, "tile_n": 256, "arch": "sm_86"}, r"shared memory 196608 bytes.*101376"),
        ({"hdim_q": 72, "hdim_v": 72, "tile_k": 72}, r"head dims 72 have no tile table.*64, 96"),
        ({"hdim_q": 72, "hdim_v": 72, "tile_k": 72}, r"hdim_q=72 is not a multiple of 32"),
        ({"hdim_v": 64}, r"head dims 128x64 have no tile table.*192x128"),
        ({"warps": 3}, r"tile_m=128 is not a positive multiple of 16\*warps=48"),
        ({"warps": 64}, r"warps=64 gives 2048 threads.*1 to 32 warps"),
        (
            {"dtype": "int4"},
            r"dtype 'int4' is not supported on sm_80; supported: fp16, bf16, fp32",
        ),
        (
            {"dtype": "fp32"},
            (
                r"dtype 'fp32' does not run on the sm80_cpasync_mma template, which takes "
                r"fp16, bf16; sm90_tma_wgmma takes fp16, bf16; sm90_cpasync_wgmma takes "
                r"fp16, bf16; simt_fma takes fp32"
            ),
        ),
        ({"mode": "paged"}, r"mode 'paged' is unknown; supported: batch, group"),
        ({"mask": "sliding"}, r"mask 'sliding' is unknown; supported: none, causal, window"),
        ({"bias": "rel"}, r"bias 'rel' is unknown; supported: none, elementwise, alibi"),
        ({"tile_n": 40}, r"tile_n=40 is not a positive multiple of 16"),
        ({"stages": 3}, r"stages=3 is not supported.*in 1 or 2 shared-memory stages"),
        (
            {"stages": 2, "tile_m": 256, "tile_n": 128, "arch": "sm_86"},
            r"shared memory 196608 bytes \(Q 256x128 \+ 2 x \(K 128x128",
        ),
        ({"ctas_per_sm": 3}, r"ctas_per_sm=3 caps registers at 168 per thread, under the 192"),
        ({"ctas_per_sm": 0}, r"ctas_per_sm=0 must be at least 1"),
        (
            {"ctas_per_sm": 4, "tile_m": 64, "tile_n": 32, "arch": "sm_86"},
            r"ctas_per_sm=4 needs 131072 bytes of shared memory per SM",
        ),
        ({"tile_k": 64}, r"tile_k=64 must equal hdim_q=128"),
        (
            {"hdim_q": 100, "hdim_v": 100, "tile_k": 100},
            r"hdim_q=100 is not a multiple of 32 in 32..256",
        ),
        ({"pipeline": "sm90_tma_wgmma"}, r"pipeline 'sm90_tma_wgmma' is not available on sm_80"),
        ({"pipeline": "sm100_tcgen05"}, r"has no kernel template"),
        ({"tile_n": 256}, r"estimated 384 accumulator registers per thread.*exceeds 192"),
        ({"family": "bwd"}, r"family 'bwd' is not implemented; supported: fwd"),
    ],
)
def test_rule_fires_with_reason(changes: dict[str, object], expected: str) -> None:
    arch = str(changes.pop("arch", "sm_80"))
    assert re.search(expected, _reasons(arch, **changes)), _reasons(arch, **changes)


def test_rejections_are_reported_not_dropped() -> None:
    specs = load_specs()
    receipt = replace(
        get_receipt("ci"), signatures=(FwdSignature("fp16", "batch", 160, 160, "none", True),)
    )
    selection = select(receipt, specs["sm_80"])
    assert selection.accepted == []
    (rejection,) = selection.rejected
    assert rejection.algorithm is None
    assert "head dims 160 have no tile table" in rejection.reasons[0]


def _simt_config(arch: str = "sm_90a", **changes: object) -> KernelConfig:
    base: dict[str, object] = {
        "dtype": "fp32", "pipeline": "simt_fma", "tile_m": 64, "tile_n": 64, "warps": 4,
    }  # fmt: skip
    return _config(arch, **{**base, **changes})


def _simt_reasons(arch: str = "sm_90a", **changes: object) -> str:
    return "\n".join(rules.check(_simt_config(arch, **changes), load_specs()[arch]))


@pytest.mark.parametrize("arch", ARCHES)
def test_fp32_runs_on_the_simt_pipeline_everywhere(arch: str) -> None:
    spec = load_specs()[arch]
    assert "fp32" in spec.dtypes and "simt_fma" in spec.pipelines
    hdims = {(32, 32), (64, 64), (96, 96), (128, 128), (192, 128), (256, 256)}
    assert set(spec.hdims_for("fwd", "simt_fma")) == hdims
    for hdim_q, hdim_v in hdims:
        tile = spec.tiles_for("fwd", "simt_fma", hdim_q, hdim_v)[0]
        config = _simt_config(
            arch, hdim_q=hdim_q, hdim_v=hdim_v, tile_k=hdim_q, tile_m=tile.tile_m,
            tile_n=tile.tile_n, mode="group", mask="window", bias="alibi", dropout=True,
            softcap=True, sink=True,
        )  # fmt: skip
        assert rules.check(config, spec) == []


def test_valid_simt_config_has_no_reasons() -> None:
    assert _simt_reasons() == ""
    assert _simt_reasons(hdim_q=256, hdim_v=256, tile_k=256, tile_n=32) == ""


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"dtype": "bf16"},
            (
                r"dtype 'bf16' does not run on the simt_fma template, which takes fp32; "
                r"sm80_cpasync_mma takes fp16, bf16"
            ),
        ),
        ({"warps": 8}, r"warps=8 is not supported.*128 threads to 16 row groups x 8 lanes"),
        ({"tile_m": 40}, r"tile_m=40 is not a positive multiple of 16"),
        ({"tile_n": 24}, r"tile_n=24 is not a positive multiple of 16.*16-key dropout block"),
        ({"stages": 2}, r"stages=2 is not supported.*stages=1"),
        ({"ctas_per_sm": 2}, r"ctas_per_sm=2 is not supported; the simt_fma template has no"),
        ({"tile_k": 64}, r"tile_k=64 must equal hdim_q=128"),
        ({"v_col_major": True}, r"column-major V is not implemented for simt_fma \(fp32\)"),
        (
            {"hdim_q": 256, "hdim_v": 256, "tile_k": 256, "tile_n": 32, "arch": "sm_86"},
            r"shared memory 142848 bytes .* exceeds sm_86's limit of 101376",
        ),
        (
            {"hdim_q": 256, "hdim_v": 256, "tile_k": 256},
            r"estimated 208 registers per thread .* exceeds 192; use a smaller tile_n",
        ),
    ],
)
def test_simt_rule_fires_with_reason(changes: dict[str, object], expected: str) -> None:
    arch = str(changes.pop("arch", "sm_90a"))
    reasons = _simt_reasons(arch, **changes)
    assert re.search(expected, reasons), reasons


def test_simt_shared_memory_matches_the_traits_formula() -> None:
    # Q 64x(128+4) + K 64x(128+4) + V 64x128 + P 64x(64+8) floats (FwdSimtTraits::kSmemBytes).
    assert rules.simt_smem_bytes(128, 128, 64, 64) == 4 * (8448 + 8448 + 8192 + 4608)


def test_signatures_meet_only_pipelines_taking_their_dtype() -> None:
    assert rules.pipelines_for_dtype("fp32", ("sm80_cpasync_mma", "simt_fma")) == ("simt_fma",)
    assert rules.pipelines_for_dtype("bf16", ("sm80_cpasync_mma", "simt_fma")) == (
        "sm80_cpasync_mma",
    )
    # No pipeline takes it: keep them all so the rejection says why.
    assert rules.pipelines_for_dtype("fp8", ("sm80_cpasync_mma", "simt_fma")) == (
        "sm80_cpasync_mma",
        "simt_fma",
    )
    selection = select(get_receipt("default"), load_specs()["sm_90a"])
    # Only the Hopper template rejects anything (features it lacks), never for the dtype.
    assert {r.pipeline for r in selection.rejected} == {"sm90_tma_wgmma"}
    assert not any("dtype" in reason for r in selection.rejected for reason in r.reasons)
    pipelines = {c.signature.dtype: set() for c in selection.accepted}
    for c in selection.accepted:
        pipelines[c.signature.dtype].add(c.algorithm.pipeline)
    # The grouped convolution's wgmma and direct templates take fp16/bf16 too.
    half = {"sm80_cpasync_mma", "sm90_tma_wgmma", "sm90_cpasync_wgmma", "splitkv_combine",
            "appendkv", "conv_direct"}  # fmt: skip
    assert pipelines == {"fp16": half, "bf16": half, "fp32": {"simt_fma", "appendkv"}}


def test_signature_no_tile_applies_to_is_rejected_with_the_limits(tmp_path: Path) -> None:
    specs = json.loads((REPO_ROOT / "arch_specs.json").read_text())
    for tile in specs["arches"]["sm_86"]["tiles"]["fwd"]["sm80_cpasync_mma"]["128"]:
        tile["when"] = {"mode": ["group"]}
    custom = tmp_path / "arch_specs.json"
    custom.write_text(json.dumps(specs))
    result = _run_cli(
        "--specs",
        str(custom),
        "--kernels",
        "default",
        "--arch",
        "sm_86",
        "--explain",
        "--filter",
        "^fwd_bf16_batch_d128x128_causal_lse__",
    )
    assert result.returncode == 0, result.stderr
    assert (
        "no tile of fwd/sm80_cpasync_mma on sm_86 at head dims 128 applies to this signature "
        "(entries limited to: mode in ['group']" in result.stdout
    ), result.stdout


def test_fp32_without_a_simt_pipeline_is_rejected_with_reason(tmp_path: Path) -> None:
    specs = json.loads((REPO_ROOT / "arch_specs.json").read_text())
    specs["arches"]["sm_86"]["pipelines"] = ["sm80_cpasync_mma"]
    custom = tmp_path / "arch_specs.json"
    custom.write_text(json.dumps(specs))
    result = _run_cli(
        "--specs", str(custom), "--kernels", "ci", "--arch", "sm_86", "--explain", "--list"
    )
    assert result.returncode == 0, result.stderr
    # Only the fp32 kernel, the split-KV combine stage and the two appends (their pipelines
    # are gone too) are rejected, once each, and the reasons name the pipelines to use.
    assert result.stdout.count("rejected ") == 4
    assert "no tile table for fwd_splitkv_combine/sm80_cpasync_mma on sm_86" in result.stdout
    assert "no tile table for fwd_appendkv/sm80_cpasync_mma on sm_86" in result.stdout
    assert "rejected fwd_fp32_group_d64x64_window_alibi_lse_drop_sink__sm_86_sm80" in (
        result.stdout
    )
    assert "simt_fma takes fp32" in result.stdout


def test_cli_explain_is_quiet_for_fp32_and_fp16() -> None:
    """The sm80 template builds every signature of the full set on the pre-Hopper archs, but
    fp8 K/V: it needs sm_89's e4m3 conversions, and on sm_89 its byte stages leave some split
    tiles over the 99 KiB per block; fp8 queries, which run on the Hopper template only; and
    the conv tiles whose 64-wide reduction step leaves them over the 99 KiB per block. Each such
    rejection says so."""
    result = _run_cli("--kernels", "full", "--arch", "sm_80;sm_86;sm_89", "--explain")
    assert result.returncode == 0, result.stderr
    blocks = result.stdout.split("rejected ")[1:]
    assert blocks, result.stdout
    for block in blocks:
        name, reasons = block.split("\n", 1)
        if "_qkve4m3__" in name:
            assert "fp8 queries run on the sm_90a wgmma template only" in reasons, block
            continue
        if name.startswith("conv_fwd_"):
            assert "_m128n128k64_w4s3" in name and "exceeds" in reasons, block
            assert "sm_86" in name or "sm_89" in name, block
            continue
        if name.startswith("conv_bwd_weight_"):
            assert "_m128n128k64_w8s3" in name and "exceeds" in reasons, block
            assert "sm_86" in name or "sm_89" in name, block
            continue
        assert "_kve4m3__" in name, block
        assert "fp8 K/V needs sm_89 or later" in reasons or "(fp8 K/V)" in reasons, block


# ---- CLI ----


def test_cli_list() -> None:
    result = _run_cli("--kernels", "ci", "--arch", "sm_80;sm_90a", "--list")
    assert result.returncode == 0, result.stderr
    names = result.stdout.split()
    # sm_80, sm_90a (each with a split-KV plan of every tile plus the combine stage: 3 kernels,
    # 4 on sm_90a; 4 paged kernels, 6 on sm_90a; two backward plans and two appends) and the
    # Hopper template on sm_90a (four forward kernels, the three fp16/bf16 feature kernels, and
    # the main stages of both backward plans)
    assert len(names) == 16 + 16 + 4 + 3 + 2 + 2 * 6 + 2 * 2 + 3
    assert any("__sm_90a_" in n for n in names) and any("__sm_80_" in n for n in names)


def test_cli_repeated_and_comma_arches() -> None:
    result = _run_cli("--kernels", "ci", "--arch", "sm_86,sm_89", "--arch", "sm_80", "--list")
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.split()) == 3 * (16 + 6 + 2)


def test_cli_explain_prints_reasons(tmp_path: Path) -> None:
    specs = json.loads((REPO_ROOT / "arch_specs.json").read_text())
    specs["arches"]["sm_86"]["tiles"]["fwd"]["sm80_cpasync_mma"]["128"].append(
        {"tile_m": 128, "tile_n": 256, "warps": 4, "stages": 1}
    )
    custom = tmp_path / "arch_specs.json"
    custom.write_text(json.dumps(specs))
    result = _run_cli("--specs", str(custom), "--kernels", "full", "--arch", "sm_86", "--explain")
    assert result.returncode == 0, result.stderr
    assert "rejected fwd_fp16_batch_d128x128_none_lse__sm_86_sm80_cpasync_mma_m128n256" in (
        result.stdout
    )
    assert "exceeds sm_86's limit of 101376 bytes" in result.stdout


def test_cli_out_writes_files(tmp_path: Path) -> None:
    result = _run_cli("--kernels", "ci", "--arch", "sm_90a", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    instances = sorted(tmp_path.glob("fwd_*.cu"))
    # Two of them KV-cache appends; 3 split-KV tiles; the three fp16/bf16 feature kernels also
    # on the Hopper template.
    assert len(instances) == 17 + 2 + 3
    # Two plans of three stages, and the sm90 main stage of each.
    assert len(list(tmp_path.glob("bwd_*.cu"))) == 6 + 2
    assert len(list(tmp_path.glob("batch_prefill_*.cu"))) == 6
    text = next(p for p in instances if "appendkv" not in p.name).read_text()
    assert text.startswith(emit.GENERATED_BANNER + "\n")
    assert '#include "ckfmha/kernel/sm80/fwd_launch.cuh"' in text
    assert (
        "launch_fwd_sm80<ckfmha_instance_" in text
        and "::Traits>(problem, args, context, stream)" in text
    )
    header = (tmp_path / "ckfmha_kernels.h").read_text()
    assert "#define CKFMHA_GENERATED_KERNEL_COUNT 36" in header
    table = (tmp_path / "kernel_table.cpp").read_text()
    assert "ckfmha_builtin_kernel_table(void)" in table
    assert '/*arch=*/90, "sm_90a", "sm80_cpasync_mma"' in table
    assert '/*arch=*/90, "sm_90a", "sm90_tma_wgmma"' in table
    assert '/*arch=*/90, "sm_90a", "simt_fma"' in table
    assert sum("simt/fwd_launch.cuh" in p.read_text() for p in instances) == 1
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert len(manifest["kernels"]) == 36
    instances = {p.name for p in tmp_path.glob("*.cu") if not p.name.startswith("unit_")}
    assert {k["source"] for k in manifest["kernels"]} == instances


def test_cli_table_symbol(tmp_path: Path) -> None:
    result = _run_cli(
        "--kernels", "ci", "--arch", "sm_80", "--out", str(tmp_path),
        "--table-symbol", emit.MODULE_TABLE_SYMBOL,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "ckfmha_module_kernel_table(void)" in (tmp_path / "kernel_table.cpp").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--kernels", "nope", "--list"), "unknown kernel set 'nope'"),
        (("--arch", "sm_75", "--list"), "unknown arch 'sm_75'; supported arches"),
        (("--kernels", "ci"), "nothing to do"),
    ],
)
def test_cli_errors_exit_nonzero(args: tuple[str, ...], message: str) -> None:
    result = _run_cli(*args)
    assert result.returncode != 0
    assert message in result.stderr


# ---- emitted files ----


def test_instance_matches_template() -> None:
    config = _config("sm_90a", dtype="bf16")
    assert emit.render_instance(config) == (
        "// Generated by the ckfmha generator (python -m generator). Do not edit.\n"
        '#include "ckfmha/kernel/sm80/fwd_launch.cuh"\n'
        "\n"
        f"namespace ckfmha_instance_{config.name} {{\n"
        "using Traits = ckfmha::kernel::FwdSm80Traits<cutlass::bfloat16_t, /*HeadDimQK=*/128, "
        "/*HeadDimV=*/128,\n"
        "    /*BlockM=*/128, /*BlockN=*/64, /*Warps=*/4, /*Stages=*/1,\n"
        "    ckfmha::kernel::MaskMode::kCausal, ckfmha::kernel::BiasMode::kNone,\n"
        "    /*HasLse=*/true, /*HasDropout=*/false, /*HasSoftcap=*/false, /*HasSink=*/false,\n"
        "    /*IsGroupMode=*/false>;\n"
        "static_assert(Traits::kSmemBytes == 65536,\n"
        '              "generator/rules/sm80_fwd.py and FwdSm80Traits::kSmemBytes disagree on '
        'shared-memory bytes");\n'
        "static_assert(Traits::kThreads == 128,\n"
        '              "generator/rules/sm80_fwd.py and FwdSm80Traits::kThreads disagree on '
        'threads per CTA");\n'
        "static_assert(Traits::kMinCtasPerSm == 1,\n"
        '              "generator/rules/sm80_fwd.py and FwdSm80Traits::kMinCtasPerSm disagree on '
        'CTAs per SM of the register budget");\n'
        f"}}  // namespace ckfmha_instance_{config.name}\n"
        "\n"
        f'extern "C" int ckfmha_kernel_{config.name}(const void* problem, const void* args, '
        "const ckfmha_launch_context* context, ckfmha_stream_t stream) {\n"
        f"  return ckfmha::kernel::launch_fwd_sm80<ckfmha_instance_{config.name}::Traits>"
        "(problem, args, context, stream);\n"
        "}\n"
    )


def test_feature_instance_passes_every_template_argument() -> None:
    config = _config(
        "sm_90a", dtype="bf16", mode="group", hdim_q=192, hdim_v=128, tile_k=192, mask="window",
        bias="alibi", dropout=True, softcap=True, sink=True,
    )  # fmt: skip
    text = emit.render_instance(config)
    assert (
        "using Traits = ckfmha::kernel::FwdSm80Traits<cutlass::bfloat16_t, /*HeadDimQK=*/192, "
        "/*HeadDimV=*/128,\n"
        "    /*BlockM=*/128, /*BlockN=*/64, /*Warps=*/4, /*Stages=*/1,\n"
        "    ckfmha::kernel::MaskMode::kWindow, ckfmha::kernel::BiasMode::kAlibi,\n"
        "    /*HasLse=*/true, /*HasDropout=*/true, /*HasSoftcap=*/true, /*HasSink=*/true,\n"
        "    /*IsGroupMode=*/true>;\n"
    ) in text
    assert f'extern "C" int {config.symbol}(const void* problem, const void* args, ' in text
    elementwise = emit.render_instance(_config(bias="elementwise", mask="none"))
    assert "MaskMode::kNone, ckfmha::kernel::BiasMode::kElementwise," in elementwise


def test_occupancy_and_stages_reach_name_and_traits() -> None:
    config = _config("sm_90a", stages=2, ctas_per_sm=2, tile_n=32)
    assert config.algorithm.name.endswith("_m128n32k128_w4s2c2")
    assert _config("sm_90a").algorithm.name.endswith("_w4s1"), "default occupancy adds no token"
    text = emit.render_instance(config)
    assert "/*Warps=*/4, /*Stages=*/2," in text
    assert "/*IsGroupMode=*/false, /*VColMajor=*/false, /*MinCtasPerSm=*/2>;" in text
    column_major = emit.render_instance(_config("sm_90a", v_col_major=True, ctas_per_sm=2))
    assert "/*VColMajor=*/true, /*MinCtasPerSm=*/2>;" in column_major


def test_tile_table_occupancy_is_parsed(tmp_path: Path) -> None:
    specs = json.loads((REPO_ROOT / "arch_specs.json").read_text())
    specs["arches"]["sm_90a"]["tiles"]["fwd"]["sm80_cpasync_mma"]["64"] = [
        {"tile_m": 64, "tile_n": 64, "warps": 4, "stages": 2, "ctas_per_sm": 3}
    ]
    custom = tmp_path / "arch_specs.json"
    custom.write_text(json.dumps(specs))
    (tile,) = load_specs(custom)["sm_90a"].tiles_for("fwd", "sm80_cpasync_mma", 64)
    assert (tile.stages, tile.ctas_per_sm) == (2, 3)
    assert load_specs()["sm_90a"].tiles_for("fwd", "sm80_cpasync_mma", 64)[0].ctas_per_sm == 1


def _sm90(**changes: object) -> str:
    defaults: dict[str, object] = {
        "dtype": "bf16",
        "mask": "causal",
        "pipeline": "sm90_tma_wgmma",
        "tile_m": 128,
        "tile_n": 128,
        "warps": 12,
        "stages": 2,
    }
    return _reasons("sm_90a", **{**defaults, **changes})


def test_sm90_template_accepts_plain_attention() -> None:
    assert _sm90() == ""
    assert _sm90(mask="window", lse=False) == ""
    assert _sm90(mode="group") == ""
    three_warpgroups = {"tile_m": 192, "warps": 16, "hdim_q": 64, "hdim_v": 64, "tile_k": 64}
    assert _sm90(**three_warpgroups) == ""


def test_tile_limited_by_when_is_the_default_only_where_it_applies() -> None:
    """d64's 192-row Hopper tile is listed first (after the fp8 forward's) for unmasked
    batch-mode signatures without an elementwise bias or dropout only; every other d64
    signature keeps the 128-row tile as its default, and unmasked batch-mode elementwise
    biases without a soft-cap also get the 192-row tile as a companion (row-broadcast biases
    only, which the dispatcher sends there)."""
    specs = load_specs()
    chosen: dict[tuple[object, ...], set[int]] = {}
    for c in select(get_receipt("default"), specs["sm_90a"]).accepted:
        sig = c.signature
        if (sig.family == "fwd" and c.algorithm.pipeline == "sm90_tma_wgmma"
                and sig.hdim_q == 64 and sig.q_quant == "none"):
            key = (sig.dtype, sig.mode, sig.mask, sig.lse, sig.bias, sig.dropout, sig.softcap)
            chosen.setdefault(key, set()).add(c.algorithm.tile_m)
    assert chosen, "the default set has d64 Hopper forward kernels"
    for (dtype, mode, mask, lse, bias, dropout, softcap), tiles in chosen.items():
        unmasked = (mode, mask) == ("batch", "none") and not dropout
        if unmasked and bias == "elementwise" and not softcap:
            expected = {128, 192}
        elif unmasked and bias != "elementwise":
            expected = {192}
        else:
            expected = {128}
        assert tiles == expected, (dtype, mode, mask, lse, bias, dropout, softcap)
    # The fp8 forward's tiles lead the list, limited to fp8 signatures (192 rows for the
    # unmasked batch-mode ones, as for bf16); the companion comes last.
    d64 = specs["sm_90a"].tiles_for("fwd", "sm90_tma_wgmma", 64)
    fp8_rows192, fp8_tile, tile = d64[:3]
    assert fp8_rows192.when == (("kv_quant", ("e4m3",)), ("mask", ("none",)), ("mode", ("batch",)))
    assert fp8_tile.when == (("kv_quant", ("e4m3",)),)
    assert tile.when == (
        ("bias", ("none", "alibi")), ("dropout", (False,)), ("mask", ("none",)),
        ("mode", ("batch",)),
    )  # fmt: skip
    assert [t.companion for t in d64] == [False] * (len(d64) - 1) + [True]
    assert d64[-1].tile_m == 192 and ("bias", ("elementwise",)) in d64[-1].when


def test_companion_flag_is_checked_when_the_specs_load(tmp_path: Path) -> None:
    specs = json.loads((REPO_ROOT / "arch_specs.json").read_text())
    specs["arches"]["sm_90a"]["tiles"]["fwd"]["sm90_tma_wgmma"]["128"][0]["companion"] = "yes"
    custom = tmp_path / "arch_specs.json"
    custom.write_text(json.dumps(specs))
    with pytest.raises(SpecsError, match=r"'companion' must be true or false, got 'yes'"):
        load_specs(custom)


@pytest.mark.parametrize(
    ("when", "expected"),
    [
        (
            {"hdim_q": [64]},
            (
                r"'when' names 'hdim_q', which is not a text or flag signature field; "
                r"it may name bias, dbias, dropout, dtype, family, kv_quant, lse, mask, mode, "
                r"page_layout, paged, q_quant, rope, sink, softcap, v_col_major"
            ),
        ),
        ({"lse": ["true"]}, r"'when' 'lse' must list one or more booleans \(true/false\)"),
        ({"mask": "none"}, r"'when' 'mask' must list one or more strings, got 'none'"),
        ({"mask": []}, r"'when' 'mask' must list one or more strings"),
        (["mask"], r"'when' must map signature fields to lists of values"),
    ],
)
def test_tile_when_is_checked_when_the_specs_load(
    tmp_path: Path, when: object, expected: str
) -> None:
    specs = json.loads((REPO_ROOT / "arch_specs.json").read_text())
    specs["arches"]["sm_90a"]["tiles"]["fwd"]["sm90_tma_wgmma"]["128"][0]["when"] = when
    custom = tmp_path / "arch_specs.json"
    custom.write_text(json.dumps(specs))
    with pytest.raises(
        SpecsError, match=r"sm_90a tiles\.fwd\.sm90_tma_wgmma\.128\[0\]: " + expected
    ):
        load_specs(custom)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"v_col_major": True}, r"column-major V not implemented by sm90_tma_wgmma"),
        ({"tile_m": 64}, r"tile_m=64, warps=12: the sm90_tma_wgmma template is tile_m 128 or 192"),
        ({"warps": 8}, r"consumer warpgroup per 64 rows \(12 or 16 warps\)"),
        ({"tile_m": 192}, r"tile_m=192, warps=12: .* \(12 or 16 warps\)"),
        (
            {"tile_m": 192, "warps": 16, "hdim_q": 128, "hdim_v": 128, "tile_k": 128},
            r"exceeds 96, what three consumer warpgroups of 160 registers hold",
        ),
        ({"stages": 1}, r"stages=1: the TMA ring needs at least 2"),
        ({"dropout": True, "tile_n": 192}, r"tile_n=192 with dropout: .* tile_n is 64 or 128"),
        ({"tile_n": 272}, r"tile_n=272 must be one wgmma's N: 16, 32, 64, 96, 128, 192, 256"),
        ({"tile_n": 176}, r"tile_n=176 must be one wgmma's N"),
        ({"ctas_per_sm": 2}, r"one warp-specialized CTA fills an SM"),
        (
            {"hdim_q": 256, "hdim_v": 256, "tile_k": 256, "stages": 3},
            r"shared memory 460800 bytes \(Q 128x256 \+ 3 x \(K 128x256 .* exceeds sm_90a's",
        ),
        (
            {"hdim_q": 256, "hdim_v": 256, "tile_k": 256, "tile_n": 256},
            r"estimated 256 accumulator registers per consumer thread",
        ),
        ({"pipeline": "sm90_tma_wgmma", "tile_k": 64}, r"tile_k=64 must equal hdim_q=128"),
    ],
)
def test_sm90_rule_fires_with_reason(changes: dict[str, object], expected: str) -> None:
    assert re.search(expected, _sm90(**changes)), _sm90(**changes)


def test_sm90_pipeline_exists_only_on_hopper() -> None:
    assert re.search(
        r"pipeline 'sm90_tma_wgmma' is not available on sm_80",
        _reasons("sm_80", pipeline="sm90_tma_wgmma", warps=12, stages=2),
    )
    names = [c.name for c in select(get_receipt("default"), load_specs()["sm_90a"]).accepted]
    hopper = [n for n in names if "_sm90_tma_wgmma_" in n and n.startswith("fwd_")
              and "_qkve4m3__" not in n]  # fmt: skip
    # fp16/bf16 x none/causal/window x (batch mode at 6 head dims + group mode at 2), LSE; and
    # the feature layer's and training set's signatures (fp16/bf16 x d64/d128), the unmasked
    # d64 elementwise bias on two tiles (the 192-row one for row-broadcast biases).
    plain = [n for n in hopper if not re.search(r"_(bias|alibi|drop|softcap|sink)", n)]
    assert len(plain) == 48
    assert len(hopper) == 48 + len(_feature_combos()) * 2 * 2 + 8 * 2 * 2 + 2
    assert "fwd_bf16_batch_d128x128_causal_lse__sm_90a_sm90_tma_wgmma_m128n128k128_w12s2" in hopper
    instance = emit.render_instance(
        next(
            c
            for c in select(get_receipt("default"), load_specs()["sm_90a"]).accepted
            if c.name == hopper[0]
        )
    )
    assert '#include "ckfmha/kernel/sm90/fwd_launch.cuh"' in instance
    assert "ckfmha::kernel::FwdSm90Traits<cutlass::half_t, /*HeadDimQK=*/32," in instance
    assert (
        "launch_fwd_sm90<ckfmha_instance_" in instance
        and "::Traits>(problem, args, context, stream)" in instance
    )


def test_fp32_instance_uses_the_simt_template() -> None:
    config = _simt_config(mode="group", mask="window", bias="alibi", dropout=True, sink=True)
    assert config.name == (
        "fwd_fp32_group_d128x128_window_alibi_lse_drop_sink__sm_90a_simt_fma_m64n64k128_w4s1"
    )
    assert emit.render_instance(config) == (
        "// Generated by the ckfmha generator (python -m generator). Do not edit.\n"
        '#include "ckfmha/kernel/simt/fwd_launch.cuh"\n'
        "\n"
        f"namespace ckfmha_instance_{config.name} {{\n"
        "using Traits = ckfmha::kernel::FwdSimtTraits<float, /*HeadDimQK=*/128, "
        "/*HeadDimV=*/128,\n"
        "    /*BlockM=*/64, /*BlockN=*/64, /*Warps=*/4, /*Stages=*/1,\n"
        "    ckfmha::kernel::MaskMode::kWindow, ckfmha::kernel::BiasMode::kAlibi,\n"
        "    /*HasLse=*/true, /*HasDropout=*/true, /*HasSoftcap=*/false, /*HasSink=*/true,\n"
        "    /*IsGroupMode=*/true>;\n"
        "static_assert(Traits::kSmemBytes == 118784,\n"
        '              "generator/rules/simt_fwd.py and FwdSimtTraits::kSmemBytes disagree on '
        'shared-memory bytes");\n'
        "static_assert(Traits::kThreads == 128,\n"
        '              "generator/rules/simt_fwd.py and FwdSimtTraits::kThreads disagree on '
        'threads per CTA");\n'
        "static_assert(Traits::kRowsPerThread == 4,\n"
        '              "generator/rules/simt_fwd.py and FwdSimtTraits::kRowsPerThread disagree on '
        'query rows per thread");\n'
        "static_assert(Traits::kKeysPerThread == 8,\n"
        '              "generator/rules/simt_fwd.py and FwdSimtTraits::kKeysPerThread disagree on '
        'keys per thread");\n'
        f"}}  // namespace ckfmha_instance_{config.name}\n"
        "\n"
        f'extern "C" int ckfmha_kernel_{config.name}(const void* problem, const void* args, '
        "const ckfmha_launch_context* context, ckfmha_stream_t stream) {\n"
        f"  return ckfmha::kernel::launch_fwd_simt<ckfmha_instance_{config.name}::Traits>"
        "(problem, args, context, stream);\n"
        "}\n"
    )


def test_emit_only_rewrites_changed_files(tmp_path: Path) -> None:
    specs = load_specs()
    selection = select(get_receipt("ci"), specs["sm_80"])
    first = emit.emit(tmp_path, selection.accepted, selection.rejected, specs)
    assert first.written == 16 + 6 + 2 + 3 + len(first.units)
    second = emit.emit(tmp_path, selection.accepted, selection.rejected, specs)
    assert second.written == 0
    # Dropping a kernel rewrites the index files and removes its stale instance and units.
    third = emit.emit(tmp_path, selection.accepted[:3], [], specs)
    assert len(list(tmp_path.glob("*.cu"))) == 3 + len(third.units)
    assert {p.name for p in tmp_path.glob("unit_*.cu")} == {p.name for p, _ in third.units}


def _syntax_check(directory: Path, source: Path, *language: str) -> None:
    command = ["g++", *(language or ("-std=c++17",)), "-fsyntax-only", "-Wall", "-Werror"]
    command += [f"-I{REPO_ROOT / 'cpp' / 'include'}", f"-I{directory}", str(source)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


@needs_gxx
def test_empty_table_compiles(tmp_path: Path) -> None:
    files = emit.emit(tmp_path, [], [], load_specs(), emit.MODULE_TABLE_SYMBOL)
    assert "CKFMHA_GENERATED_KERNEL_COUNT 0" in files.header.read_text()
    _syntax_check(tmp_path, files.table)


@needs_gxx
def test_ci_table_and_header_compile(tmp_path: Path) -> None:
    specs = load_specs()
    selection = select_for_arches(get_receipt("ci"), ARCHES, specs)
    files = emit.emit(tmp_path, selection.accepted, selection.rejected, specs)
    _syntax_check(tmp_path, files.table)
    # The dispatch header is plain C as well, so C consumers can include it.
    _syntax_check(tmp_path, files.header, "-x", "c", "-std=c11")


TABLE_DUMP = """\
#include <cstdio>
#include "ckfmha_kernels.h"
extern "C" const ckfmha_kernel_table* ckfmha_builtin_kernel_table(void);
int main() {
  const ckfmha_kernel_table* t = ckfmha_builtin_kernel_table();
  std::printf("%d %d\\n", t->abi_version, t->count);
  for (int i = 0; i < t->count; ++i) {
    const ckfmha_kernel_entry& e = t->entries[i];
    int32_t resident = -1;  // -1: the entry has no query
    if (e.resident_ctas != nullptr && e.resident_ctas(&resident) != 0) resident = -2;
    std::printf("%s %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %s %s %d %d %d %d %d %d %d %d %d %d %d\\n",
                e.name, e.family, e.dtype, e.mode, e.hdim_q, e.hdim_v, e.mask, e.bias,
                e.has_lse, e.has_dropout, e.has_softcap, e.has_sink, e.v_col_major,
                e.has_dbias, e.rope, e.paged_kv, e.page_layout, e.kv_quant, e.q_quant, e.arch,
                e.arch_name,
                e.pipeline,
                e.tile_m, e.tile_n, e.tile_k, e.warps, e.stages,
                e.launch(nullptr, nullptr, nullptr, nullptr), resident, e.bias_rows_only,
                e.conv_spatial_dims, e.conv_vector, e.conv_max_channels);
  }
}
"""


@needs_gxx
def test_table_fields_land_in_entry_order(tmp_path: Path) -> None:
    """Builds the ci table, an fp8 forward (its q_quant), two kernels that take only
    row-broadcast biases (the Hopper backward's, a 192-row Hopper forward's), three grouped
    convolutions (their conv fields; the 2D one on the wgmma template, and a direct one with
    its channel bucket) and a convolution's weight gradient, against kernel_entry.h and reads
    every field back."""
    specs = load_specs()
    configs = select_for_arches(get_receipt("ci"), ("sm_80", "sm_90a"), specs).accepted
    configs.append(
        KernelConfig(
            FwdSignature("bf16", "batch", 128, 128, "causal", True, kv_quant="e4m3",
                         q_quant="e4m3"),
            Algorithm("sm_90a", "sm90_tma_wgmma", 128, 128, 128, 12, 2),
        )
    )  # fmt: skip
    rows_only = [
        KernelConfig(BwdSignature("bwd_dq_dk_dv", "bf16", "batch", 64, 64, "causal",
                                  bias="elementwise"),
                     Algorithm("sm_90a", "sm90_tma_wgmma", 64, 128, 64, 12, 2)),
        KernelConfig(FwdSignature("bf16", "batch", 64, 64, "none", True, bias="elementwise"),
                     Algorithm("sm_90a", "sm90_tma_wgmma", 192, 128, 64, 16, 2)),
    ]  # fmt: skip
    assert all(rules.bias_rows_only(c) for c in rows_only)
    configs += rows_only
    configs += [
        KernelConfig(ConvSignature("fp16", 3, 4),
                     Algorithm("sm_80", "sm80_cpasync_mma", 64, 32, 32, 4, 4)),
        KernelConfig(ConvSignature("bf16", 2, 1),
                     Algorithm("sm_90a", "sm90_cpasync_wgmma", 128, 128, 64, 8, 3)),
        KernelConfig(ConvSignature("fp16", 3, 1, max_channels=4),
                     Algorithm("sm_86", "conv_direct", 8, 32, 4, 4, 1)),
        KernelConfig(ConvSignature("bf16", 3, 2, family="conv_bwd_weight"),
                     Algorithm("sm_90a", "sm80_cpasync_mma", 64, 128, 32, 4, 3)),
    ]  # fmt: skip
    files = emit.emit(tmp_path, configs, [], specs)
    # Each stub answers its entry's index: the launch returns it, the resident-CTA query (the
    # split-KV families') writes 1000 more.
    stubs = "".join(
        f'extern "C" int {c.symbol}(const void*, const void*, const ckfmha_launch_context*, '
        f"ckfmha_stream_t) {{ return {i}; }}\n"
        + (f'extern "C" int {symbol}(int32_t* ctas) {{ *ctas = {1000 + i}; return 0; }}\n'
           if (symbol := emit.resident_ctas_symbol(c)) else "")
        for i, c in enumerate(configs)
    )  # fmt: skip
    (tmp_path / "stubs.cpp").write_text(f'#include "ckfmha_kernels.h"\n{stubs}')
    (tmp_path / "dump.cpp").write_text(TABLE_DUMP)
    program = tmp_path / "dump"
    command = ["g++", "-std=c++17", "-Wall", "-Werror", f"-I{REPO_ROOT / 'cpp' / 'include'}"]
    command += [f"-I{tmp_path}", str(files.table), str(tmp_path / "stubs.cpp")]
    command += [str(tmp_path / "dump.cpp"), "-o", str(program)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    lines = subprocess.run(
        [str(program)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert lines[0] == f"16 {len(configs)}"
    enums = {
        "mode": {"batch": 0, "group": 1},
        "family": {
            "fwd": 0,
            "fwd_splitkv": 1,
            "fwd_splitkv_combine": 2,
            "fwd_pagedkv": 3,
            "fwd_appendkv": 4,
            "batch_prefill": 5,
            "bwd_dot_do_o": 6,
            "bwd_dq_dk_dv": 7,
            "bwd_convert_dq": 8,
            "conv_fwd": 9,
            "conv_bwd_weight": 10,
        },
        "rope": {"none": 0, "interleaved": 1, "half_rotated": 2},
        "mask": {"none": 0, "causal": 1, "window": 2},
        "bias": {"none": 0, "elementwise": 1, "alibi": 2},
        "dtype": {"fp16": 0, "bf16": 1, "fp32": 2},
    }
    for i, (line, config) in enumerate(zip(lines[1:], configs)):
        sig, alg = config.signature, config.algorithm
        expected = [
            config.name, enums["family"][sig.family], enums["dtype"][sig.dtype],
            enums["mode"][sig.mode], sig.hdim_q, sig.hdim_v, enums["mask"][sig.mask],
            enums["bias"][sig.bias], int(sig.lse), int(sig.dropout), int(sig.softcap),
            int(sig.sink), int(sig.v_col_major), int(getattr(sig, "dbias", False)),
            enums["rope"][getattr(sig, "rope", "none")], int(getattr(sig, "paged", False)),
            int(getattr(sig, "page_layout", "linear") == "vectorized"),
            int(sig.kv_quant == "e4m3"), int(sig.q_quant == "e4m3"), specs[alg.arch].arch_number,
            alg.arch, alg.pipeline, alg.tile_m, alg.tile_n, alg.tile_k, alg.warps, alg.stages, i,
            1000 + i if sig.family in ("fwd_splitkv", *PAGED_FAMILIES) else -1,
            int(config in rows_only), getattr(sig, "spatial_dims", 0), getattr(sig, "vector", 0),
            getattr(sig, "max_channels", 0),
        ]  # fmt: skip
        assert line.split() == [str(v) for v in expected]


# ---- backward families ----


def _bwd_config(arch: str = "sm_90a", **changes: object) -> KernelConfig:
    """A valid bwd_dq_dk_dv config (bf16 d128 causal, 64x128, 8 warps, 2 stages)."""
    sig = BwdSignature("bwd_dq_dk_dv", "bf16", "batch", 128, 128, "causal")
    alg = Algorithm(arch, "sm80_cpasync_mma", tile_m=64, tile_n=128, tile_k=128, warps=8, stages=2)
    sig_fields = {k: v for k, v in changes.items() if hasattr(sig, k) and k != "name"}
    alg_fields = {k: v for k, v in changes.items() if k not in sig_fields}
    return KernelConfig(replace(sig, **sig_fields), replace(alg, **alg_fields))


def _bwd_reasons(arch: str = "sm_90a", **changes: object) -> str:
    return "\n".join(rules.check(_bwd_config(arch, **changes), load_specs()[arch]))


def test_valid_bwd_config_has_no_reasons() -> None:
    assert _bwd_reasons() == ""
    assert _bwd_reasons("sm_80") == ""
    rowwise = KernelConfig(
        BwdSignature("bwd_dot_do_o", "fp16", "group", 96, 96),
        Algorithm("sm_86", "sm80_cpasync_mma", tile_m=64, tile_n=0, tile_k=96, warps=4, stages=1),
    )
    assert rules.check(rowwise, load_specs()["sm_86"]) == []


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"tile_n": 48}, r"tile_n=48 is not a positive multiple of 32"),
        ({"stages": 3}, r"stages=3 is not supported; .* Q and dO in 1 or 2"),
        (
            {"tile_m": 128, "tile_n": 128},
            r"shared memory 262144 bytes \(2 x \(Q 128x128 \+ dO 128x128\)",
        ),
        (
            {"tile_m": 128, "tile_n": 128, "stages": 1},
            r"estimated 256 accumulator registers per thread",
        ),
        ({"warps": 3}, r"no grid of 3 warps tiles S = Q K\^T"),
        ({"dbias": True}, r"dbias with bias 'none': dbias is the gradient of an elementwise"),
        ({"bias": "alibi", "dbias": True}, r"dbias with bias 'alibi'.*ALiBi's slopes are "),
        (
            {"bias": "elementwise", "dbias": True, "tile_n": 96},
            r"tile_n=96 with 256 threads: dbias zeroes the unvisited rows",
        ),
        ({"ctas_per_sm": 2}, r"ctas_per_sm=2 is not supported by the sm80_cpasync_mma backward"),
        # The main stage has an sm90 template too, with its own limits.
        (
            {"pipeline": "sm90_tma_wgmma"},
            r"warps=8: the sm90_tma_wgmma backward at head dim 128 is tile_m=64 query rows per step",
        ),
        (
            {"tile_m": 32, "tile_n": 32, "warps": 8},
            r"no grid of 8 warps tiles S = Q K\^T and dP = dO V\^T \(32x32\)",
        ),
    ],
)
def test_bwd_rule_fires_with_reason(changes: dict[str, object], expected: str) -> None:
    assert re.search(expected, _bwd_reasons(**changes)), _bwd_reasons(**changes)


def test_bwd_sm80_accepts_dbias_of_an_elementwise_bias() -> None:
    for mode in ("batch", "group"):
        for mask in ("none", "causal", "window"):
            assert _bwd_reasons(bias="elementwise", dbias=True, mode=mode, mask=mask,
                                softcap=True, dropout=True) == ""  # fmt: skip


def test_default_set_has_dbias_plans_and_ci_none() -> None:
    default = [s for s in get_receipt("default").signatures if getattr(s, "dbias", False)]
    assert len(default) == 10
    assert all(s.bias == "elementwise" and s.family == "bwd_dq_dk_dv" for s in default)
    assert any(s.mode == "group" for s in default) and any(s.softcap for s in default)
    assert not [s for s in get_receipt("ci").signatures if getattr(s, "dbias", False)]


def test_bwd_smem_formula_matches_the_traits() -> None:
    # BwdSm80Traits::kSmemBytes: Q and dO stages, then K, V, P and dS (bf16).
    assert rules.bwd_sm80_smem_bytes(128, 128, 64, 128, 2) == 2 * (
        2 * 64 * 256 + 128 * 256 + 2 * 64 * 128
    )


def test_squarest_warp_grid_matches_flash_attention_layouts() -> None:
    # FlashAttention-2's d128 backward (64x128, 8 warps): S/dP 2x4, dQ 2x4; d64 (128x128)
    # dK/dV 4x2; perimeter ties keep the first (fewest warps along M).
    assert rules.squarest_warps_m(64, 128, 8) == 2
    assert rules.squarest_warps_m(128, 64, 8) == 4
    assert rules.squarest_warps_m(128, 128, 8) == 2
    assert rules.squarest_warps_m(32, 32, 8) == 0


def test_bwd_instances_render_their_templates() -> None:
    config = _bwd_config(mode="group", mask="window")
    assert config.name == (
        "bwd_dq_dk_dv_bf16_group_d128x128_window__sm_90a_sm80_cpasync_mma_m64n128k128_w8s2"
    )
    text = emit.render_instance(config)
    assert '#include "ckfmha/kernel/sm80/bwd_launch.cuh"' in text
    assert "ckfmha::kernel::BwdSm80Traits<cutlass::bfloat16_t, /*HeadDimQK=*/128" in text
    assert "/*BlockM=*/64, /*BlockN=*/128, /*Warps=*/8, /*Stages=*/2" in text
    assert "ckfmha::kernel::MaskMode::kWindow, ckfmha::kernel::BiasMode::kNone" in text
    assert "/*HasDbias=*/false, /*IsGroupMode=*/true>;" in text
    assert (
        "launch_bwd_dq_dk_dv_sm80<ckfmha_instance_" in text
        and "::Traits>(problem, args, context, stream)" in text
    )
    rowwise = KernelConfig(
        BwdSignature("bwd_convert_dq", "fp16", "batch", 192, 192),
        Algorithm("sm_80", "sm80_cpasync_mma", tile_m=64, tile_n=0, tile_k=192, warps=4, stages=1),
    )
    assert rowwise.name == "bwd_convert_dq_fp16_batch_d192__sm_80_sm80_cpasync_mma_m64k192_w4s1"
    text = emit.render_instance(rowwise)
    assert "BwdRowwiseTraits<cutlass::half_t, /*HeadDim=*/192, /*BlockM=*/64" in text
    assert "launch_bwd_convert_dq<ckfmha_instance_" in text


def test_bwd_feature_tokens_appear_only_when_on() -> None:
    sig = BwdSignature("bwd_dq_dk_dv", "fp16", "batch", 64, 64, "none", bias="elementwise",
                       dropout=True, softcap=True, dbias=True)  # fmt: skip
    assert sig.name == "bwd_dq_dk_dv_fp16_batch_d64x64_none_bias_drop_softcap_dbias"
    assert not sig.lse and not sig.sink and not sig.v_col_major


# ---- the sm90 backward main stage


def _bwd_sm90(**changes: object) -> str:
    sig = BwdSignature("bwd_dq_dk_dv", "bf16", "batch", 128, 128, "causal")
    alg = Algorithm(
        "sm_90a", "sm90_tma_wgmma", tile_m=64, tile_n=128, tile_k=128, warps=12, stages=2
    )
    sig_fields = {k: v for k, v in changes.items() if k in BwdSignature.__dataclass_fields__}
    alg_fields = {k: v for k, v in changes.items() if k not in sig_fields}
    config = KernelConfig(replace(sig, **sig_fields), replace(alg, **alg_fields))
    return "\n".join(rules.check(config, load_specs()["sm_90a"]))


def test_bwd_sm90_accepts_its_scope() -> None:
    for dtype in ("fp16", "bf16"):
        for hdim, keys in ((64, 128), (128, 128), (256, 64)):
            for mask in ("none", "causal", "window"):
                for mode in ("batch", "group"):
                    assert _bwd_sm90(dtype=dtype, hdim_q=hdim, hdim_v=hdim, tile_k=hdim,
                                     tile_n=keys, mask=mask, mode=mode) == ""  # fmt: skip
            # An elementwise bias (broadcast over the query rows) in batch mode, on both
            # layouts.
            for features in ({"bias": "alibi"}, {"softcap": True},
                             {"bias": "alibi", "softcap": True}, {"bias": "elementwise"},
                             {"bias": "elementwise", "softcap": True}):  # fmt: skip
                assert _bwd_sm90(dtype=dtype, hdim_q=hdim, hdim_v=hdim, tile_k=hdim,
                                 tile_n=keys, **features) == ""  # fmt: skip
            # Dropout's random words fit beside every layout but d256's.
            dropout = _bwd_sm90(dtype=dtype, hdim_q=hdim, hdim_v=hdim, tile_k=hdim, tile_n=keys,
                                dropout=True)  # fmt: skip
            assert (dropout == "") == (hdim != 256), dropout


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"bias": "elementwise", "mode": "group"},
            (
                r"^bias 'elementwise' in group mode not implemented yet; "
                r"sm90_tma_wgmma's backward covers .* every mask \(causal and sliding windows\), "
                r"GQA/MQA, ALiBi, logit soft-caps, dropout, batch and group mode .* and in batch "
                r"mode an elementwise bias broadcast over the query rows .* sm80_cpasync_mma "
                r"covers the rest"
            ),
        ),
        ({"bias": "elementwise", "dbias": True}, r"^dbias not implemented yet"),
        (
            {"dropout": True, "hdim_q": 256, "hdim_v": 256, "tile_k": 256, "tile_n": 64},
            r"shared memory 236544 bytes exceeds sm_90a's limit of 232448 bytes per block",
        ),
        (
            {"hdim_q": 32, "hdim_v": 32, "tile_k": 32},
            (
                r"head dims 32x32: sm90_tma_wgmma's backward takes head dims of 64, 96, 128, 256, "
                r"192x128"
            ),
        ),
        (
            {"tile_m": 128},
            (
                r"tile_m=128, tile_n=128, warps=12: the sm90_tma_wgmma backward at "
                r"head dim 128 is tile_m=64 query rows per step and tile_n=128 keys "
                r"per CTA"
            ),
        ),
        ({"tile_n": 64}, r"tile_n=64"),
        (
            {"hdim_q": 256, "hdim_v": 256, "tile_k": 256},
            (
                r"tile_n=128, warps=12: the sm90_tma_wgmma backward at head dim 256 is tile_m=64 query "
                r"rows per step and tile_n=64 keys per CTA with 12 warps \(a TMA producer warpgroup and "
                r"two consumer warpgroups sharing 64 keys, the head dim split between them\)"
            ),
        ),
        ({"warps": 8}, r"warps=8"),
        ({"stages": 1}, r"stages=1: the sm90_tma_wgmma backward's Q/dO ring has 2 stages"),
        ({"ctas_per_sm": 2}, r"ctas_per_sm=2: one warp-specialized CTA fills an SM"),
        ({"tile_k": 64}, r"tile_k=64 must equal hdim_q=128"),
    ],
)
def test_bwd_sm90_rule_fires_with_reason(changes: dict[str, object], expected: str) -> None:
    reasons = _bwd_sm90(**changes)
    assert re.search(expected, reasons), reasons


def test_bwd_sm90_smem_matches_the_traits_layout() -> None:
    from generator.rules.sm90_bwd import bwd_sm90_traits_smem_bytes

    # K and V 128 x d, two stages of Q and dO 64 x d, two dS^T buffers 128 x 64, 16-bit; each
    # stage's 64 fp32 LSE and D values and the 64 x d fp32 dQ tile; the 1 KiB alignment slack.
    bf16_tiles = (2 * 128 * 128 + 4 * 64 * 128 + 2 * 128 * 64) * 2
    fp32_rows_and_dq = (4 * 64 + 64 * 128) * 4
    assert rules.bwd_sm90_smem_bytes(128) == bf16_tiles + fp32_rows_and_dq + 1024
    # d256: K and V 64 x 256, the Q/dO ring, two P^T and two dS^T buffers 64 x 64; no dQ tile.
    bf16_tiles = (2 * 64 * 256 + 4 * 64 * 256 + 4 * 64 * 64) * 2
    assert rules.bwd_sm90_smem_bytes(256) == bf16_tiles + 4 * 64 * 4 + 1024
    # d192x128: the head split with K 64 x 192, V 64 x 128, Q and dO stages of 64 x 192 and
    # 64 x 128, P^T and dS^T, and a dQ staging tile of its own (64 x 192 fp32).
    bf16_tiles = (64 * 320 + 2 * 64 * 320 + 4 * 64 * 64) * 2
    assert rules.bwd_sm90_smem_bytes(192, hdim_v=128) == (
        bf16_tiles + (4 * 64 + 64 * 192) * 4 + 1024
    )
    assert bwd_sm90_traits_smem_bytes(192, hdim_v=128) <= (
        load_specs()["sm_90a"].max_dynamic_smem_per_block
    )
    # d96 takes the key-split layout of d128 at 96 columns.
    bf16_tiles = (2 * 128 * 96 + 4 * 64 * 96 + 2 * 128 * 64) * 2
    assert rules.bwd_sm90_smem_bytes(96) == bf16_tiles + (4 * 64 + 64 * 96) * 4 + 1024
    for hdim in (64, 96, 128, 256):
        limit = load_specs()["sm_90a"].max_dynamic_smem_per_block
        # What the rule rejects on is the traits' own kSmemBytes (asserted in every instance).
        assert bwd_sm90_traits_smem_bytes(hdim) <= limit


def test_bwd_sm90_only_on_hopper_and_only_for_the_main_stage() -> None:
    assert re.search(r"pipeline 'sm90_tma_wgmma' is not available on sm_80",
                     "\n".join(rules.check(KernelConfig(
                         BwdSignature("bwd_dq_dk_dv", "bf16", "batch", 128, 128, "causal"),
                         Algorithm("sm_80", "sm90_tma_wgmma", 64, 128, 128, 12, 2)),
                         load_specs()["sm_80"])))  # fmt: skip
    rowwise = KernelConfig(
        BwdSignature("bwd_convert_dq", "bf16", "batch", 128, 128),
        Algorithm("sm_90a", "sm90_tma_wgmma", 64, 0, 128, 4, 1),
    )
    assert re.search(
        r"family 'bwd_convert_dq' has no 'sm90_tma_wgmma' template",
        "\n".join(rules.check(rowwise, load_specs()["sm_90a"])),
    )


def test_bwd_sm90_kernels_in_the_default_set_and_their_instance() -> None:
    accepted = select(get_receipt("default"), load_specs()["sm_90a"]).accepted
    names = [c.name for c in accepted if c.name.startswith("bwd_") and "_sm90_tma_wgmma_" in c.name]
    plain = [n for n in names if re.search(r"_(none|causal|window)__", n)]
    features = sorted(n.split("__")[0] for n in names if n not in plain)
    assert "bwd_dq_dk_dv_bf16_batch_d256x256_window_softcap" in features
    assert "bwd_dq_dk_dv_fp16_group_d64x64_causal_alibi_drop_softcap" in features
    assert len(features) == 46
    assert sorted(plain) == sorted(
        f"bwd_dq_dk_dv_{dtype}_{mode}_d{d}x{dv}_{mask}__sm_90a_sm90_tma_wgmma_m64n{n}k{d}_w12s2"
        for dtype in ("fp16", "bf16")
        for mode in ("batch", "group")
        for d, dv, n in (
            (64, 64, 128),
            (96, 96, 128),
            (128, 128, 128),
            (256, 256, 64),
            (192, 128, 64),
        )
        for mask in ("none", "causal", "window")
    )
    # Every sm90 main stage's plan finds its row-wise stages in the same set.
    for d in (64, 96, 128, 256):
        for mode in ("batch", "group"):
            assert any(c.name.startswith(f"bwd_dot_do_o_bf16_{mode}_d{d}__") for c in accepted)
            assert any(c.name.startswith(f"bwd_convert_dq_bf16_{mode}_d{d}__") for c in accepted)
    config = next(c for c in accepted if c.name == names[0])
    instance = emit.render_instance(config)
    assert '#include "ckfmha/kernel/sm90/bwd_launch.cuh"' in instance
    assert "ckfmha::kernel::BwdSm90Traits<" in instance
    assert (
        "launch_bwd_dq_dk_dv_sm90<ckfmha_instance_" in instance
        and "::Traits>(problem, args, context, stream)" in instance
    )
    # Rejected sm90 candidates (dbias, other head dims) stay on sm80.
    rejected = select(get_receipt("default"), load_specs()["sm_90a"]).rejected
    assert any(r.pipeline == "sm90_tma_wgmma" and r.signature.family == "bwd_dq_dk_dv"
               and r.signature.bias == "elementwise" for r in rejected)  # fmt: skip
