// The gathering loader with the filter read through the problem's filter
// view (ConvFilterView, conv_params.h) instead of a dense w: backward-data's
// phases then read the forward's filter in place, channel roles swapped and
// taps flipped, with no rearranged copy written first (a launch of its own
// before every batch-1 ResNeXt layer's convolution, NOTES 130).
//
// In the view the phase's output channels (w's input channels) are the
// contiguous ones, so a 16-byte vector runs along the tile's N, not along the
// reduction as in ConvTileLoader: B is stored MN-major (the traits'
// SmemLayoutB). Each thread owns one reduction row of B and every
// kThreadsPerRow-th vector of it, so that its vectors share one (channel,
// tap) and one carry a tile, as the loader's x column does. A thread that
// owned one vector column and several rows instead carried each row through
// run-time divisions: 4 rows a thread ran ResNeXt's batch-1 layers 1.1-1.5x
// slower than the rearranged copy on 64- and 128-wide tiles (NOTES 130).
// x is gathered as ConvTileLoader does.
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
  // The most threads a row that divide its vectors, all rows loaded at once
  // (12 warps of 64-channel steps: 4 a row, 256 of the 384 threads).
  static constexpr int threads_per_row() {
    int most = cute::min(kVectorsN, Threads / TileK);
    while (kVectorsN % most != 0) --most;
    return most;
  }
  static constexpr int kThreadsPerRow = threads_per_row();
  static_assert(kThreadsPerRow >= 1, "a thread for every reduction row of B");
  static constexpr int kVectorsPerThread = kVectorsN / kThreadsPerRow;
  static constexpr int kRowThreads = TileK * kThreadsPerRow;  // the threads that load B

  // This thread's row of the tile and the view's place of it: w's output
  // channel and filter tap (z, y, x), carried as the loader's column is.
  bool w_loads;  // the thread owns a row (threads past kRowThreads do not)
  int32_t w_channel;
  int32_t w_tap[3];
  // Its first vector of output channels at (tap 0, channel 0) of the view
  // (vector j is j * kThreadsPerRow vectors further), how many of its vectors
  // lie inside the out channels, and their shared addresses in stage 0.
  const Element* w_column;
  int32_t w_real;
  uint32_t w_smem[kVectorsPerThread];

  // w_group: w at the group's first element of the view (first included).
  __device__ __forceinline__ ConvViewedFilterTileLoader(
      ConvFwdParams const& p, ConvRow const* rows_, const Element* x_group_,
      const Element* w_group_, int32_t first_channel_, int thread, Element* smem_a_,
      Element* smem_b_)
      : Base(p, rows_, x_group_, w_group_, first_channel_, thread, smem_a_, smem_b_) {
    w_loads = thread < kRowThreads;
    const int row = cute::min(thread / kThreadsPerRow, TileK - 1);
    const int slot = thread % kThreadsPerRow;
    auto sB = this->stages_b();
    const int32_t out_channel = first_channel_ + slot * Vector;
    w_column = w_group_ + out_channel;  // the view's output channels are one apart
    // Vectors at out_channel + j * kThreadsPerRow * Vector for j < w_real.
    constexpr int kStride = kThreadsPerRow * Vector;
    w_real = cute::max(0, (p.out_channels - out_channel + kStride - 1) / kStride);
    CUTE_UNROLL
    for (int j = 0; j < kVectorsPerThread; ++j) {
      w_smem[j] = cute::cast_smem_ptr_to_uint(&sB((slot + j * kThreadsPerRow) * Vector, row, 0));
    }
    w_channel = row;
    w_tap[0] = w_tap[1] = w_tap[2] = 0;
    conv_detail::carry_into_taps(p, w_channel, w_tap);
  }

  // The next k-tile into `stage`.
  __device__ __forceinline__ void operator()(ConvFwdParams const& p, int stage) {
    using conv_detail::copy_or_zero;
    this->load_a(p, stage, this->k < p.reduction);
    if (w_loads) {
      ConvFilterView const& v = p.filter_view;
      const bool k_valid = w_tap[0] < p.filter[0];
      const int64_t offset = int64_t(w_channel) * v.in_channel + w_tap[0] * v.tap[0] +
                             w_tap[1] * v.tap[1] + w_tap[2] * v.tap[2];
      CUTE_UNROLL
      for (int j = 0; j < kVectorsPerThread; ++j) {
        const bool valid = k_valid && j < w_real;
        copy_or_zero<16>(w_smem[j] + stage * this->b_stage_bytes,
                         valid ? w_column + offset + j * kThreadsPerRow * Vector
                               : this->any_address,
                         valid);
      }
      w_channel += TileK;
      conv_detail::carry_into_taps(p, w_channel, w_tap);
    }
    this->advance(p);
  }
};

}  // namespace ckfmha::kernel
