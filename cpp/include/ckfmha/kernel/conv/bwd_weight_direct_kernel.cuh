// Grouped convolution backward-weight for groups of at most 8 channels
// (depthwise, ResNeXt's first stages), on the CUDA cores. The implicit GEMM
// would pad a group's dw (taps x C x K values) to a 64 x 64 tile; here a CTA
// takes 32 consecutive groups (one a lane), stages the input tile its output
// positions read as the forward's direct kernel does, and each warp sums one
// output row: a thread holds its group's dy over a run of positions in
// registers and, per filter tap, the run's products in one register per
// (c, k), which it adds into the CTA's partial dw in shared memory (a shared
// atomic: the warps' rows share it). A CTA takes output tiles of several
// images in turn, so few partial sums leave it: at the end they are added
// into the fp32 workspace, which the runtime converts into dw.
#pragma once

#include "ckfmha/kernel/conv/direct_tile.cuh"
#include "ckfmha/kernel/params/conv_params.h"

#include <cute/tensor.hpp>

#include <cstdint>

namespace ckfmha::kernel {

template <class Element_, int SpatialDims, int MaxChannels, int Run, int Warps>
struct ConvBwdWeightDirectTraits {
  using Element = Element_;
  static constexpr int kSpatialDims = SpatialDims;
  static constexpr int kMaxChannels = MaxChannels;
  static_assert(MaxChannels == 1 || MaxChannels == 2 || MaxChannels == 4 || MaxChannels == 8,
                "1, 2, 4 or 8 channels a group");
  static constexpr int kRun = Run;  // output positions along w a thread sums
  static constexpr int kTileW = Run;
  static constexpr int kTileH = Warps;  // one output row per warp
  static constexpr int kGroups = 32;
  static constexpr int kThreads = Warps * 32;
  static_assert(Run * MaxChannels <= 32, "a thread's dy run: Run x channels <= 32 registers");
};

namespace conv_detail {

// Shared memory of a CTA: the input tile, then the partial dw of the CTA's
// groups ([k][tap][c][group], fp32), where the forward keeps its filters.
template <class Traits>
__host__ __device__ inline int64_t bwd_weight_direct_bytes(ConvFwdParams const& p) {
  return direct_tile<Traits>(p).bytes();
}

}  // namespace conv_detail

// Grid: x = workers, each taking (image, output tile) items in turn; y =
// blocks of 32 groups. p.w holds nothing; `accum` is dw in fp32, summed into.
template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads)
    conv_bwd_weight_direct_kernel(ConvBwdWeightParams const __grid_constant__ bp) {
  using Element = typename Traits::Element;
  constexpr int kRun = Traits::kRun;
  constexpr int kMax = Traits::kMaxChannels;
  constexpr int kGroups = Traits::kGroups;
  ConvFwdParams const& p = bp.conv;
  extern __shared__ __align__(16) char smem[];
  const conv_detail::DirectTile tile = conv_detail::direct_tile<Traits>(p);
  Element* xs = reinterpret_cast<Element*>(smem);
  float* partial = reinterpret_cast<float*>(smem + tile.x_bytes());

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int C = p.in_channels;
  const int K = p.out_channels;
  const int taps = p.filter[0] * p.filter[1] * p.filter[2];
  const int group0 = blockIdx.y * kGroups;
  const int groups_here = min(kGroups, p.groups - group0);
  // The partial dw: [k][tap][c][group], a word per lane.
  for (int i = threadIdx.x; i < tile.w_elems; i += Traits::kThreads) partial[i] = 0.f;

  const int tiles_w = (p.output[2] + Traits::kTileW - 1) / Traits::kTileW;
  const int tiles_h = (p.output[1] + Traits::kTileH - 1) / Traits::kTileH;
  const int64_t tiles = int64_t(tiles_w) * tiles_h * p.output[0];
  const int64_t items = tiles * p.batch;
  const int row_stride = tile.in_w * tile.channels;
  const int plane_stride = tile.in_h * row_stride;
  // Unit stride and dilation along w: a row's inputs for all filter columns
  // are one window of Run + X - 1 values (filters up to kWindowTaps wide).
  constexpr int kWindowTaps = conv_detail::kDirectWindowTaps;
  const bool windowed = conv_detail::direct_windowed(p);

  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int n = int(item / tiles);
    int64_t rest = item - int64_t(n) * tiles;
    const int tile_w = int(rest % tiles_w);
    rest /= tiles_w;
    const int tile_h = int(rest % tiles_h);
    const int od = int(rest / tiles_h);
    __syncthreads();  // the last item's reads of the input tile are done
    conv_detail::stage_input_tile<Traits>(p, tile, od, tile_h, tile_w, group0, n, groups_here,
                                          xs);
    // This thread's dy: its row, a run along w, every output channel of its
    // group; zeros past the output's edges.
    const int oh = tile_h * Traits::kTileH + warp;
    const int ow0 = tile_w * Traits::kTileW;
    float dy[kRun][kMax];
    const Element* dy_row = static_cast<const Element*>(p.y) + n * p.y_stride[0] +
                            od * p.y_stride[1] + oh * p.y_stride[2] +
                            int64_t(group0 + lane) * K;
    const bool row_inside = lane < groups_here && oh < p.output[1];
#pragma unroll
    for (int j = 0; j < kRun; ++j) {
      const bool inside = row_inside && ow0 + j < p.output[2];
#pragma unroll
      for (int k = 0; k < kMax; ++k) {
        dy[j][k] = inside && k < K ? float(dy_row[(ow0 + j) * p.y_stride[3] + k]) : 0.f;
      }
    }
    __syncthreads();  // the input tile is staged
    if (!row_inside) continue;

    int tap = 0;
    for (int fz = 0; fz < p.filter[0]; ++fz) {
      for (int fy = 0; fy < p.filter[1]; ++fy) {
        const Element* x_row = xs + fz * p.dilation[0] * plane_stride +
                               (warp * p.stride[1] + fy * p.dilation[1]) * row_stride + lane;
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
                      float sum = 0.f;
#pragma unroll
                      for (int j = 0; j < kRun; ++j) sum = fmaf(window[j + fx], dy[j][k], sum);
                      atomicAdd(&partial[((k * taps + tap + fx) * C + c) * kGroups + lane], sum);
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
                  float sum = 0.f;
#pragma unroll
                  for (int j = 0; j < kRun; ++j) sum = fmaf(in[j], dy[j][k], sum);
                  atomicAdd(&partial[((k * taps + tap) * C + c) * kGroups + lane], sum);
                }
              }
            }
          }
        }
      }
    }
  }
  __syncthreads();  // every warp's partial sums are in
  // Added into dw's fp32 sums ([group][k][tap][c]).
  const int per_group = tile.w_elems / kGroups;
  for (int i = threadIdx.x; i < tile.w_elems; i += Traits::kThreads) {
    const int g = i % kGroups;
    if (g >= groups_here) continue;
    // i / kGroups enumerates (k, tap, c) in dw's order within a group.
    atomicAdd(bp.accum + int64_t(group0 + g) * per_group + i / kGroups, partial[i]);
  }
}

}  // namespace ckfmha::kernel
