// What a convolution kernel reads from the runtime's problem: sizes in the
// 3D form every instance uses (a 2D problem is one of depth 1: input, filter,
// stride, dilation 1 and padding 0 in d) and 64-bit element strides.
#pragma once

#include <cstdint>

namespace ckfmha::kernel {

struct ConvFwdParams {
  const void* x;  // [batch, d, h, w, groups, in_channels]
  const void* w;  // [groups, out_channels, z, y, x, in_channels], dense
  void* y;        // [batch, od, oh, ow, groups, out_channels]
  int32_t batch;
  int32_t groups;
  int32_t in_channels;
  int32_t out_channels;
  int32_t input[3];  // (d, h, w)
  int32_t filter[3];
  int32_t stride[3];
  int32_t padding[3];
  int32_t dilation[3];
  int32_t output[3];
  int64_t x_stride[4];  // (batch, d, h, w); group stride in_channels, channel 1
  int64_t y_stride[4];  // (batch, d, h, w); group stride out_channels, channel 1
  // The implicit GEMM per group: rows are output positions (batch * od * oh *
  // ow), columns output channels, the reduction filter taps times channels.
  int64_t rows;
  int32_t reduction;
  // 1: adjacent output channels may be stored as one 4-byte pair (y 4-byte
  // aligned, its strides and out_channels even).
  int32_t paired_stores;
};

// Backward-weight: the forward problem's geometry, with y holding dy (read)
// and w the gradient dw (written). A plan that splits the reduction over
// positions adds each CTA's partial sums into `accum`, fp32 in w's layout
// ([groups, out_channels, reduction], zeroed first), and a later pass
// converts it; with one split the CTAs store dw directly.
struct ConvBwdWeightParams {
  ConvFwdParams conv;
  float* accum;  // null: store into conv.w
  int64_t tiles_per_split;  // k-tiles of positions each split reduces
  // 1: adjacent reduction elements of dw may be stored as one 4-byte pair.
  int32_t paired_stores;
};

// What the runtime hands a backward-weight launcher as its `args`.
struct ConvBwdWeightLaunch {
  const void* x;
  const void* dy;
  void* dw;
  float* accum;    // null for one split
  int32_t splits;  // of the reduction over positions, >= 1
};

}  // namespace ckfmha::kernel
