"""Instances assert that the generator's numbers (shared memory, threads, register budgets) equal
their C++ traits' own, so the rules' arithmetic cannot drift from the kernels it describes."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest
from support.jit_toolchain import skip_without_jit_toolchain
from support.paths import REPO_ROOT

from generator import build, emit, rules
from generator.enumerate import select
from generator.receipts import RECEIPTS
from generator.signature import (
    Algorithm,
    BwdSignature,
    ConvSignature,
    FwdSignature,
    KernelConfig,
)
from generator.specs import ArchSpec, load_specs
from generator.toolchain import CompileJob, CudaToolchain

SPECS = load_specs()
ASSERTION = re.compile(r'static_assert\(Traits::(\w+) == (\w+),\n {14}"([^"\n]+)"\);\n')

# The traits members each template's instances assert, by (family, pipeline).
SM80_MEMBERS = {"kSmemBytes", "kThreads", "kMinCtasPerSm"}
ROWWISE_MEMBERS = {"kThreads", "kLanesPerRow", "kRowsPerPass"}
EXPECTED_MEMBERS = {
    ("fwd", "sm80_cpasync_mma"): SM80_MEMBERS,
    ("fwd_splitkv", "sm80_cpasync_mma"): SM80_MEMBERS,
    ("fwd_pagedkv", "sm80_cpasync_mma"): SM80_MEMBERS,
    ("batch_prefill", "sm80_cpasync_mma"): SM80_MEMBERS,
    ("fwd", "sm90_tma_wgmma"): {"kThreads", "kConsumerRegisters", "kSmemLimit", "kSmemBytes",
                                   "kBiasStages", "kBiasRowsOnly"},
    ("fwd", "simt_fma"): {"kSmemBytes", "kThreads", "kRowsPerThread", "kKeysPerThread"},
    ("fwd_splitkv_combine", "splitkv_combine"): {"kThreads", "kColsPerThread", "kRowsPerCta"},
    ("fwd_appendkv", "appendkv"): {"kThreads", "kKvItems"},
    ("bwd_dot_do_o", "sm80_cpasync_mma"): ROWWISE_MEMBERS,
    ("bwd_convert_dq", "sm80_cpasync_mma"): ROWWISE_MEMBERS,
    ("bwd_dq_dk_dv", "sm80_cpasync_mma"): SM80_MEMBERS
    | {"kWarpsMSdP", "kWarpsMdK", "kWarpsMdV", "kWarpsMdQ"},
    ("bwd_dq_dk_dv", "sm90_tma_wgmma"): {"kThreads", "kSplitsHeadDim", "kSmemBytes",
                                         "kBiasRowsOnly"},
    ("conv_fwd", "sm80_cpasync_mma"): {"kThreads", "kWarpsM", "kWarpsN", "kSmemBytes",
                                       "kSmemLaunchBytes"},
    ("conv_fwd", "sm90_cpasync_wgmma"): {"kThreads", "kWarpgroups", "kSmemBytes",
                                         "kSmemLaunchBytes", "kMinCtasPerSm"},
    # Its shared memory depends on the problem (stride, dilation, filter): nothing to assert.
    ("conv_fwd", "sm90_tma_wgmma"): {"kThreads", "kConsumerWarpgroups", "kSmemLaunchBytes",
                                     "kMinCtasPerSm"},
    ("conv_fwd", "conv_direct"): {"kThreads", "kMaxChannels", "kRun", "kTileH", "kGroups"},
    ("conv_bwd_weight", "sm80_cpasync_mma"): {"kThreads", "kWarpsM", "kWarpsN", "kSmemBytes",
                                              "kSmemLaunchBytes"},
    ("conv_bwd_weight", "sm90_cpasync_wgmma"): {"kThreads", "kWarpgroups", "kSmemBytes",
                                                "kSmemLaunchBytes", "kMinCtasPerSm"},
    # The same as the forward's direct template's, for the same reason.
    ("conv_bwd_weight", "sm90_tma_wgmma"): {"kThreads", "kConsumerWarpgroups",
                                            "kSmemLaunchBytes", "kMinCtasPerSm"},
    ("conv_bwd_weight", "conv_direct"): {"kThreads", "kMaxChannels", "kRun", "kTileH", "kGroups"},
}


def _every_instance() -> list[KernelConfig]:
    configs = {
        config.name: config
        for receipt in RECEIPTS.values()
        for spec in SPECS.values()
        for config in select(receipt, spec).accepted
    }
    return list(configs.values())


def _assertions(text: str, config: KernelConfig) -> dict[str, tuple[str, str]]:
    """member -> (value, message) of the static_asserts in the instance's namespace block."""
    namespace = emit.instance_namespace(config)
    block = text.split(f"namespace {namespace} {{\n", 1)[1]
    block = block.split(f"}}  // namespace {namespace}", 1)[0]
    alias, _, rest = block.partition(">;\n")
    assert alias.startswith("using Traits = "), block
    found = {member: (value, message) for member, value, message in ASSERTION.findall(rest)}
    assert ASSERTION.sub("", rest) == "", f"only assertions follow the alias:\n{rest}"
    return found


