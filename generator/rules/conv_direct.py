"""Limits of the direct convolution templates: groups of few channels computed on the CUDA
cores. ConvFwdDirectTraits (the forward's, which backward-data runs too) is DIRECT_TEMPLATE;
direct_template builds the weight gradient's from its own DirectLimits
(conv_bwd_weight_direct.py)."""

from __future__ import annotations

from dataclasses import dataclass

from ..signature import CONV_FWD, CONV_MAX_CHANNELS, KernelConfig
from .common import TemplateRules
from .conv import problem_reasons
from .traits_assertions import TraitsAssertion, assertions_from

# The direct templates (ConvFwdDirectTraits; the weight gradient's is conv_bwd_weight_direct.py):
# groups of few channels on the CUDA cores. A CTA stages the input tile of 32 consecutive groups
# (one a lane) in shared memory; each warp takes one output row, a thread tile_m positions of it
# along w (`Run`). Their shared memory depends on the problem's stride, dilation and filter, so
# the runtime checks it per problem (conv_plan.cpp), not these rules.
DIRECT_GROUPS = 32
DIRECT_RUNS = (4, 8, 16)
DIRECT_WARPS = (4, 8)
# The forward's fp32 accumulators, Run positions x output channels a thread, stay in registers.
DIRECT_MAX_ACCUMULATORS = 64


@dataclass(frozen=True)
class DirectLimits:
    """What sets a family's direct template apart: its channel buckets, the fp32 values a thread
    keeps in registers per position and channel of its run (the traits' static_assert on Run x
    MaxChannels), what a CTA loads into shared memory, and the words its reasons use."""

    family: str
    template: str  # how the reasons name it
    buckets: tuple[int, ...]  # MaxChannels the traits take
    max_registers: int
    registers: str  # what the Run x MaxChannels values are
    registers_kept: str  # what a thread holds in them
    staged: str  # what a CTA loads into shared memory once
    run: str  # what kRun counts
    module: str  # the rules module the traits assertions name
    buckets_why: str = ""  # why no wider bucket, where the list does not say it


FWD_DIRECT = DirectLimits(
    CONV_FWD, "the direct conv template", CONV_MAX_CHANNELS, DIRECT_MAX_ACCUMULATORS,
    "fp32 accumulators", "Run output positions of every output channel of its group",
    "its input tile and filters", "output positions a thread computes", __name__,
)  # fmt: skip


def direct_signature_reasons(config: KernelConfig, limits: DirectLimits) -> list[str]:
    """A direct template's family, dtype, dims, one channel a load and channel bucket."""
    sig = config.signature
    reasons = problem_reasons(config, limits.family, "fp32 FMA on the CUDA cores")
    vector = getattr(sig, "vector", None)
    if vector != 1:
        reasons.append(
            f"vector={vector} is not supported by {limits.template}; it reads a group's "
            "channels one by one (vector=1)"
        )
    max_channels = getattr(sig, "max_channels", 0)
    why = f" ({limits.buckets_why})" if limits.buckets_why else ""
    if max_channels == 0:
        *narrower, widest = limits.buckets
        reasons.append(
            f"max_channels=0 (any channel count) is the implicit-GEMM templates'; "
            f"{limits.template} computes groups of at most {', '.join(map(str, narrower))} or "
            f"{widest} input and output channels{why}"
        )
    elif max_channels not in limits.buckets:
        reasons.append(
            f"max_channels={max_channels} is not supported; supported: "
            f"{', '.join(map(str, limits.buckets))} input and output channels a group{why}"
        )
    return reasons


def direct_tile_reasons(config: KernelConfig, limits: DirectLimits) -> list[str]:
    """32 groups a CTA, the bucket as the reduction step, Run, warps, one stage."""
    sig, alg = config.signature, config.algorithm
    max_channels = getattr(sig, "max_channels", 0)
    reasons: list[str] = []
    if alg.tile_n != DIRECT_GROUPS:
        reasons.append(
            f"tile_n={alg.tile_n} is not supported; {limits.template} takes "
            f"{DIRECT_GROUPS} consecutive groups a CTA, one a lane (tile_n={DIRECT_GROUPS})"
        )
    if alg.tile_k != max_channels:
        reasons.append(
            f"tile_k={alg.tile_k} does not equal max_channels={max_channels}; "
            f"{limits.template}'s reduction step is one group's input channels"
        )
    if alg.tile_m not in DIRECT_RUNS:
        reasons.append(
            f"tile_m={alg.tile_m} output positions a thread (Run) is not supported; supported: "
            f"{', '.join(map(str, DIRECT_RUNS))}"
        )
    elif max_channels in limits.buckets and alg.tile_m * max_channels > limits.max_registers:
        reasons.append(
            f"tile_m x max_channels = {alg.tile_m} x {max_channels} = "
            f"{alg.tile_m * max_channels} {limits.registers} a thread exceed "
            f"{limits.max_registers}: each thread keeps {limits.registers_kept} in registers"
        )
    if alg.warps not in DIRECT_WARPS:
        reasons.append(
            f"warps={alg.warps} is not supported; {limits.template} runs "
            f"{' or '.join(map(str, DIRECT_WARPS))} warps (one output row each)"
        )
    if alg.stages != 1:
        reasons.append(
            f"stages={alg.stages} is not supported; {limits.template} loads {limits.staged} "
            "into shared memory once (stages=1)"
        )
    if alg.ctas_per_sm != 1:
        reasons.append(
            f"ctas_per_sm={alg.ctas_per_sm} is not supported; {limits.template} has no "
            "occupancy knob (ctas_per_sm=1)"
        )
    return reasons


def direct_traits_assertions(
    config: KernelConfig, limits: DirectLimits
) -> tuple[TraitsAssertion, ...]:
    """The threads, channel bucket, run, rows and groups the rules assume, which the direct
    traits compute from the same template arguments."""
    sig, alg = config.signature, config.algorithm
    return assertions_from(
        limits.module,
        ("kThreads", alg.warps * 32, "threads per CTA"),
        ("kMaxChannels", getattr(sig, "max_channels", 0), "input and output channels a group"),
        ("kRun", alg.tile_m, limits.run),
        ("kTileH", alg.warps, "output rows a CTA computes (one a warp)"),
        ("kGroups", DIRECT_GROUPS, "groups a CTA computes"),
    )


def direct_template(limits: DirectLimits) -> TemplateRules:
    """A direct template's rules: fp16/bf16, 2D or 3D, one channel a load, its buckets, 32
    groups a CTA, Run x channels registers a thread. Every arch runs it (plain CUDA-core code)
    and shared memory is checked per problem at run time, so the arch adds no limit."""
    return TemplateRules(
        lambda config, arch: (
            direct_signature_reasons(config, limits) + direct_tile_reasons(config, limits)
        ),
        lambda config: direct_traits_assertions(config, limits),
    )


DIRECT_TEMPLATE = direct_template(FWD_DIRECT)
