// The backward-weight kernel's operand gathers: per k-tile of positions, dy's
// output channels (A, channel-major) and x's filter-tap channels (B,
// channel-major) into shared-memory stages by cp.async. A thread owns one
// vector column of each operand for the whole reduction, so its channel, its
// filter tap and that tap's offset in x are worked out once; the rows
// (positions) of each tile come from the CTA's position table, which holds
// each position's offset in x of its tap 0 (fill_positions), so that the
// many threads reading a row add, not multiply.
#pragma once

#include "ckfmha/kernel/conv/gather.cuh"
#include "ckfmha/kernel/params/conv_params.h"

#include <cute/tensor.hpp>

#include <cstdint>
#include <climits>

namespace ckfmha::kernel {

namespace conv_detail {

// The table of `Count` positions from `first`: batch offset plus tap 0's
// offset in x (x_base), dy's offset (y_base, -1 past the end) and tap 0's
// coordinates. Positions split into their image and coordinates by 32-bit
// divisions where the positions and the image allow (a 64-bit division costs
// several times more, and the table of every k-tile is decoded anew).
template <int SpatialDims, int Count, int Threads>
__device__ __forceinline__ void fill_positions(ConvFwdParams const& p, int64_t first,
                                               ConvRow* rows) {
  const int64_t plane = int64_t(p.output[0]) * p.output[1] * p.output[2];
  // Images of 2^32 positions or more (3D volumes) decode in 64 bits throughout.
  const bool narrow = plane <= int64_t(UINT32_MAX);
  const bool few = p.rows <= int64_t(UINT32_MAX);
  for (int r = threadIdx.x; r < Count; r += Threads) {
    const int64_t m = first + r;
    ConvRow row;
    row.unused = 0;
    if (m < p.rows) {
      const int64_t image = few ? int64_t(uint32_t(m) / uint32_t(plane)) : m / plane;
      int64_t rest = m - image * plane;
      int32_t position[3];
      for (int d = 2; d >= 0; --d) {
        const int64_t next = narrow ? int64_t(uint32_t(rest) / uint32_t(p.output[d]))
                                    : rest / p.output[d];
        position[d] = int32_t(rest - next * p.output[d]);
        rest = next;
      }
      row.x_base = image * p.x_stride[0];
      row.y_base = image * p.y_stride[0];
      for (int d = 0; d < 3; ++d) {
        row.first[d] = position[d] * p.stride[d] - p.padding[d];
        row.y_base += int64_t(position[d]) * p.y_stride[1 + d];
        if (d >= 3 - SpatialDims) row.x_base += int64_t(row.first[d]) * p.x_stride[1 + d];
      }
    } else {
      row.x_base = 0;
      row.y_base = -1;
      for (int d = 0; d < 3; ++d) row.first[d] = kFarOutside;
    }
    rows[r] = row;
  }
}

}  // namespace conv_detail

template <class Traits>
struct ConvBwdWeightLoader {
  using Element = typename Traits::Element;
  static constexpr int kVector = Traits::kVector;
  static constexpr int kTileK = Traits::kTileK;
  static constexpr int kThreads = Traits::kThreads;
  static constexpr int kDims = Traits::kSpatialDims;
  static constexpr int kBytes = kVector * int(sizeof(Element));
  static constexpr int kColsA = Traits::kTileM / kVector;
  static constexpr int kColsB = Traits::kTileN / kVector;
  // Tiles of at most 128 channels and at least 128 threads: every column has
  // a thread, and a thread one column of each operand.
  static_assert(kThreads % kColsA == 0 && kThreads % kColsB == 0, "threads tile the columns");
  static constexpr int kStepA = kThreads / kColsA;
  static constexpr int kStepB = kThreads / kColsB;
  static constexpr int kLoadsA = (kTileK + kStepA - 1) / kStepA;
  static constexpr int kLoadsB = (kTileK + kStepB - 1) / kStepB;

  const Element* dy_column;  // dy at offset 0 of a position: this group and output channel
  const Element* x_column;   // x at offset 0 of a tap-0 position, shifted by the tap, channel c
  const Element* any_address;
  int32_t shift[kDims];  // the tap's offset times dilation, per dim (d,) h, w
  bool a_valid;          // the output channel exists
  bool b_valid;          // the reduction column (tap, channel) exists
  uint32_t a_stage_bytes;
  uint32_t b_stage_bytes;
  int a_row0;  // the thread's first row (position) in a tile
  int b_row0;
  int a_col;  // its column (channel offset in the tile)
  int b_col;
  Element* a_smem_base;  // the stages
  Element* b_smem_base;

