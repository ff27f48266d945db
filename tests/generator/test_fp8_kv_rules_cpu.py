"""fp8 (e4m3) K/V kernels in the generator: names, the rules that say where they build, and
the shared memory their traits must agree on."""

from __future__ import annotations

from dataclasses import replace

from generator import rules
from generator.names import parse_kernel_name
from generator.receipts import get_receipt
from generator.rules.sm80_fwd import sm80_fwd_smem_bytes
from generator.signature import Algorithm, AppendKvSignature, FwdSignature, KernelConfig
from generator.specs import load_specs


def _fp8_config(arch: str = "sm_90a", **changes: object) -> KernelConfig:
    """A valid fp8 K/V decode config (bf16 queries, d128, causal, 16x64 tile, 1 warp)."""
    sig = FwdSignature(
        "bf16", "batch", 128, 128, "causal", True, family="fwd_splitkv", kv_quant="e4m3"
    )
    alg = Algorithm(arch, "sm80_cpasync_mma", tile_m=16, tile_n=64, tile_k=128, warps=1, stages=2)
    sig_fields = {k: v for k, v in changes.items() if hasattr(sig, k) and k != "name"}
    alg_fields = {k: v for k, v in changes.items() if k not in sig_fields}
    return KernelConfig(replace(sig, **sig_fields), replace(alg, **alg_fields))


def _reasons(arch: str = "sm_90a", **changes: object) -> str:
    return "\n".join(rules.check(_fp8_config(arch, **changes), load_specs()[arch]))


def test_fp8_names_round_trip() -> None:
    for changes in ({}, {"family": "fwd_pagedkv"}, {"family": "batch_prefill", "mode": "group"}):
        config = _fp8_config(**changes)
        assert "_kve4m3__" in config.name
        assert parse_kernel_name(config.name) == config
    plain = _fp8_config(kv_quant="none")
    assert "kve4m3" not in plain.name and parse_kernel_name(plain.name) == plain


def test_fp8_builds_on_sm89_and_later_only() -> None:
    assert _reasons("sm_90a") == ""
    # sm_89 (99 KiB per block) takes the 16x32 tile; 16x64 needs 100 KiB with fp8's byte stages.
    assert _reasons("sm_89", tile_n=32) == ""
    assert "fp8 K/V) + one fp16 K and V tile) exceeds sm_89's limit" in _reasons("sm_89")
    for arch in ("sm_80", "sm_86"):
        assert "fp8 K/V needs sm_89 or later" in _reasons(arch)


def test_fp8_rejections_name_the_reason() -> None:
    one_stage = _reasons(family="fwd", tile_m=128, tile_n=64, warps=4, stages=1)
    assert "read by the split-KV body and written by the cache append" in one_stage
    assert "read by fwd only with fp8 queries (q_quant e4m3) on sm90_tma_wgmma" in one_stage
    assert "linear pages only" in _reasons(family="fwd_pagedkv", page_layout="vectorized")
    assert "stages=3 with fp8 K/V" in _reasons(stages=3)
    # One pair of byte stages (stages=1) is a valid fp8 body, paged too; fp16/bf16 pages are not.
    assert _reasons(stages=1) == "" and _reasons(family="fwd_pagedkv", stages=1) == ""
    assert "double-buffered (stages=2)" in _reasons(family="fwd_pagedkv", stages=1, kv_quant="none")
    assert "kv_quant 'e5m2' is unknown" in _reasons(kv_quant="e5m2")


def test_fp8_shared_memory_is_byte_stages_plus_one_element_tile() -> None:
    # Q 16x128 bf16, four byte stages of K and V (64 x 256 bytes), one bf16 K and V tile.
    expected = 16 * 128 * 2 + 4 * 64 * 256 + 64 * 256 * 2
    assert sm80_fwd_smem_bytes(128, 128, 16, 64, 2, 2, kv_fp8=True) == expected
    assert sm80_fwd_smem_bytes(128, 128, 16, 64, 2, 2) == 16 * 128 * 2 + 2 * 64 * 256 * 2
    # stages=1: two byte stages.
    assert sm80_fwd_smem_bytes(128, 128, 16, 16, 1, 2, kv_fp8=True) == (
        16 * 128 * 2 + 2 * 16 * 256 + 16 * 256 * 2
    )
    assertions = {a.member: a.cpp_value for a in rules.traits_assertions(_fp8_config())}
    assert str(expected) in str(assertions["kSmemBytes"])


def test_core_set_builds_fp8_decode_on_hopper() -> None:
    names = {sig.name for sig in get_receipt("core").signatures}
    assert "fwd_splitkv_bf16_batch_d128x128_causal_lse_kve4m3" in names
    assert "fwd_pagedkv_bf16_batch_d128x128_causal_lse_kve4m3" in names


def test_fp8_cache_appends_name_and_arch() -> None:
    sig = AppendKvSignature("bf16", 128, 128, rope="half_rotated", paged=True, kv_quant="e4m3")
    alg = Algorithm("sm_90a", "appendkv", tile_m=16, tile_n=0, tile_k=128, warps=4, stages=1)
    config = KernelConfig(sig, alg)
    assert config.name.startswith("fwd_appendkv_bf16_d128x128_rope_half_rotated_paged_kve4m3__")
    assert parse_kernel_name(config.name) == config
    specs = load_specs()
    assert rules.check(config, specs["sm_90a"]) == []
    older = KernelConfig(sig, replace(alg, arch="sm_80"))
    assert any("fp8 K/V needs sm_89" in r for r in rules.check(older, specs["sm_80"]))