def test_every_instance_kind_asserts_its_traits() -> None:
    kinds: set[tuple[str, str]] = set()
    for config in _every_instance():
        kind = (config.signature.family, config.algorithm.pipeline)
        kinds.add(kind)
        found = _assertions(emit.render_instance(config), config)
        assert set(found) == EXPECTED_MEMBERS[kind], config.name
        traits = emit.template_for(config).traits.rsplit("::", 1)[-1]
        for member, (_, message) in found.items():
            expected = rf"generator/rules/\w+\.py and {traits}::{member} disagree on .+"
            assert re.fullmatch(expected, message), message
            assert (REPO_ROOT / message.split(" ")[0]).is_file(), message
    assert kinds == set(EXPECTED_MEMBERS), "every template family is built by some kernel set"


def _limited(arch: str, smem: int) -> ArchSpec:
    return dataclasses.replace(SPECS[arch], max_dynamic_smem_per_block=smem)


@pytest.mark.parametrize(
    "config",
    [
        KernelConfig(
            FwdSignature("bf16", "batch", 128, 128, "causal", True),
            Algorithm("sm_80", "sm80_cpasync_mma", 128, 64, 128, 4, 2),
        ),
        KernelConfig(
            FwdSignature("bf16", "batch", 128, 128, "none", True, family="fwd_splitkv"),
            Algorithm("sm_80", "sm80_cpasync_mma", 64, 64, 128, 4, 2),
        ),
        KernelConfig(
            FwdSignature("fp32", "group", 128, 128, "window", True),
            Algorithm("sm_80", "simt_fma", 64, 64, 128, 4, 1),
        ),
        KernelConfig(
            BwdSignature("bwd_dq_dk_dv", "fp16", "batch", 128, 128, "causal"),
            Algorithm("sm_80", "sm80_cpasync_mma", 64, 128, 128, 8, 2),
        ),
    ],
    ids=lambda config: config.algorithm.pipeline + "/" + config.signature.family,
)
def test_asserted_shared_memory_is_what_the_rules_check(config: KernelConfig) -> None:
    """The number an instance asserts is the one the rules hold to the arch's limit: a limit of
    one byte less rejects the config quoting that number, an equal limit accepts it."""
    arch = config.algorithm.arch
    assert rules.check(config, SPECS[arch]) == []
    asserted = int(_assertions(emit.render_instance(config), config)["kSmemBytes"][0])
    under = "\n".join(rules.check(config, _limited(arch, asserted - 1)))
    assert f"shared memory {asserted} bytes" in under, under
    assert rules.check(config, _limited(arch, asserted)) == []


