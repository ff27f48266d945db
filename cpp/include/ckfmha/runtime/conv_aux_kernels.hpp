// The small passes the convolution plans run around their main kernels: the
// forward plan's packed filter (conv_packed_filter.cu), the backward-data
// plan's filter rearrangement (conv_phase_filters.cu) and the zeros of
// positions no filter tap reaches, and the backward-weight plan's fp32
// partial sums (zeroed before, converted after). Each returns 0 or the negated cudaError_t of its launch, as kernel
// launchers do.
#pragma once

#include "ckfmha/ckfmha.h"

#include <cstdint>

namespace ckfmha::runtime {

// One stride phase's filter for the backward-data plan, in the forward
// kernels' layout with the channel roles swapped:
//   dst[g][c][i0][i1][i2][k] = w[g][k][first_0 - step_0 * i0]...[c],
// for i_d < taps_d. All arrays are 3D-form (leading unit dims for 2D).
struct ConvPhaseFilter {
  const void* w;  // [groups, out_channels, filter..., in_channels]
  void* dst;
  int32_t groups;
  int32_t in_channels;
  int32_t out_channels;
  int32_t filter[3];
  int32_t taps[3];   // taps of the phase per dim
  int32_t first[3];  // the filter index of the phase's tap 0 (its largest)
  int32_t step[3];   // filter index distance of consecutive taps
  // Groups written as one (conv_tma_pack): dst holds groups / pack groups of
  // pack x in_channels by pack x out_channels, group p's block on the
  // diagonal and zeros elsewhere.
  int32_t pack;
};
// Every phase's filter of one plan (`count` of them, the same groups and
// channels): one launch per kConvPhaseFiltersPerLaunch phases.
constexpr int kConvPhaseFiltersPerLaunch = 8;
int launch_conv_phase_filters(ConvPhaseFilter const* filters, int count, ckfmha_stream_t stream);

// The forward plan's packed filter (conv_fwd_plan.hpp): `pack` consecutive
// groups of w (dense [groups, K, taps, C]) as one block-diagonal group of
// pack x K by pack x C channels,
//   dst[q][m * K + k][tap][n * C + c] = m == n ? w[q * pack + m][k][tap][c] : 0,
// for the groups / pack packed groups q.
struct ConvPackedFilter {
  const void* w;
  void* dst;
  int32_t groups;
  int32_t in_channels;   // C, per group of w
  int32_t out_channels;  // K
  int64_t taps;
  int32_t pack;
};
int launch_conv_packed_filter(ConvPackedFilter const& filter, ckfmha_stream_t stream);

// Zeros of 2-byte elements at base + n * stride[0] + i * stride[1] + j *
// stride[2] + l * stride[3] + e, for extents (batch, d, h, w) and `row`
// contiguous elements.
struct ConvZeroFill {
  void* base;
  int64_t extent[4];
  int64_t stride[4];
  int64_t row;
};
int launch_conv_zero_fill(ConvZeroFill const& z, ckfmha_stream_t stream);

int zero_fp32(float* data, int64_t count, ckfmha_stream_t stream);
// dw = the fp32 sums in dtype (fp16 or bf16), `count` elements.
int launch_conv_convert_weights(float const* sums, void* dw, ckfmha_dtype dtype, int64_t count,
                                ckfmha_stream_t stream);

}  // namespace ckfmha::runtime
