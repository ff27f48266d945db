"""Validation: why a kernel config cannot be built for an arch.

Each reason names what was wrong and what is supported, because these strings are shown to
users (`python -m generator --explain`, the manifest) who must decide what to change.

common.py holds the rules every template shares; each kernel template has a module of its own
limits, which also says what its instances assert against the template's C++ traits
(traits_assertions.py): sm80_fwd (with splitkv_paged for the split-KV and paged families),
sm90_fwd, simt_fwd, splitkv_combine, appendkv, sm80_bwd, bwd_rowwise, sm90_bwd, conv (the
grouped convolution on the sm80 path and, with wgmma, on sm_90a, and its direct CUDA-core
template for groups of few channels), conv_tma (the forward fed by the copy engine's im2col
mode), conv_bwd_weight (the convolution's weight gradient on
the sm80 path), conv_bwd_weight_sm90 (the weight gradient on wgmma), conv_bwd_weight_tma (the
weight gradient fed by the copy engine) and conv_bwd_weight_direct
(the weight gradient's direct CUDA-core template).
"""

from __future__ import annotations

from collections.abc import Callable

from ..signature import (
    BWD_DQ_DK_DV,
    BWD_ROWWISE_FAMILIES,
    CONV_BWD_WEIGHT,
    CONV_FWD,
    KernelConfig,
)
from ..specs import ArchSpec
from . import (
    appendkv,
    bwd_rowwise,
    conv,
    conv_bwd_weight,
    conv_bwd_weight_direct,
    conv_bwd_weight_sm90,
    conv_bwd_weight_tma,
    conv_direct,
    conv_tma,
    simt_fwd,
    sm80_bwd,
    sm80_fwd,
    sm90_bwd,
    sm90_fwd,
    splitkv_combine,
)
from .common import ELEMENT_BYTES, Rule, TemplateRules, arch_rules
from .conv import conv_smem_bytes, conv_smem_launch_bytes, conv_warp_grid
from .pipelines import (
    CONV_DIRECT_PIPELINE,
    CONV_TMA_TEMPLATE,
    CONV_TMA_TEMPLATES,
    CONV_WEIGHT_TMA_TEMPLATE,
    FAMILY_PIPELINES,
    PIPELINE_DTYPES,
    SUPPORTED_FAMILIES,
    pipelines_for_dtype,
    pipelines_for_family,
    pipelines_for_signature,
)
from .simt_fwd import simt_smem_bytes
from .sm80_bwd import bwd_sm80_smem_bytes, squarest_warps_m
from .sm90_bwd import bwd_sm90_smem_bytes
from .traits_assertions import TraitsAssertion

__all__ = [
    "CONV_DIRECT_PIPELINE",
    "CONV_TMA_TEMPLATE",
    "CONV_TMA_TEMPLATES",
    "CONV_WEIGHT_TMA_TEMPLATE",
    "ELEMENT_BYTES",
    "FAMILY_PIPELINES",
    "PIPELINE_DTYPES",
    "PIPELINE_TEMPLATES",
    "SUPPORTED_FAMILIES",
    "Rule",
    "TraitsAssertion",
    "bias_rows_only",
    "bwd_sm80_smem_bytes",
    "bwd_sm90_smem_bytes",
    "check",
    "conv_smem_bytes",
    "conv_smem_launch_bytes",
    "conv_warp_grid",
    "pipelines_for_dtype",
    "pipelines_for_family",
    "pipelines_for_signature",
    "simt_smem_bytes",
    "squarest_warps_m",
    "traits_assertions",
]


def _sm80_template(family: str) -> TemplateRules:
    """The sm80 path's templates: forward (also split-KV and paged), the backward main stage,
    the row-wise stages, the grouped convolution and its weight gradient."""
    if family == CONV_FWD:
        return conv.TEMPLATE
    if family == CONV_BWD_WEIGHT:
        return conv_bwd_weight.TEMPLATE
    if family == BWD_DQ_DK_DV:
        return sm80_bwd.TEMPLATE
    if family in BWD_ROWWISE_FAMILIES:
        return bwd_rowwise.TEMPLATE
    return sm80_fwd.TEMPLATE


def _direct_template(family: str) -> TemplateRules:
    """The direct CUDA-core templates for groups of few channels: the forward's (which the data
    gradient runs too) and the weight gradient's."""
    if family == CONV_BWD_WEIGHT:
        return conv_bwd_weight_direct.TEMPLATE
    return conv_direct.DIRECT_TEMPLATE


def _sm90_template(family: str) -> TemplateRules:
    """The sm90 path's TMA templates: attention forward, the backward main stage, the
    convolution forward and its weight gradient."""
    if family == CONV_FWD:
        return conv_tma.TEMPLATE
    if family == CONV_BWD_WEIGHT:
        return conv_bwd_weight_tma.TEMPLATE
    return sm90_bwd.TEMPLATE if family == BWD_DQ_DK_DV else sm90_fwd.TEMPLATE


# Each pipeline's template for a family.
PIPELINE_TEMPLATES: dict[str, Callable[[str], TemplateRules]] = {
    "sm80_cpasync_mma": _sm80_template,
    "sm90_tma_wgmma": _sm90_template,
    "sm90_cpasync_wgmma": lambda family: (
        conv_bwd_weight_sm90.TEMPLATE if family == CONV_BWD_WEIGHT else conv.SM90_TEMPLATE
    ),
    CONV_DIRECT_PIPELINE: _direct_template,
    "simt_fma": lambda family: simt_fwd.TEMPLATE,
    "splitkv_combine": lambda family: splitkv_combine.TEMPLATE,
    "appendkv": lambda family: appendkv.TEMPLATE,
}


def check(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Reasons `config` cannot be built for `arch`; an empty list means it is valid."""
    reasons = arch_rules(config, arch)
    pipeline = config.algorithm.pipeline
    family = config.signature.family
    if pipeline not in PIPELINE_TEMPLATES:
        reasons.append(
            f"pipeline {pipeline!r} has no kernel template; templates exist for: "
            f"{', '.join(PIPELINE_TEMPLATES)}"
        )
        return reasons
    if family in FAMILY_PIPELINES and pipeline not in FAMILY_PIPELINES[family]:
        # arch_rules said why; this template's own rules do not apply to the family.
        return reasons
    reasons.extend(PIPELINE_TEMPLATES[pipeline](family).check(config, arch))
    return reasons


def bias_rows_only(config: KernelConfig) -> bool:
    """Whether `config`'s kernel takes only elementwise biases broadcast over the query rows
    ([b, 1 or h, 1, sk]); the runtime refuses it other biases."""
    template = PIPELINE_TEMPLATES.get(config.algorithm.pipeline)
    return template is not None and template(config.signature.family).bias_rows_only(config)


def traits_assertions(config: KernelConfig) -> tuple[TraitsAssertion, ...]:
    """What the rules assume about `config`'s template that its C++ traits define too, for its
    instance to assert; none for a pipeline without a template."""
    template = PIPELINE_TEMPLATES.get(config.algorithm.pipeline)
    if template is None:
        return ()
    return template(config.signature.family).traits_assertions(config)