@pytest.mark.parametrize(
    ("config", "table_bytes"),
    [
        (
            KernelConfig(
                ConvSignature("fp16", 3, 4),
                Algorithm("sm_80", "sm80_cpasync_mma", 128, 64, 32, 4, 3),
            ),
            128 * 32,  # a ConvRow per output row
        ),
        (
            KernelConfig(
                ConvSignature("bf16", 2, 8),
                Algorithm("sm_90a", "sm90_cpasync_wgmma", 128, 128, 64, 8, 6),
            ),
            128 * 32,
        ),
        (
            KernelConfig(
                ConvSignature("bf16", 3, 8, family="conv_bwd_weight"),
                Algorithm("sm_80", "sm80_cpasync_mma", 128, 64, 64, 8, 4),
            ),
            2 * 64 * 32,  # two slots of a ConvRow per reduction position
        ),
    ],
    ids=lambda value: (
        value.algorithm.pipeline + "/" + value.signature.family
        if isinstance(value, KernelConfig) else ""
    ),
)
def test_conv_instances_assert_the_launched_bytes_the_rules_check(
    config: KernelConfig, table_bytes: int
) -> None:
    """A conv kernel launches its operand stages and its row (or position) table: the rules
    hold kSmemLaunchBytes (not kSmemBytes) to the arch's limit, to the byte."""
    arch = config.algorithm.arch
    assert rules.check(config, SPECS[arch]) == []
    found = _assertions(emit.render_instance(config), config)
    launched, stages = int(found["kSmemLaunchBytes"][0]), int(found["kSmemBytes"][0])
    assert launched == stages + table_bytes
    under = "\n".join(rules.check(config, _limited(arch, launched - 1)))
    assert f"shared memory {launched} bytes" in under, under
    assert rules.check(config, _limited(arch, launched)) == []


# kSmemBytes of sm90 instances as nvcc computes it from the traits (sizeof of their shared
# storage): the generator mirrors the layout choice and the barriers the rules' checks leave out.
SM90_TRAITS_SMEM = [
    (FwdSignature("bf16", "batch", 128, 128, "causal", True), (128, 128, 12, 2), 231424),
    (BwdSignature("bwd_dq_dk_dv", "bf16", "batch", 64, 64, "causal"), (64, 128, 12, 2), 117760),
    (BwdSignature("bwd_dq_dk_dv", "bf16", "batch", 128, 128, "causal"), (64, 128, 12, 2), 199680),
    (BwdSignature("bwd_dq_dk_dv", "bf16", "batch", 256, 256, "causal"), (64, 64, 12, 2), 232448),
]


@pytest.mark.parametrize(("signature", "tile", "smem"), SM90_TRAITS_SMEM)
def test_sm90_instances_assert_the_traits_layout(
    signature: FwdSignature | BwdSignature, tile: tuple[int, int, int, int], smem: int
) -> None:
    tile_m, tile_n, warps, stages = tile
    algorithm = Algorithm(
        "sm_90a", "sm90_tma_wgmma", tile_m, tile_n, signature.hdim_q, warps, stages
    )
    config = KernelConfig(signature, algorithm)
    assert rules.check(config, SPECS["sm_90a"]) == []
    assert _assertions(emit.render_instance(config), config)["kSmemBytes"][0] == str(smem)


def test_a_number_the_traits_disagree_with_stops_the_compile(tmp_path: Path) -> None:
    """An instance whose shared-memory number is one byte off fails to compile naming the
    disagreement, and only it: the front end checked the instance's other numbers and found
    them equal to the traits'."""
    skip_without_jit_toolchain()
    config = KernelConfig(
        FwdSignature("fp16", "batch", 64, 64, "none", True),
        Algorithm("sm_80", "sm80_cpasync_mma", 64, 64, 64, 4, 1),
    )
    text = emit.render_instance(config)
    smem = _assertions(text, config)["kSmemBytes"][0]
    wrong = f"Traits::kSmemBytes == {smem},"
    assert text.count(wrong) == 1
    source = tmp_path / "instance.cu"
    source.write_text(text.replace(wrong, f"Traits::kSmemBytes == {int(smem) + 1},"))
    toolchain = CudaToolchain(build.arch_specs_for(["sm_80"]), [REPO_ROOT / "cpp" / "include"])
    job = CompileJob(source, tmp_path / "instance.o", "sm_80")
    command = toolchain.compile_command(job, tmp_path / "instance.d")
    result = subprocess.run(command, check=False, capture_output=True, text=True)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    disagreements = set(re.findall(r"and (\w+::\w+) disagree on", output))
    assert disagreements == {"FwdSm80Traits::kSmemBytes"}, output
    assert "generator/rules/sm80_fwd.py" in output, output
