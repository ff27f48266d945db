"""Split-KV without a GPU: generator rules and emission, plan selection, explanations,
workspace sizes and errors through the C API and the Cython layer.

Plan expectations use whatever split kernels the library was built with (the ci set holds a
bf16 d128 window group-mode pair); tests needing one skip when the build has none.
"""

from __future__ import annotations

import re

import pytest
from support.kernel_cases import make_config, problem_fields, rule_reasons

import ckfmha
from ckfmha import errors
from generator.emit import render_instance
from generator.enumerate import select
from generator.receipts import get_receipt
from generator.signature import FwdSignature, KernelConfig
from generator.specs import load_specs

ARCHES = ("sm_80", "sm_86", "sm_89", "sm_90a")


def _config(family: str = "fwd_splitkv", arch: str = "sm_80", **changes: object) -> KernelConfig:
    sig_fields: dict[str, object] = {
        "dtype": "bf16", "mode": "batch", "hdim_q": 128, "hdim_v": 128, "mask": "causal",
        "lse": True, "family": family,
    }  # fmt: skip
    alg_fields: dict[str, object] = {
        "arch": arch, "pipeline": "sm80_cpasync_mma", "tile_m": 16, "tile_n": 64,
        "tile_k": 128, "warps": 1, "stages": 2,
    }  # fmt: skip
    if family == "fwd_splitkv_combine":
        sig_fields["mask"] = "none"
        alg_fields.update(pipeline="splitkv_combine", tile_m=1, tile_n=4, warps=4, stages=1)
    return make_config(FwdSignature, sig_fields, alg_fields, changes)


# ---- generator ----


@pytest.mark.parametrize("arch", ARCHES)
def test_every_split_tile_and_combine_builds_in_default(arch: str) -> None:
    spec = load_specs()[arch]
    selection = select(get_receipt("default"), spec)
    built = {(c.signature.family, c.signature.hdim_v, c.algorithm.tile_m, c.algorithm.warps)
             for c in selection.accepted}
    for family in ("fwd_splitkv", "fwd_splitkv_combine"):
        for pipeline, by_hdim in spec.tiles[family].items():
            for (_, hdim_v), tiles in by_hdim.items():
                for tile in tiles:
                    assert (family, hdim_v, tile.tile_m, tile.warps) in built, (arch, pipeline)
    # fp8 K/V variants are rejected where the arch has no e4m3 conversion (before sm_89).
    assert not [r for r in selection.rejected
                if "splitkv" in r.signature.family and r.signature.kv_quant == "none"]


def test_ci_set_holds_one_split_plan_per_arch() -> None:
    # Every split tile of the signature (sm_90a lists a third, 16x32 keys) and one combine.
    for arch, tiles in (("sm_80", 2), ("sm_90a", 3)):
        selection = select(get_receipt("ci"), load_specs()[arch])
        split = [c.name for c in selection.accepted if "splitkv" in c.signature.family]
        assert len(split) == tiles + 1, split
        assert sum("combine" in name for name in split) == 1


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"bias": "alibi"}, r"bias 'alibi'.*not implemented by fwd_splitkv"),
        ({"dropout": True}, r"dropout.*not implemented by fwd_splitkv"),
        ({"sink": True}, r"sink.*not implemented by fwd_splitkv"),
        ({"v_col_major": True}, r"column-major V.*not implemented by fwd_splitkv"),
        ({"pipeline": "simt_fma", "dtype": "fp32"},
         r"no 'simt_fma' template; it runs on sm80_cpasync_mma"),
        ({"tile_m": 24}, r"tile_m=24 is not a positive multiple of 16"),
    ],
)
def test_split_rules_say_why(changes: dict[str, object], message: str) -> None:
    assert re.search(message, rule_reasons(_config(**changes)))


