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

}  // namespace ckfmha::kernel
