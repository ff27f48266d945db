// Grouped convolution forward for groups of few channels (depthwise, and up
// to 16 input and output channels a group), computed directly on the CUDA
// cores. An implicit GEMM would pad each group's tiny product to a tensor-core
// tile and gather a few bytes per row; here a CTA stages an input tile of
// 32 consecutive groups (their channels are contiguous in NHWGC) and their
// filters in shared memory, and each thread computes a run of output
// positions of one output row for all output channels of one group: a loaded
// input value serves every output channel of its group, a loaded weight every
// position of the run.
#pragma once

#include "ckfmha/kernel/conv/direct_tile.cuh"
#include "ckfmha/kernel/conv/filter_view.cuh"
#include "ckfmha/kernel/params/conv_params.h"

#include <cute/tensor.hpp>

#include <cstdint>

namespace ckfmha::kernel {

template <class Element_, int SpatialDims, int MaxChannels, int Run, int Warps>
struct ConvFwdDirectTraits {
  using Element = Element_;
  static constexpr int kSpatialDims = SpatialDims;
  // Input and output channels a group may have (each at most this).
  static constexpr int kMaxChannels = MaxChannels;
  static_assert(MaxChannels == 1 || MaxChannels == 2 || MaxChannels == 4 || MaxChannels == 8 ||
                    MaxChannels == 16,
                "1, 2, 4, 8 or 16 channels a group");
  // Output positions along w a thread computes, and so the tile's width.
  static constexpr int kRun = Run;
  static constexpr int kTileW = Run;
  // One output row per warp; its lanes take consecutive groups.
  static constexpr int kTileH = Warps;
  static constexpr int kGroups = 32;
  static constexpr int kThreads = Warps * 32;
  static_assert(Run * MaxChannels <= 64, "a thread's accumulators: run x output channels <= 64");
};


// Grid: x = output tiles of (od, oh / TileH, ow / TileW), y = blocks of 32
// groups, z = batch.
template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads)
    conv_fwd_direct_kernel(ConvFwdParams const __grid_constant__ p) {
  using Element = typename Traits::Element;
  constexpr int kRun = Traits::kRun;
  constexpr int kMax = Traits::kMaxChannels;
  constexpr int kGroups = Traits::kGroups;
  extern __shared__ __align__(16) char smem[];
  const conv_detail::DirectTile tile = conv_detail::direct_tile<Traits>(p);
  Element* xs = reinterpret_cast<Element*>(smem);  // [in_d][in_h][in_w][C][kGroups]
  float* ws = reinterpret_cast<float*>(smem + tile.x_bytes());  // [K][taps][C][kGroups]

  const int tiles_w = (p.output[2] + Traits::kTileW - 1) / Traits::kTileW;
  const int tiles_h = (p.output[1] + Traits::kTileH - 1) / Traits::kTileH;
  int rest = blockIdx.x;
  const int tile_w = rest % tiles_w;
  rest /= tiles_w;
  const int tile_h = rest % tiles_h;
  const int od = rest / tiles_h;
  const int group0 = blockIdx.y * kGroups;
  const int n = blockIdx.z;
  const int C = p.in_channels;
  const int K = p.out_channels;
  const int taps = p.filter[0] * p.filter[1] * p.filter[2];
  const int groups_here = min(kGroups, p.groups - group0);

  // The input tile as [position][channel][group] (consecutive groups in
  // consecutive words, as the lanes read them), zeros in the padding and past
  // the last group.
  conv_detail::stage_input_tile<Traits>(p, tile, od, tile_h, tile_w, group0, n, groups_here, xs);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  // The filters as [k][tap][c][group]: a warp walks a range of (k, tap)
  // pairs of the view (dense, or backward-data's transposed and flipped one),
  // its lanes the groups.
  {
    ConvFilterView const& v = p.filter_view;
    const Element* w = static_cast<const Element*>(p.w) + (group0 + lane) * v.group;
    int32_t begin, end;
    conv_detail::viewed_range(K * taps, warp, Traits::kThreads / 32, &begin, &end);
    conv_detail::walk_viewed_taps(p, begin, end, [&](int32_t pair, int32_t k, int64_t offset) {
      offset += k * v.out_channel;
#pragma unroll
      for (int c = 0; c < kMax; ++c) {
        if (c < C) {
          ws[(pair * C + c) * kGroups + lane] =
              lane < groups_here ? float(w[offset + c * v.in_channel]) : 0.f;
        }
      }
    });
  }
  __syncthreads();

  const int row = warp;
  const int oh = tile_h * Traits::kTileH + row;
  const int ow0 = tile_w * Traits::kTileW;
  if (lane >= groups_here || oh >= p.output[1]) return;

  float acc[kRun][kMax];
  for (int j = 0; j < kRun; ++j)
    for (int k = 0; k < kMax; ++k) acc[j][k] = 0.f;

  const int row_stride = tile.in_w * tile.channels;
  const int plane_stride = tile.in_h * row_stride;
  // Unit stride and dilation along w (most layers): a row's inputs for all
  // its filter columns are one window of Run + X - 1 values, loaded once
  // and reused by every filter column (filters up to kWindowTaps wide).
  constexpr int kWindowTaps = conv_detail::kDirectWindowTaps;
  const bool windowed = conv_detail::direct_windowed(p);
  int tap = 0;
  for (int fz = 0; fz < p.filter[0]; ++fz) {
    for (int fy = 0; fy < p.filter[1]; ++fy) {
      const Element* x_row = xs + fz * p.dilation[0] * plane_stride +
                             (row * p.stride[1] + fy * p.dilation[1]) * row_stride + lane;
      if (windowed) {
#pragma unroll
        for (int c = 0; c < kMax; ++c) {
          if (c < C) {
            float window[kRun + kWindowTaps - 1];
            const int count = kRun + p.filter[2] - 1;
            conv_detail::load_staged_run(x_row + c * kGroups, count, tile.channels, window);
#pragma unroll
            for (int fx = 0; fx < kWindowTaps; ++fx) {
              if (fx < p.filter[2]) {
#pragma unroll
                for (int k = 0; k < kMax; ++k) {
                  if (k < K) {
                    const float weight = ws[((k * taps + tap + fx) * C + c) * kGroups + lane];
#pragma unroll
                    for (int j = 0; j < kRun; ++j) {
                      acc[j][k] = fmaf(window[j + fx], weight, acc[j][k]);
                    }
                  }
                }
              }
            }
          }
        }
        tap += p.filter[2];
        continue;
      }
      for (int fx = 0; fx < p.filter[2]; ++fx, ++tap) {
        const Element* x_tap = x_row + fx * p.dilation[2] * tile.channels;
#pragma unroll
        for (int c = 0; c < kMax; ++c) {
          if (c < C) {
            float in[kRun];
            const int step = p.stride[2] * tile.channels;
            conv_detail::load_staged_run(x_tap + c * kGroups, kRun, step, in);
#pragma unroll
            for (int k = 0; k < kMax; ++k) {
              if (k < K) {
                const float weight = ws[((k * taps + tap) * C + c) * kGroups + lane];
#pragma unroll
                for (int j = 0; j < kRun; ++j) acc[j][k] = fmaf(in[j], weight, acc[j][k]);
              }
            }
          }
        }
      }
    }
  }

  Element* y = static_cast<Element*>(p.y) + n * p.y_stride[0] + od * p.y_stride[1] +
               oh * p.y_stride[2] + int64_t(group0 + lane) * K;
#pragma unroll
  for (int j = 0; j < kRun; ++j) {
    const int ow = ow0 + j;
    if (ow < p.output[2]) {
#pragma unroll
      for (int k = 0; k < kMax; ++k) {
        if (k < K) y[ow * p.y_stride[3] + k] = Element(acc[j][k]);
      }
    }
  }
}

}  // namespace ckfmha::kernel