def test_split_kv_softcap_and_group_mode_are_valid() -> None:
    assert rule_reasons(_config(softcap=True, mode="group", mask="window")) == ""
    assert rule_reasons(_config(arch="sm_90a", tile_m=64, warps=4), "sm_90a") == ""


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tile_m": 8}, r"warps\*32=128 threads must be a multiple of tile_m=8 rows x hdim_v"),
        ({"tile_m": 3}, r"tile_m=3 rows x hdim_v=128 / tile_n=4: each CTA merges whole rows"),
        ({"tile_n": 8, "tile_m": 8}, r"tile_n=8 must be 4"),
        ({"mask": "causal"}, r"mask 'causal'.*only merges partials"),
        ({"lse": False}, r"no LSE.*only merges partials"),
        ({"hdim_q": 192}, r"hdim_q == hdim_v"),
        ({"stages": 2}, r"stages=2"),
        ({"dtype": "fp32"}, r"dtype 'fp32' does not run on the splitkv_combine template"),
        ({"pipeline": "sm80_cpasync_mma"}, r"no 'sm80_cpasync_mma' template"),
    ],
)
def test_combine_rules_say_why(changes: dict[str, object], message: str) -> None:
    assert re.search(message, rule_reasons(_config("fwd_splitkv_combine", **changes)))


def test_fwd_family_does_not_meet_the_combine_pipeline() -> None:
    config = _config("fwd", pipeline="splitkv_combine", tile_m=4, tile_n=4, warps=4, stages=1)
    assert "family 'fwd' has no 'splitkv_combine' template" in rule_reasons(config)


def test_instances_name_their_templates() -> None:
    split = render_instance(_config())
    assert "sm80/fwd_splitkv_launch.cuh" in split and "/*SplitKv=*/true>" in split
    assert "launch_fwd_splitkv_sm80<ckfmha_instance_" in split
    combine = render_instance(_config("fwd_splitkv_combine", mode="group"))
    assert "FwdSplitKvCombineTraits<cutlass::bfloat16_t, /*HeadDimV=*/128, /*Warps=*/4, " \
           "/*IsGroupMode=*/true, /*RowsPerCta=*/1>" in combine
    plain = render_instance(_config("fwd", tile_m=128, tile_n=32, warps=4, stages=1))
    assert "SplitKv" not in plain and "sm80/fwd_launch.cuh" in plain


# ---- plans through the C API ----


def _split_kernels() -> list[dict]:
    return [k for k in ckfmha.Registry().kernels() if k["family"] == "fwd_splitkv"]


@pytest.fixture(scope="module")
def split_kernel() -> dict:
    kernels = _split_kernels()
    if not kernels:
        pytest.skip("library built without split-KV kernels")
    return kernels[0]


def _problem(kernel: dict, **changes: object) -> ckfmha.FwdProblem:
    fields: dict[str, object] = {
        "batch": 2, "nhead_q": 32, "nhead_k": 8, "seqlen_q": 1, "seqlen_k": 4096,
        **problem_fields(kernel),
    }  # fmt: skip
    fields.update(changes)
    return ckfmha.FwdProblem(**fields)  # type: ignore[arg-type]


def _workspace(splits: int, batch: int, heads: int, seqlen_q: int, hdim_v: int) -> int:
    if splits == 1:
        return 0  # one split writes O and LSE directly
    lse_bytes = 4 * splits * batch * heads * seqlen_q
    return (lse_bytes + 255) // 256 * 256 + lse_bytes * hdim_v


