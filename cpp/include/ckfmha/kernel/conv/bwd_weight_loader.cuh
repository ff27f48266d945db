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
#include "ckfmha/kernel/conv/packed_weight_divisors.cuh"
#include "ckfmha/kernel/params/conv_params.h"

#include <cute/tensor.hpp>
#include <cutlass/fast_math.h>

#include <cstdint>
#include <climits>

namespace ckfmha::kernel {

// Splits a position index into its image and output coordinates. Where the
// positions fit 31 bits, by multiplying with reciprocals the host works out
// once a launch (cutlass::FastDivmod, read from the kernel's parameters, so
// they hold no registers): each k-tile's table is decoded anew, and a
// division by a run-time divisor costs a reciprocal and some twenty dependent
// instructions, on the few warps that fill the table while the others wait.
// Larger problems (3D volumes past 2^31 positions) divide in 64 bits.
struct PositionDecoder {
  cutlass::FastDivmod plane;   // positions of one image
  cutlass::FastDivmod height;  // output rows (h)
  cutlass::FastDivmod width;   // output columns (w)
  bool fast;

  PositionDecoder() = default;

  explicit PositionDecoder(ConvFwdParams const& p) {
    const int64_t positions = int64_t(p.output[0]) * p.output[1] * p.output[2];
    // No rows at all (an empty batch): nothing is decoded, and no divisor is 0.
    fast = p.rows <= int64_t(INT32_MAX) && positions > 0;
    if (fast) {
      plane = cutlass::FastDivmod(int(positions));
      height = cutlass::FastDivmod(p.output[1]);
      width = cutlass::FastDivmod(p.output[2]);
    }
  }

