// The direct convolution kernels' input tile: its extent for a problem (the
// launch sizes shared memory by it at run time) and its staging into shared
// memory.
#pragma once

#include "ckfmha/kernel/params/conv_params.h"

#include <cstdint>

namespace ckfmha::kernel {

namespace conv_detail {

// Shared-memory footprint of a CTA for a problem (the launcher sizes it at
// run time: the input tile depends on stride, dilation and filter).
struct DirectTile {
  int32_t in_d, in_h, in_w;  // the input tile the CTA's outputs read
  int32_t channels;          // input channels of the CTA's groups: kGroups x C
  int32_t x_elems;           // input tile elements, in the input's dtype
  int32_t w_elems;           // filter values of the CTA's groups, fp32
  // The input tile's bytes rounded up to 16, then the filters'.
  __host__ __device__ int64_t x_bytes() const { return (int64_t(x_elems) * 2 + 15) / 16 * 16; }
  __host__ __device__ int64_t bytes() const { return x_bytes() + int64_t(w_elems) * 4; }
};

template <class Traits>
__host__ __device__ inline DirectTile direct_tile(ConvFwdParams const& p) {
  DirectTile t;
  t.in_d = (p.filter[0] - 1) * p.dilation[0] + 1;
  t.in_h = (Traits::kTileH - 1) * p.stride[1] + (p.filter[1] - 1) * p.dilation[1] + 1;
  t.in_w = (Traits::kTileW - 1) * p.stride[2] + (p.filter[2] - 1) * p.dilation[2] + 1;
  t.channels = Traits::kGroups * p.in_channels;
  t.x_elems = t.in_d * t.in_h * t.in_w * t.channels;
  t.w_elems = Traits::kGroups * p.out_channels * p.filter[0] * p.filter[1] * p.filter[2] *
              p.in_channels;
  return t;
}

// Filters up to this wide along w, at unit stride and dilation there, read
// each staged row once: a window of Run + X - 1 inputs serves every filter
// column.
constexpr int kDirectWindowTaps = 7;

__host__ __device__ inline bool direct_windowed(ConvFwdParams const& p) {
  return p.stride[2] == 1 && p.dilation[2] == 1 && p.filter[2] <= kDirectWindowTaps;
}

// `count` staged inputs of one channel along a row, `step` elements apart
// (from x, the first one's address in the tile), as floats; zeros past count.
template <int N, class Element>
__device__ __forceinline__ void load_staged_run(const Element* x, int count, int step,
                                                float (&out)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = i < count ? float(x[i * step]) : 0.f;
}

// Stages the input tile a CTA's outputs read, for its 32 groups, as
// [position][channel][group] (consecutive groups in consecutive words, as the
// lanes read them), zeros in the padding and past the last group. od, tile_h
// and tile_w: the CTA's output tile; n its batch. The forward and the
// backward-weight direct kernels read x through it.
template <class Traits>
__device__ __forceinline__ void stage_input_tile(ConvFwdParams const& p, DirectTile const& tile,
                                                 int od, int tile_h, int tile_w, int group0,
                                                 int n, int groups_here,
                                                 typename Traits::Element* xs) {
  using Element = typename Traits::Element;
  constexpr int kMax = Traits::kMaxChannels;
  constexpr int kGroups = Traits::kGroups;
  const int C = p.in_channels;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int first_d = od * p.stride[0] - p.padding[0];
  const int first_h = tile_h * Traits::kTileH * p.stride[1] - p.padding[1];
  const int first_w = tile_w * Traits::kTileW * p.stride[2] - p.padding[2];
  const Element* x = static_cast<const Element*>(p.x) + n * p.x_stride[0] + int64_t(group0) * C;
  // A warp takes rows of the tile (no division per position: ncu found the
  // depthwise kernel issue-bound, the per-position decode its largest part)
  // and issues eight positions' loads before storing any, so that it waits
  // for memory once per eight positions.
  constexpr int kWarps = Traits::kThreads / 32;
  constexpr int kBatch = 8;
  const int rows_total = tile.in_d * tile.in_h;
  for (int r = warp; r < rows_total; r += kWarps) {
    const int ih = r % tile.in_h;
    const int gd = first_d + r / tile.in_h, gh = first_h + ih;
    const bool row_inside = lane < groups_here && uint32_t(gd) < uint32_t(p.input[0]) &&
                            uint32_t(gh) < uint32_t(p.input[1]);
    const Element* src_row = x + gd * p.x_stride[1] + gh * p.x_stride[2] + lane * C;
    Element* dst_row = xs + r * tile.in_w * tile.channels + lane;
    for (int iw0 = 0; iw0 < tile.in_w; iw0 += kBatch) {
      Element values[kBatch][kMax];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int gw = first_w + iw0 + b;
        const bool inside =
            row_inside && iw0 + b < tile.in_w && uint32_t(gw) < uint32_t(p.input[2]);
#pragma unroll
        for (int c = 0; c < kMax; ++c) {
          values[b][c] = inside && c < C ? src_row[gw * p.x_stride[3] + c] : Element(0.f);
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (iw0 + b < tile.in_w) {
#pragma unroll
          for (int c = 0; c < kMax; ++c) {
            if (c < C) dst_row[(iw0 + b) * tile.channels + c * kGroups] = values[b][c];
          }
        }
      }
    }
  }
}

}  // namespace conv_detail

}  // namespace ckfmha::kernel