def _resident(arch: int, tile_m: int, tile_n: int, warps: int, stages: int, hdim: int) -> int:
    """CTAs per SM as the runtime estimates them: shared memory (+1 KiB reserved), threads,
    and 255 registers per thread."""
    smem_per_sm = 228 * 1024 if arch >= 90 else 164 * 1024 if arch in (80, 87) else 100 * 1024
    threads_per_sm = 1536 if arch in (86, 89) else 2048
    smem = 2 * (tile_m * hdim + stages * tile_n * 2 * hdim) + 1024
    return max(1, min(smem_per_sm // smem, threads_per_sm // (32 * warps),
                      65536 // (32 * warps * 256)))


def _wave_model_splits(ctas: int, key_tiles: int, slots: int, sms: int) -> int:
    """The documented wave model: no split for a grid filling one wave with 2+ CTAs per SM,
    else the smallest S minimising waves x (tiles per split + 1)."""
    if 2 * sms <= ctas <= slots:
        return 1

    def time(s: int) -> int:
        return -(-ctas * s // slots) * (-(-key_tiles // s) + 1)

    return min(range(1, min(max(key_tiles // 2, 1), 128) + 1), key=lambda s: (time(s), s))


def test_decode_problem_gets_a_split_plan(split_kernel: dict) -> None:
    dispatcher = ckfmha.Dispatcher()
    arch = split_kernel["arch"]
    problem = _problem(split_kernel)
    text = dispatcher.explain(problem, arch=arch)
    plan = re.search(r"plan: split-KV, (\S+) then (\S+), num_splits=(\d+), workspace (\d+) bytes "
                     r"\((\d+) SMs\): decode-shaped", text)
    assert plan, text
    split, combine, splits, size, sms = plan.groups()
    assert f"selected  {split}" in text and f"selected  {combine}" in text
    assert dispatcher.select(problem, arch=arch) == split
    # 4 packed rows per K/V head: the 16-row tile, 16 CTAs (2 x 8 heads).
    assert split.endswith(f"m16n64k{split_kernel['hdim_q']}_w1s2")
    expected_splits = _wave_model_splits(16, 4096 // 64, int(sms) * _resident(
        split_kernel["arch"], 16, 64, 1, 2, split_kernel["hdim_q"]), int(sms))
    assert int(splits) == expected_splits > 1
    assert dispatcher.workspace_size(problem, arch=arch) == int(size) == _workspace(
        expected_splits, 2, 32, 1, split_kernel["hdim_v"])


@pytest.mark.parametrize("splits", [2, 3, 7, 200])
def test_requested_splits_size_the_workspace(split_kernel: dict, splits: int) -> None:
    problem = _problem(split_kernel, seqlen_q=5, num_splits=splits)
    size = ckfmha.Dispatcher().workspace_size(problem, arch=split_kernel["arch"])
    assert size == _workspace(splits, 2, 32, 5, split_kernel["hdim_v"])
    text = ckfmha.Dispatcher().explain(problem, arch=split_kernel["arch"])
    assert f"num_splits={splits}, workspace {size} bytes" in text and "as asked" in text


def test_one_split_asks_for_one_stage(split_kernel: dict) -> None:
    problem = _problem(split_kernel, num_splits=1)
    arch = split_kernel["arch"]
    text = ckfmha.Dispatcher().explain(problem, arch=arch)
    if "plan: one-stage" in text:
        assert "num_splits=1 asks for one stage" in text
        assert ckfmha.Dispatcher().workspace_size(problem, arch=arch) == 0
    else:
        # No one-stage kernel of this signature in the build: the plan says so, and sizing
        # its workspace fails the way running it would.
        assert "plan: none" in text, text
        with pytest.raises(errors.UnsupportedError):
            ckfmha.Dispatcher().workspace_size(problem, arch=arch)


def test_large_prefill_stays_one_stage(split_kernel: dict) -> None:
    problem = _problem(split_kernel, batch=8, nhead_q=32, nhead_k=32, seqlen_q=4096)
    text = ckfmha.Dispatcher().explain(problem, arch=split_kernel["arch"])
    plan = text.split("plan: ")[-1]
    if plan.startswith("one-stage"):
        assert "fills" in plan and "not decode-shaped" in plan, plan
        assert ckfmha.Dispatcher().workspace_size(problem, arch=split_kernel["arch"]) == 0
    else:
        # Only when the build has no one-stage kernel for it does a split plan (of one split:
        # the grid is full, and the split writes O itself) serve it.
        assert re.match(r"split-KV, \S+, num_splits=1: one split writes O directly \(no combine, "
                        r"no workspace; \d+ SMs\): no one-stage kernel fits", plan), plan
        assert ckfmha.Dispatcher().workspace_size(problem, arch=split_kernel["arch"]) == 0


@pytest.mark.parametrize(
    ("arch", "batch", "tile", "one_split"),
    [
        # sm_90a (132 SMs): 512 CTAs overflow the 16x64 tile's 3 x 132 slots but fit the 16x32
        # tile's 6 x 132: one split, no combine.
        (90, 64, "m16n32", True),
        # 128 CTAs, under 2 per SM: the 16x64 tile (deeper loads) with a split count.
        (90, 16, "m16n64", False),
        # 384 CTAs fit the 16x64 tile's own wave: one split on it.
        (90, 48, "m16n64", True),
        # 1024 CTAs overflow both tiles' waves: the first tile, still unsplit (a CTA a SM or
        # more: the bytes, not the waves, set the time).
        (90, 128, "m16n64", True),
        # sm_80 lists no 16x32 tile: the 16x64 tile runs 512 CTAs in two waves, unsplit (at a
        # CTA a SM or more the bytes, not the waves, set the time).
        (80, 64, "m16n64", True),
    ],
)
def test_full_decode_batches_run_one_split(arch: int, batch: int, tile: str,
                                           one_split: bool) -> None:
    kernels = [k for k in _split_kernels()
               if k["arch"] == arch and k["hdim_q"] == 128 and "_m16n" in k["name"]]
    if not any("_m16n64" in k["name"] for k in kernels) or (
            arch == 90 and not any("_m16n32" in k["name"] for k in kernels)):
        pytest.skip(f"library built without sm_{arch}'s 16-row split tiles")
    dispatcher = ckfmha.Dispatcher()
    # 4 packed rows per K/V head, 8 K/V heads: batch x 8 CTAs of one split.
    problem = _problem(kernels[0], batch=batch, seqlen_k=4096)
    text = dispatcher.explain(problem, arch=arch)
    plan = text.split("plan: ")[-1]
    assert f"_{tile}k128_w1s2" in dispatcher.select(problem, arch=arch), plan
    size = dispatcher.workspace_size(problem, arch=arch)
    if one_split:
        assert re.match(r"split-KV, \S+, num_splits=1: one split writes O directly", plan), plan
        assert size == 0
        # The combine stage is not run, so not selected.
        assert not re.search(r"selected  fwd_splitkv_combine", text), text
    else:
        splits = int(re.search(r"num_splits=(\d+)", plan).group(1))  # type: ignore[union-attr]
        assert splits > 1 and " then fwd_splitkv_combine_" in plan, plan
        assert size == _workspace(splits, batch, 32, 1, 128)


def test_split_features_it_lacks_are_unsupported(split_kernel: dict) -> None:
    problem = _problem(split_kernel, num_splits=4, sink=True)
    with pytest.raises(errors.UnsupportedError) as caught:
        ckfmha.Dispatcher().select(problem, arch=split_kernel["arch"])
    assert "num_splits=4 asks for a split-KV plan" in str(caught.value)
    assert "no sink, problem has one" in str(caught.value)


@pytest.mark.parametrize("splits", [-1, 257])
def test_bad_split_counts_are_invalid(split_kernel: dict, splits: int) -> None:
    with pytest.raises(errors.InvalidArgumentError) as caught:
        _problem(split_kernel, num_splits=splits).validate()
    assert "num_splits" in str(caught.value) and "2..256" in str(caught.value)


def test_num_splits_reaches_the_c_struct(split_kernel: dict) -> None:
    assert _problem(split_kernel, num_splits=7).to_c_dict()["num_splits"] == 7
    assert _problem(split_kernel).to_c_dict()["num_splits"] == 0


def test_explain_lists_every_split_and_combine_kernel(split_kernel: dict) -> None:
    text = ckfmha.Dispatcher().explain(_problem(split_kernel), arch=split_kernel["arch"])
    for kernel in ckfmha.Registry().kernels():
        if kernel["family"] in ("fwd_splitkv", "fwd_splitkv_combine"):
            assert kernel["name"] in text


def test_repeated_plans_follow_the_problem(split_kernel: dict) -> None:
    # Plans are remembered per problem: asking again, alternating between
    # problems, must give each problem its own answer.
    dispatcher = ckfmha.Dispatcher()
    arch = split_kernel["arch"]
    sizes = {splits: _workspace(splits, 2, 32, 5, split_kernel["hdim_v"]) for splits in (2, 7)}
    for _ in range(3):
        for splits, expected in sizes.items():
            problem = _problem(split_kernel, seqlen_q=5, num_splits=splits)
            assert dispatcher.workspace_size(problem, arch=arch) == expected
    with pytest.raises(errors.UnsupportedError):
        dispatcher.workspace_size(_problem(split_kernel, hdim=96), arch=arch)
    assert dispatcher.workspace_size(
        _problem(split_kernel, seqlen_q=5, num_splits=2), arch=arch
    ) == sizes[2]
