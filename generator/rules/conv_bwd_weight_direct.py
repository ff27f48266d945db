"""Limits of the grouped-convolution backward-weight direct template (ConvBwdWeightDirectTraits):
groups of at most 8 channels on the CUDA cores, where the implicit GEMM would pad a group's dw
(taps x C x K values) to a 64 x 64 tile. A CTA stages the input tile of 32 consecutive groups
(one a lane) as the forward's direct kernel does; each warp takes one output row, a thread its
group's dy over a run of tile_m positions (`Run`) in registers, and adds the run's products into
the CTA's partial dw in shared memory. Every arch runs it (plain CUDA-core code). What it
shares with the forward's direct template is checked by conv_direct.py's helpers."""

from __future__ import annotations

from ..signature import CONV_BWD_WEIGHT
from .conv_direct import DirectLimits, direct_template

# MaxChannels the traits take: the CTA's partial dw in shared memory grows with taps x C x K
# (32 groups, a 3x3 filter: 72 KiB for 8-channel groups), checked per problem at run time.
BWD_WEIGHT_DIRECT_MAX_CHANNELS = (1, 2, 4, 8)
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
        "the partial dw in shared memory and the dy run in registers grow with the channels; "
        "wider groups run on the implicit-GEMM template"
    ),
)

TEMPLATE = direct_template(LIMITS)