  __device__ __forceinline__ ConvBwdWeightLoader(ConvFwdParams const& p, int32_t group,
                                                 int32_t first_k, int32_t first_n, int thread,
                                                 Element* smem_a, Element* smem_b) {
    using cute::cast_smem_ptr_to_uint;
    auto sA = cute::make_tensor(cute::make_smem_ptr(smem_a), typename Traits::SmemLayoutA{});
    auto sB = cute::make_tensor(cute::make_smem_ptr(smem_b), typename Traits::SmemLayoutB{});
    const int col_a = (thread % kColsA) * kVector;
    const int col_b = (thread % kColsB) * kVector;
    a_row0 = thread / kColsA;
    b_row0 = thread / kColsB;
    a_stage_bytes =
        uint32_t(cast_smem_ptr_to_uint(&sA(0, 0, 1)) - cast_smem_ptr_to_uint(&sA(0, 0, 0)));
    b_stage_bytes =
        uint32_t(cast_smem_ptr_to_uint(&sB(0, 0, 1)) - cast_smem_ptr_to_uint(&sB(0, 0, 0)));
    const int32_t k = first_k + col_a;
    a_valid = k < p.out_channels;
    dy_column = static_cast<const Element*>(p.y) + int64_t(group) * p.out_channels + k;
    // The column's place in the reduction: tap-major, channel fastest.
    const int32_t n = first_n + col_b;
    b_valid = n < p.reduction;
    const int32_t channel = n % p.in_channels;
    int32_t tap = n / p.in_channels;
    int64_t offset = int64_t(group) * p.in_channels + channel;
    CUTE_UNROLL
    for (int d = kDims - 1; d >= 0; --d) {
      const int axis = 3 - kDims + d;
      shift[d] = (tap % p.filter[axis]) * p.dilation[axis];
      tap /= p.filter[axis];
      offset += int64_t(shift[d]) * p.x_stride[1 + axis];
    }
    x_column = static_cast<const Element*>(p.x) + offset;
    any_address = static_cast<const Element*>(p.x);
    a_smem_base = smem_a;
    b_smem_base = smem_b;
    a_col = col_a;
    b_col = col_b;
  }

  // The k-tile whose positions `table` describes into `stage`. Columns past
  // the channels, positions past the end and taps in the padding are zeros.
  __device__ __forceinline__ void operator()(ConvFwdParams const& p, ConvRow const* table,
                                             int stage) {
    using conv_detail::copy_or_zero;
    using cute::cast_smem_ptr_to_uint;
    auto sA = cute::make_tensor(cute::make_smem_ptr(a_smem_base), typename Traits::SmemLayoutA{});
    auto sB = cute::make_tensor(cute::make_smem_ptr(b_smem_base), typename Traits::SmemLayoutB{});
    CUTE_UNROLL
    for (int i = 0; i < kLoadsA; ++i) {
      const int row = a_row0 + i * kStepA;
      if (row < kTileK) {
        ConvRow const& pos = table[row];
        const bool valid = a_valid && pos.y_base >= 0;
        const uint32_t smem = cast_smem_ptr_to_uint(&sA(a_col, row, 0)) + stage * a_stage_bytes;
        copy_or_zero<kBytes>(smem, valid ? dy_column + pos.y_base : any_address, valid);
      }
    }
    CUTE_UNROLL
    for (int i = 0; i < kLoadsB; ++i) {
      const int row = b_row0 + i * kStepB;
      if (row < kTileK) {
        ConvRow const& pos = table[row];
        bool valid = b_valid && pos.y_base >= 0;
        CUTE_UNROLL
        for (int d = 0; d < kDims; ++d) {
          const int axis = 3 - kDims + d;
          valid = valid && uint32_t(pos.first[axis] + shift[d]) < uint32_t(p.input[axis]);
        }
        const uint32_t smem = cast_smem_ptr_to_uint(&sB(b_col, row, 0)) + stage * b_stage_bytes;
        copy_or_zero<kBytes>(smem, valid ? x_column + pos.x_base : any_address, valid);
      }
    }
  }
};

}  // namespace ckfmha::kernel
