"""The Hopper fp8 forward (Q, K and V in e4m3, O in dtype) in the generator: names, the rules
that say which configs build, the shared memory and registers its traits must agree on, the
emitted instance and table entry, its tiles and the kernel sets that hold it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from generator import emit, rules
from generator.enumerate import select
from generator.names import parse_kernel_name
from generator.receipts import get_receipt
from generator.rules.sm90_fwd import fwd_sm90_smem_bytes
from generator.signature import Algorithm, FwdSignature, KernelConfig
from generator.specs import load_specs

FP8 = {"q_quant": "e4m3", "kv_quant": "e4m3"}


def _config(arch: str = "sm_90a", **changes: object) -> KernelConfig:
    """A valid fp8 forward config (bf16 output, d128, causal, batch mode, 128x128, 12 warps)."""
    sig = FwdSignature("bf16", "batch", 128, 128, "causal", True, **FP8)
    alg = Algorithm(arch, "sm90_tma_wgmma", tile_m=128, tile_n=128, tile_k=128, warps=12,
                    stages=2)  # fmt: skip
    sig_fields = {k: v for k, v in changes.items() if hasattr(sig, k) and k != "name"}
    alg_fields = {k: v for k, v in changes.items() if k not in sig_fields}
    return KernelConfig(replace(sig, **sig_fields), replace(alg, **alg_fields))


def _reasons(arch: str = "sm_90a", **changes: object) -> str:
    return "\n".join(rules.check(_config(arch, **changes), load_specs()[arch]))


def test_names_say_qkv_and_round_trip() -> None:
    config = _config()
    assert config.name.startswith("fwd_bf16_batch_d128x128_causal_lse_qkve4m3__sm_90a_")
    assert parse_kernel_name(config.name) == config
    # Q quantised alone (a config the rules reject) still has a name of its own.
    q_only = _config(kv_quant="none")
    assert "_qe4m3__" in q_only.name and parse_kernel_name(q_only.name) == q_only
    kv_only = _config(q_quant="none", family="fwd_splitkv")
    assert "_kve4m3__" in kv_only.name and parse_kernel_name(kv_only.name) == kv_only


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"dtype": "fp16"},
        {"mask": "none"},
        {"mask": "window"},
        {"mode": "group"},
        {"lse": False},
        {"hdim_q": 64, "hdim_v": 64, "tile_k": 64},
        {"hdim_q": 256, "hdim_v": 256, "tile_k": 256},
        {"hdim_q": 256, "hdim_v": 256, "tile_k": 256, "tile_n": 64},
        {"tile_n": 64},
    ],
)
def test_accepted_configs(changes: dict[str, object]) -> None:
    assert _reasons(**changes) == ""


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"kv_quant": "none"}, "need K/V in the same format (kv_quant 'e4m3', not 'none')"),
        ({"q_quant": "none"}, "read by fwd only with fp8 queries (q_quant e4m3)"),
        ({"q_quant": "e5m2"}, "q_quant 'e5m2' is unknown"),
        ({"family": "fwd_splitkv"}, "fp8 queries (q_quant 'e4m3') are read by the one-stage"),
        ({"pipeline": "sm80_cpasync_mma", "tile_n": 64, "warps": 4},
         "fp8 queries run on the sm_90a wgmma template only"),
        ({"tile_m": 192, "warps": 16}, "tile_m=192 at head dim 128: three fp8 consumer warpgroups"),
        ({"tile_m": 256, "warps": 20}, "tile_m=256: the fp8 forward is tile_m 128 or 192"),
        ({"tile_n": 96}, "tile_n=96: the fp8 forward takes tile_n 64 or 128"),
        ({"hdim_q": 64, "hdim_v": 64, "tile_k": 64, "tile_n": 256},
         "a key tile must lie in one 128-key block of per-block K/V scales"),
        ({"tile_n": 32}, "fp8 wgmma steps are 32 keys deep"),
        ({"stages": 4}, "stages=4: the fp8 forward's K/V rings"),
        ({"hdim_q": 192, "tile_k": 192}, "the fp8 forward takes hdim_q == hdim_v in {64, 128, 256}"),
        ({"hdim_q": 96, "hdim_v": 96, "tile_k": 96}, "hdim_q == hdim_v in {64, 128, 256}"),
        ({"bias": "alibi"}, "bias 'alibi'"),
        ({"dropout": True}, "dropout"),
        ({"softcap": True}, "softcap"),
        ({"sink": True}, "sink"),
    ],
)  # fmt: skip
def test_rejected_configs_say_why(changes: dict[str, object], reason: str) -> None:
    assert reason in _reasons(**changes)


def test_fp8_forward_needs_sm90a() -> None:
    for arch in ("sm_80", "sm_89"):
        reasons = _reasons(arch, pipeline="sm80_cpasync_mma", tile_n=64, warps=4)
        assert "fp8 queries run on the sm_90a wgmma template only" in reasons
    assert "fp8 K/V needs sm_89 or later" in _reasons("sm_80")


def _layout(q_stages: int, tile_n: int, hdim: int, o_bytes: int, stages: int = 2) -> int:
    """The fp8 traits' storage: 1 KiB aligned byte arrays of Q, K, V staged and V transposed,
    O's staging in 2-byte elements, the mbarriers, and a KiB of alignment slack."""
    kib = 1024

    def up(n: int) -> int:
        return -(-n // kib) * kib

    arrays = [q_stages * 128 * hdim, stages * tile_n * hdim, stages * tile_n * hdim,
              stages * hdim * tile_n, o_bytes]  # fmt: skip
    barriers = 8 * (2 * 2 + 6 * stages)
    return up(sum(up(a) for a in arrays) + barriers) + kib


def test_shared_memory_mirrors_the_fp8_traits() -> None:
    batch_o = 2 * 64 * 128 * 2  # two warpgroups' 64 x 128 chunks of bf16
    # d128: two Q stages and O staged fit 227 KiB.
    assert fwd_sm90_smem_bytes(_config()) == _layout(2, 128, 128, batch_o)
    # d256: two Q stages do not fit, nor does O beside one: one Q, O from registers.
    d256 = _config(hdim_q=256, hdim_v=256, tile_k=256)
    assert fwd_sm90_smem_bytes(d256) == _layout(1, 128, 256, 0) == 226 * 1024
    assert _layout(2, 128, 256, batch_o) > 227 * 1024
    # Group mode stages the whole O tile (128 x hdim): d64 fits it with two Q stages.
    group = _config(mode="group", hdim_q=64, hdim_v=64, tile_k=64)
    assert fwd_sm90_smem_bytes(group) == _layout(2, 128, 64, 128 * 64 * 2)


def test_traits_assertions_use_the_fp8_register_split() -> None:
    assertions = {a.member: a.cpp_value for a in rules.traits_assertions(_config())}
    assert str(assertions["kConsumerRegisters"]) == "216"
    assert str(assertions["kThreads"]) == "384"
    plain = {a.member: a.cpp_value for a in rules.traits_assertions(_config(q_quant="none",
                                                                              kv_quant="none"))}  # fmt: skip
    assert str(plain["kConsumerRegisters"]) == "240"


def test_instance_sets_kvfp8_without_split_kv() -> None:
    text = emit.render_instance(_config())
    assert text.count("FwdSm90Traits<") == 1
    assert (
        "/*IsGroupMode=*/false, /*VColMajor=*/false, /*MinCtasPerSm=*/1, /*SplitKv=*/false, "
        "/*PagedKv=*/false, /*KvFp8=*/true>;" in text
    )
    # The split-KV body's fp8 K/V keeps SplitKv set.
    split = KernelConfig(
        FwdSignature("bf16", "batch", 128, 128, "causal", True, family="fwd_splitkv",
                     kv_quant="e4m3"),
        Algorithm("sm_90a", "sm80_cpasync_mma", 16, 64, 128, 1, 2),
    )  # fmt: skip
    assert "/*SplitKv=*/true, /*PagedKv=*/false, /*KvFp8=*/true>" in emit.render_instance(split)


def test_table_entry_carries_q_quant_after_kv_quant() -> None:
    specs = load_specs()
    table = emit.render_table([_config()], specs)
    assert "CKFMHA_PAGE_LAYOUT_LINEAR, CKFMHA_KV_QUANT_FP8_E4M3, CKFMHA_KV_QUANT_FP8_E4M3," in table
    plain = emit.render_table([_config(q_quant="none", kv_quant="none")], specs)
    assert "CKFMHA_PAGE_LAYOUT_LINEAR, CKFMHA_KV_QUANT_NONE, CKFMHA_KV_QUANT_NONE," in plain


def test_fp8_tiles_lead_without_changing_plain_defaults() -> None:
    arch = load_specs()["sm_90a"]
    # The plain defaults as before the fp8 tiles: 192x128 at d64 (unmasked batch), 128x128 at
    # d128, 128x64 at d256.
    plain_defaults = {64: (192, 128), 128: (128, 128), 256: (128, 64)}
    # fp8's own (tile_m, tile_n, stages) for a causal signature: 128x128, except at d256, whose
    # O accumulator leaves too few registers for a 128-key S tile; three stages where they
    # measured faster. (d64's unmasked batch-mode signatures take 192 rows: the next test.)
    fp8_defaults = {64: (128, 128, 2), 128: (128, 128, 3), 256: (128, 64, 3)}
    for hdim, plain_default in plain_defaults.items():
        tiles = arch.tiles_for("fwd", "sm90_tma_wgmma", hdim)
        fp8_sig = FwdSignature("bf16", "batch", hdim, hdim, "causal", True, **FP8)
        fp8_default = next(t for t in tiles if t.applies_to(fp8_sig))
        tile = (fp8_default.tile_m, fp8_default.tile_n, fp8_default.stages)
        assert tile == fp8_defaults[hdim] and fp8_default.warps == 12
        assert fp8_default.when == (("kv_quant", ("e4m3",)),)
        plain = FwdSignature("bf16", "batch", hdim, hdim, "none", True)
        default = next(t for t in tiles if t.applies_to(plain))
        assert (default.tile_m, default.tile_n) == plain_default


def _fp8_names(kernel_set: str, arch: str) -> list[str]:
    accepted = select(get_receipt(kernel_set), load_specs()[arch]).accepted
    return [c.name for c in accepted if c.signature.q_quant != "none"]


def test_kernel_sets_hold_the_fp8_forward_on_sm90a_only() -> None:
    core = _fp8_names("core", "sm_90a")
    assert sorted(n.split("__")[0] for n in core) == [
        "fwd_bf16_batch_d128x128_causal_lse_qkve4m3",
        "fwd_bf16_batch_d128x128_none_lse_qkve4m3",
    ]
    default = _fp8_names("default", "sm_90a")
    # {fp16,bf16} x d{64,128,256} x {none,causal} x {batch,group}, with LSE, on the fp8 tile
    # (128 keys, 64 at d256; 3 stages from d128) ...
    assert len(default) == 24
    # ... except d64's unmasked batch-mode signatures, on 192 rows (three consumer warpgroups).
    for name in default:
        hdim = name.split("_d")[1].split("x")[0]
        keys, stages = {"64": (128, 2), "128": (128, 3), "256": (64, 3)}[hdim]
        rows, warps = (
            (192, 16) if hdim == "64" and "_batch_" in name and "_none_" in name else (128, 12)
        )
        assert name.endswith(f"_sm90_tma_wgmma_m{rows}n{keys}k{hdim}_w{warps}s{stages}")
    for kernel_set in ("core", "default"):
        for arch in ("sm_80", "sm_86", "sm_89"):
            assert _fp8_names(kernel_set, arch) == []


def test_generator_lists_the_fp8_forward(capsys: pytest.CaptureFixture[str]) -> None:
    from generator.cli import main

    assert main(["--kernels", "default", "--arch", "sm_90a", "--filter", "qkve4m3", "--list"]) in (
        0,
        None,
    )
    listed = capsys.readouterr().out.split()
    assert len([n for n in listed if "qkve4m3" in n]) == 24
