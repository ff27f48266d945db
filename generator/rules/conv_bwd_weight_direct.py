"""Limits of the grouped-convolution backward-weight direct template (ConvBwdWeightDirectTraits):
groups of one or two channels on the CUDA cores, where the implicit GEMM would pad a group's dw
(taps x C x K values) to a 128 x 128 tile. A CTA stages the input tile of 32 consecutive groups
(one a lane) as the forward's direct kernel does; each warp takes one output row, a thread its
group's dy over a run of tile_m positions (`Run`) in registers, and adds the run's products into
its warp's partial dw in shared memory. Every arch runs it (plain CUDA-core code). What it
shares with the forward's direct template is checked by conv.py's direct helpers."""

from __future__ import annotations

from ..signature import CONV_BWD_WEIGHT
from .conv import DirectLimits, direct_template

# MaxChannels the traits take: each warp's partial dw in shared memory grows with taps x C x K
# (a 3x3 filter over 8 warps of 32 groups: 36 KiB for 2-channel groups, 144 KiB for 4), so
# wider groups run on the implicit GEMM.
BWD_WEIGHT_DIRECT_MAX_CHANNELS = (1, 2)
# A thread's dy run, Run positions x output channels in fp32, stays in registers.
BWD_WEIGHT_DIRECT_MAX_DY = 32

LIMITS = DirectLimits(
    family=CONV_BWD_WEIGHT,
    template="the backward-weight direct template",
    buckets=BWD_WEIGHT_DIRECT_MAX_CHANNELS,
    max_registers=BWD_WEIGHT_DIRECT_MAX_DY,
    registers="fp32 dy values",
    registers_kept="its group's dy over Run output positions of every output channel",
    staged="each input tile",
    run="output positions of dy a thread sums over",
    module=__name__,
    buckets_why=(
        "each warp's partial dw in shared memory grows with taps x C x K; wider groups run on "
        "the implicit-GEMM template"
    ),
)

TEMPLATE = direct_template(LIMITS)
