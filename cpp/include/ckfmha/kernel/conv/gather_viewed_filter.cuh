// The gathering loader with the filter read through the problem's filter
// view (ConvFilterView, conv_params.h) instead of a dense w: backward-data's
// phases then read the forward's filter in place, channel roles swapped and
// taps flipped, with no rearranged copy written first (a launch of its own
// before every batch-1 ResNeXt layer's convolution, NOTES 130).
//
// In the view the phase's output channels (w's input channels) are the
// contiguous ones, so a 16-byte vector runs along the tile's N, not along the
// reduction as in ConvTileLoader: B is stored MN-major (the traits'
// SmemLayoutB) and each thread owns one vector column of N and every
// kKStep-th reduction row. x is gathered as ConvTileLoader does.
#pragma once

#include "ckfmha/kernel/conv/gather.cuh"
#include "ckfmha/kernel/params/conv_params.h"

#include <cute/tensor.hpp>

#include <cstdint>

namespace ckfmha::kernel {

template <class Element, int SpatialDims, int Vector, int TileM, int TileN, int TileK,
          int Threads, class SmemLayoutA, class SmemLayoutB>
struct ConvViewedFilterTileLoader
    : ConvTileLoader<Element, SpatialDims, Vector, TileM, TileN, TileK, Threads, SmemLayoutA,
                     SmemLayoutB> {
  using Base = ConvTileLoader<Element, SpatialDims, Vector, TileM, TileN, TileK, Threads,
                              SmemLayoutA, SmemLayoutB>;
  static_assert(Vector == 8, "16-byte runs of the view's contiguous channels");
  static constexpr int kVectorsN = TileN / Vector;  // vectors along one reduction row of B
  static_assert(Threads % kVectorsN == 0, "threads cover whole reduction rows of B");
  static constexpr int kKStep = Threads / kVectorsN;
  static constexpr int kLoadsK = (TileK + kKStep - 1) / kKStep;
  // Rows kKStep apart then sit whole swizzle atoms (8 rows) apart: one
  // shared-memory distance between a thread's rows.
  static_assert(kKStep % 8 == 0, "a thread's rows whole swizzle atoms apart");

  // This thread's vector of output channels at (tap 0, channel 0) of the
  // view; its rows add their channel's and taps' offsets.
  const Element* w_column;
  bool w_column_real;  // its channels exist (out_channels is a multiple of 8)
  // Whether the last of this thread's reduction rows is inside the tile.
  bool w_last_in_tile;
  // Each row's place in the reduction: channel (w's output channel) and
  // filter tap (z, y, x), carried as the loader's column is.
  int32_t w_channel[kLoadsK];
  int32_t w_tap[kLoadsK][3];
  uint32_t w_smem;       // shared address of the first row in stage 0
  uint32_t w_row_bytes;  // from one of its rows to the next

  // w_group: w at the group's first element of the view (first included).
  __device__ __forceinline__ ConvViewedFilterTileLoader(
      ConvFwdParams const& p, ConvRow const* rows_, const Element* x_group_,
      const Element* w_group_, int32_t first_channel_, int thread, Element* smem_a_,
      Element* smem_b_)
      : Base(p, rows_, x_group_, w_group_, first_channel_, thread, smem_a_, smem_b_) {
    const int n = (thread % kVectorsN) * Vector;
    const int first_k = thread / kVectorsN;
    const int32_t out_channel = first_channel_ + n;
    w_column_real = out_channel < p.out_channels;
    w_column = w_group_ + out_channel;  // the view's output channels are one apart
    w_last_in_tile = first_k + (kLoadsK - 1) * kKStep < TileK;
    auto sB = this->stages_b();
    w_smem = cute::cast_smem_ptr_to_uint(&sB(n, cute::min(first_k, TileK - 1), 0));
    w_row_bytes = uint32_t(cute::cast_smem_ptr_to_uint(&sB(0, int(kKStep), 0)) -
                           cute::cast_smem_ptr_to_uint(&sB(0, 0, 0)));
    CUTE_UNROLL
    for (int i = 0; i < kLoadsK; ++i) {
      w_channel[i] = first_k + i * kKStep;
      w_tap[i][0] = w_tap[i][1] = w_tap[i][2] = 0;
      carry(p, i);
    }
  }

  // Whole channel counts of row i's channel into its tap, the fastest-moving
  // filter dim last; past the reduction's end the tap along z leaves the
  // filter.
  __device__ __forceinline__ void carry(ConvFwdParams const& p, int i) {
    if (w_channel[i] < p.in_channels) return;
    const int32_t taps = w_channel[i] / p.in_channels;
    w_channel[i] -= taps * p.in_channels;
    int32_t* tap = w_tap[i];
    tap[2] += taps;
    if (tap[2] >= p.filter[2]) {
      tap[1] += tap[2] / p.filter[2];
      tap[2] %= p.filter[2];
      if (tap[1] >= p.filter[1]) {
        tap[0] += tap[1] / p.filter[1];
        tap[1] %= p.filter[1];
      }
    }
  }

  // The next k-tile into `stage`.
  __device__ __forceinline__ void operator()(ConvFwdParams const& p, int stage) {
    using conv_detail::copy_or_zero;
    this->load_a(p, stage, this->k < p.reduction);
    ConvFilterView const& v = p.filter_view;
    CUTE_UNROLL
    for (int i = 0; i < kLoadsK; ++i) {
      if (i + 1 < kLoadsK || w_last_in_tile) {
        const int32_t* tap = w_tap[i];
        const bool valid = w_column_real && tap[0] < p.filter[0];
        const int64_t offset = int64_t(w_channel[i]) * v.in_channel + tap[0] * v.tap[0] +
                               tap[1] * v.tap[1] + tap[2] * v.tap[2];
        copy_or_zero<16>(w_smem + i * w_row_bytes + stage * this->b_stage_bytes,
                         valid ? w_column + offset : this->any_address, valid);
        w_channel[i] += TileK;
        carry(p, i);
      }
    }
    this->advance(p);
  }
};

}  // namespace ckfmha::kernel