  // Position m (< p.rows) as its image and (d, h, w).
  __device__ __forceinline__ int64_t operator()(ConvFwdParams const& p, int64_t m,
                                                int32_t (&position)[3]) const {
    if (fast) {
      int image, rest, rows, column, depth, row;
      plane(image, rest, int(m));
      width(rows, column, rest);
      height(depth, row, rows);
      position[0] = depth;
      position[1] = row;
      position[2] = column;
      return image;
    }
    const int64_t positions = int64_t(p.output[0]) * p.output[1] * p.output[2];
    const int64_t image = m / positions;
    int64_t rest = m - image * positions;
    for (int d = 2; d >= 0; --d) {
      const int64_t next = rest / p.output[d];
      position[d] = int32_t(rest - next * p.output[d]);
      rest = next;
    }
    return image;
  }
};

// What the implicit-GEMM backward-weight kernels take: the problem and its
// position divisors.
struct ConvBwdWeightGemmParams {
  ConvBwdWeightParams weight;
  PositionDecoder positions;
  PackedWeightDivisors packed;
};

namespace conv_detail {

// The table of `Count` positions from `first`: batch offset plus tap 0's
// offset in x (x_base), dy's offset (y_base, -1 past the end) and tap 0's
// coordinates.
template <int SpatialDims, int Count, int Threads>
__device__ __forceinline__ void fill_positions(ConvFwdParams const& p,
                                               PositionDecoder const& decode, int64_t first,
                                               ConvRow* rows) {
  for (int r = threadIdx.x; r < Count; r += Threads) {
    const int64_t m = first + r;
    ConvRow row;
    row.unused = 0;
    if (m < p.rows) {
      int32_t position[3];
      const int64_t image = decode(p, m, position);
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
  // Both layouts swizzle within atoms of 8 rows of 64 channels, so rows 8
  // apart sit the same bytes apart in every column. A thread whose rows step
  // by 4 or more keeps the shared address of its first one or two rows (one
  // of each swizzle phase) and adds constants, where working out each row's
  // swizzle costs several instructions a vector. Narrow vectors give a thread
  // many rows 1 or 2 apart: those work out each address, and keep the
  // bounds check of each row (their unrolled loads spill registers without
  // its branches).
  static constexpr bool kHeldA = kStepA >= 4;
  static constexpr bool kHeldB = kStepB >= 4;
  static constexpr int kPhasesA = kStepA >= 8 ? 1 : 2;
  static constexpr int kPhasesB = kStepB >= 8 ? 1 : 2;
  // Whether every thread's every row is inside the tile (a thread's first row
  // is below its step), so that no load needs a check.
  static constexpr bool kRowsExactA = kHeldA && kTileK % kStepA == 0;
  static constexpr bool kRowsExactB = kHeldB && kTileK % kStepB == 0;

  const Element* dy_column;  // dy at offset 0 of a position: this group and output channel
  const Element* x_column;   // x at offset 0 of a tap-0 position, shifted by the tap, channel c
  const Element* any_address;
  int32_t shift[kDims];  // the tap's offset times dilation, per dim (d,) h, w
  bool a_valid;          // the output channel exists
  bool b_valid;          // the reduction column (tap, channel) exists
  uint32_t a_stage_bytes;
  uint32_t b_stage_bytes;
  uint32_t a_smem[kPhasesA];  // byte addresses of the thread's first rows in stage 0
  uint32_t b_smem[kPhasesB];
  uint32_t a_period_bytes;  // from row i to row i + kPhases (a multiple of 8 rows)
  uint32_t b_period_bytes;
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
    if constexpr (kHeldA) {
      CUTE_UNROLL
      for (int i = 0; i < kPhasesA; ++i) {
        a_smem[i] = cast_smem_ptr_to_uint(&sA(col_a, a_row0 + i * kStepA, 0));
      }
      a_period_bytes = uint32_t(cast_smem_ptr_to_uint(&sA(0, kPhasesA * kStepA, 0)) -
                                cast_smem_ptr_to_uint(&sA(0, 0, 0)));
    }
    if constexpr (kHeldB) {
      CUTE_UNROLL
      for (int i = 0; i < kPhasesB; ++i) {
        b_smem[i] = cast_smem_ptr_to_uint(&sB(col_b, b_row0 + i * kStepB, 0));
      }
      b_period_bytes = uint32_t(cast_smem_ptr_to_uint(&sB(0, kPhasesB * kStepB, 0)) -
                                cast_smem_ptr_to_uint(&sB(0, 0, 0)));
    }
  }

  // The shared address in stage 0 of the thread's i-th row of A, `row`.
  __device__ __forceinline__ uint32_t a_address(int i, int row) const {
    if constexpr (kHeldA) return a_smem[i % kPhasesA] + (i / kPhasesA) * a_period_bytes;
    auto sA = cute::make_tensor(cute::make_smem_ptr(a_smem_base), typename Traits::SmemLayoutA{});
    return cute::cast_smem_ptr_to_uint(&sA(a_col, row, 0));
  }

  __device__ __forceinline__ uint32_t b_address(int i, int row) const {
    if constexpr (kHeldB) return b_smem[i % kPhasesB] + (i / kPhasesB) * b_period_bytes;
    auto sB = cute::make_tensor(cute::make_smem_ptr(b_smem_base), typename Traits::SmemLayoutB{});
    return cute::cast_smem_ptr_to_uint(&sB(b_col, row, 0));
  }

  // The k-tile whose positions `table` describes into `stage`. Columns past
  // the channels, positions past the end and taps in the padding are zeros.
  __device__ __forceinline__ void operator()(ConvFwdParams const& p, ConvRow const* table,
                                             int stage) {
    using conv_detail::copy_or_zero;
    CUTE_UNROLL
    for (int i = 0; i < kLoadsA; ++i) {
      const int row = a_row0 + i * kStepA;
      if (kRowsExactA || row < kTileK) {
        const int64_t y_base = table[row].y_base;
        const bool valid = a_valid && y_base >= 0;
        const uint32_t smem = a_address(i, row) + stage * a_stage_bytes;
        copy_or_zero<kBytes>(smem, valid ? dy_column + y_base : any_address, valid);
      }
    }
    CUTE_UNROLL
    for (int i = 0; i < kLoadsB; ++i) {
      const int row = b_row0 + i * kStepB;
      if (kRowsExactB || row < kTileK) {
        ConvRow const& pos = table[row];
        // Rows past the end start far outside, so the bounds checks drop them.
        bool valid = b_valid;
        CUTE_UNROLL
        for (int d = 0; d < kDims; ++d) {
          const int axis = 3 - kDims + d;
          valid = valid && uint32_t(pos.first[axis] + shift[d]) < uint32_t(p.input[axis]);
        }
        const uint32_t smem = b_address(i, row) + stage * b_stage_bytes;
        copy_or_zero<kBytes>(smem, valid ? x_column + pos.x_base : any_address, valid);
      }
    }
  }
};

}  // namespace ckfmha::kernel
