// The implicit GEMM's operand gathers and output stores, shared by the sm80
// (mma.sync) and sm90 (wgmma) convolution kernels: the CTA's table of output
// positions, predicated cp.async of x and w vectors into any shared-memory
// layout, and the store of an accumulator tile into y.
#pragma once

#include "ckfmha/kernel/params/conv_params.h"

#include <cute/tensor.hpp>

#include <cstdint>

namespace ckfmha::kernel {

// Where one implicit-GEMM row (an output position) reads and writes: offsets
// in elements of its batch and output position, and the input coordinates the
// filter's first tap reads (far out of range for rows past the end, so every
// gather of such a row is predicated off).
struct ConvRow {
  int64_t x_base;  // batch offset of x
  int64_t y_base;  // offset of y's position (group 0, channel 0); -1: past the end
  int32_t first[3];  // (d, h, w) of tap 0: position * stride - padding
  int32_t unused;
};

namespace conv_detail {

// Rows past the end start their taps here: no dilation times filter reaches
// back into range, so every bounds check of theirs fails.
constexpr int32_t kFarOutside = -(1 << 30);

// `Bytes` of global memory into shared memory at `smem_addr`, or zeros when
// `valid` is false (src-size 0: nothing is read). Two-byte vectors have no
// cp.async form and are copied through a register; the barrier that
// publishes the asynchronous copies publishes them too.
template <int Bytes>
__device__ __forceinline__ void copy_or_zero(uint32_t smem_addr, const void* gmem_src,
                                             bool valid) {
  if constexpr (Bytes == 2) {
    const uint16_t value = valid ? *static_cast<const uint16_t*>(gmem_src) : uint16_t(0);
    asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(smem_addr), "h"(value));
  } else {
    const int src_bytes = valid ? Bytes : 0;
    if constexpr (Bytes == 16) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr),
                   "l"(gmem_src), "r"(src_bytes));
    } else {
      asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_addr),
                   "l"(gmem_src), "n"(Bytes), "r"(src_bytes));
    }
  }
}

// Fills the CTA's row table: each output position's batch offset in x, its
// offset in y and the input coordinates of its first tap. `Threads` threads
// share the work, `thread` is this one's index among them.
template <int SpatialDims, int TileM, int Threads>
__device__ __forceinline__ void fill_rows(ConvFwdParams const& p, int64_t first_row,
                                          ConvRow* rows, int thread) {
  for (int r = thread; r < TileM; r += Threads) {
    const int64_t m = first_row + r;
    ConvRow row;
    row.unused = 0;
    if (m < p.rows) {
      int64_t rest = m;
      int32_t position[3];
      for (int d = 2; d >= 0; --d) {
        const int64_t next = rest / p.output[d];
        position[d] = int32_t(rest - next * p.output[d]);
        rest = next;
      }
      row.x_base = rest * p.x_stride[0];
      row.y_base = rest * p.y_stride[0];
      for (int d = 0; d < 3; ++d) {
        row.first[d] = position[d] * p.stride[d] - p.padding[d];
        row.y_base += int64_t(position[d]) * p.y_stride[1 + d];
      }
      if constexpr (SpatialDims == 2) row.first[0] = 0;
    } else {
      row.x_base = 0;
      row.y_base = -1;
      for (int d = 0; d < 3; ++d) row.first[d] = kFarOutside;
    }
    rows[r] = row;
  }
}

// Carries whole channel counts of `channel` (of the problem's in_channels)
// into the filter tap (z, y, x), the fastest-moving filter dim last; past the
// reduction's end the tap along z leaves the filter.
__device__ __forceinline__ void carry_into_taps(ConvFwdParams const& p, int32_t& channel,
                                                int32_t* tap) {
  if (channel < p.in_channels) return;
  const int32_t taps = channel / p.in_channels;
  channel -= taps * p.in_channels;
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

}  // namespace conv_detail

// Gathers k-tiles of both operands, in order, into shared-memory stages. Each
// thread owns one vector column of every tile and every kRowStep-th row. The
// column's filter tap and channel advance by TileK per tile. What depends
// only on a row (its x position, w's row, its shared-memory address) is
// worked out once and kept in registers where a thread has few rows (16-byte
// vectors), so a vector then costs two bounds checks, an add and its
// cp.async; narrower vectors give a thread more rows than registers hold, and
// read each row's entry of the CTA's table instead. Rows and channels past
// the ends, and taps in the padding, are zero-filled.
template <class Element, int SpatialDims, int Vector, int TileM, int TileN, int TileK,
          int Threads, class SmemLayoutA, class SmemLayoutB>
struct ConvTileLoader {
  static constexpr int kVectorsPerRow = TileK / Vector;
  static_assert(Threads % kVectorsPerRow == 0, "threads cover whole rows of vectors");
  static constexpr int kRowStep = Threads / kVectorsPerRow;
  static constexpr int kLoadsA = (TileM + kRowStep - 1) / kRowStep;
  static constexpr int kLoadsB = (TileN + kRowStep - 1) / kRowStep;
  static constexpr int kBytes = Vector * int(sizeof(Element));
  static constexpr bool kRowsInRegisters = kLoadsA + kLoadsB <= 16;
  static constexpr int kHeldA = kRowsInRegisters ? kLoadsA : 1;
  static constexpr int kHeldB = kRowsInRegisters ? kLoadsB : 1;

  const Element* a_row[kHeldA];  // x at this row's first tap, channel 0 of the group
  int32_t a_first[kHeldA][SpatialDims];  // that tap's input coordinates (d,) h, w
  uint32_t a_smem[kHeldA];  // shared address in stage 0
  const Element* b_row[kHeldB];  // w's row of this output channel; null past the end
  uint32_t b_smem[kHeldB];
  Element* smem_a;  // the stages, for rows not held in registers
  Element* smem_b;
  const Element* w_group;
  int32_t first_channel;
  int col;
  uint32_t a_stage_bytes;
  uint32_t b_stage_bytes;
  // Whether the last of this thread's rows is inside the tile (the others
  // always are): one past it would write another thread's row.
  bool a_last_in_tile;
  bool b_last_in_tile;
  const Element* any_address;  // the source named by copies that read nothing
  const Element* x_group;
  ConvRow const* rows;
  int first_row;
  // The column's position in the reduction: channel, filter tap and index.
  int32_t channel;
  int32_t tap[3];
  int32_t k;

  // smem_a/smem_b: the stages, laid out as SmemLayoutA (row, k, stage) and
  // SmemLayoutB (channel, k, stage); rows_: the CTA's table, already filled
  // and published.
  __device__ __forceinline__ ConvTileLoader(ConvFwdParams const& p, ConvRow const* rows_,
                                            const Element* x_group_, const Element* w_group_,
                                            int32_t first_channel_, int thread, Element* smem_a_,
                                            Element* smem_b_)
      : smem_a(smem_a_),
        smem_b(smem_b_),
        w_group(w_group_),
        first_channel(first_channel_),
        col((thread % kVectorsPerRow) * Vector),
        x_group(x_group_),
        rows(rows_),
        first_row(thread / kVectorsPerRow) {
    auto sA = stages_a();
    auto sB = stages_b();
    a_stage_bytes = uint32_t(cute::cast_smem_ptr_to_uint(&sA(0, 0, 1)) -
                             cute::cast_smem_ptr_to_uint(&sA(0, 0, 0)));
    b_stage_bytes = uint32_t(cute::cast_smem_ptr_to_uint(&sB(0, 0, 1)) -
                             cute::cast_smem_ptr_to_uint(&sB(0, 0, 0)));
    CUTE_UNROLL
    for (int i = 0; i < kHeldA; ++i) {
      const int r = cute::min(first_row + i * kRowStep, TileM - 1);
      a_smem[i] = cute::cast_smem_ptr_to_uint(&sA(r, col, 0));
      if constexpr (kRowsInRegisters) {
        ConvRow const& info = rows[r];
        int64_t offset = info.x_base;
        CUTE_UNROLL
        for (int d = 0; d < SpatialDims; ++d) {
          const int axis = 3 - SpatialDims + d;
          a_first[i][d] = info.first[axis];
          offset += int64_t(info.first[axis]) * p.x_stride[1 + axis];
        }
        a_row[i] = x_group + offset;
      }
    }
    CUTE_UNROLL
    for (int i = 0; i < kHeldB; ++i) b_row_at(p, i, sB, b_row[i], b_smem[i]);
    a_last_in_tile = first_row + (kLoadsA - 1) * kRowStep < TileM;
    b_last_in_tile = first_row + (kLoadsB - 1) * kRowStep < TileN;
    any_address = w_group;
    k = col;
    channel = col;
    tap[0] = tap[1] = tap[2] = 0;
    normalize(p);
  }

  __device__ __forceinline__ auto stages_a() const {
    return cute::make_tensor(cute::make_smem_ptr(smem_a), SmemLayoutA{});
  }
  __device__ __forceinline__ auto stages_b() const {
    return cute::make_tensor(cute::make_smem_ptr(smem_b), SmemLayoutB{});
  }

  // Load i's row of w (null past the out channels) and its shared address in stage 0.
  template <class SmemB>
  __device__ __forceinline__ void b_row_at(ConvFwdParams const& p, int i, SmemB& sB,
                                           const Element*& row, uint32_t& smem) const {
    const int r = cute::min(first_row + i * kRowStep, TileN - 1);
    const int32_t out_channel = first_channel + first_row + i * kRowStep;
    const bool real = first_row + i * kRowStep < TileN && out_channel < p.out_channels;
    row = real ? w_group + int64_t(out_channel) * p.reduction : nullptr;
    smem = cute::cast_smem_ptr_to_uint(&sB(r, col, 0));
  }

  // The column's channel carried into its filter tap.
  __device__ __forceinline__ void normalize(ConvFwdParams const& p) {
    conv_detail::carry_into_taps(p, channel, tap);
  }

  // The next k-tile into `stage`.
  __device__ __forceinline__ void operator()(ConvFwdParams const& p, int stage) {
    const bool k_valid = k < p.reduction;
    load_a(p, stage, k_valid);
    load_b(p, stage, k_valid);
    advance(p);
  }

  // The column's vectors of x for every row this thread owns; k_valid: the
  // column is inside the reduction.
  __device__ __forceinline__ void load_a(ConvFwdParams const& p, int stage, bool k_valid) {
    using conv_detail::copy_or_zero;
    int32_t shift[SpatialDims];
    int64_t tap_offset = channel;
    CUTE_UNROLL
    for (int d = 0; d < SpatialDims; ++d) {
      const int axis = 3 - SpatialDims + d;
      shift[d] = tap[axis] * p.dilation[axis];
      tap_offset += int64_t(shift[d]) * p.x_stride[1 + axis];
    }
    CUTE_UNROLL
    for (int i = 0; i < kLoadsA; ++i) {
      if (i + 1 < kLoadsA || a_last_in_tile) {
        int32_t first[SpatialDims];
        const Element* row_start;
        uint32_t smem;
        if constexpr (kRowsInRegisters) {
          CUTE_UNROLL
          for (int d = 0; d < SpatialDims; ++d) first[d] = a_first[i][d];
          row_start = a_row[i];
          smem = a_smem[i];
        } else {
          const int r = first_row + i * kRowStep;
          auto sA = stages_a();
          smem = cute::cast_smem_ptr_to_uint(&sA(r, col, 0));
          ConvRow const& info = rows[r];
          int64_t offset = info.x_base;
          CUTE_UNROLL
          for (int d = 0; d < SpatialDims; ++d) {
            const int axis = 3 - SpatialDims + d;
            first[d] = info.first[axis];
            offset += int64_t(first[d]) * p.x_stride[1 + axis];
          }
          row_start = x_group + offset;
        }
        bool valid = k_valid;
        CUTE_UNROLL
        for (int d = 0; d < SpatialDims; ++d) {
          const int axis = 3 - SpatialDims + d;
          valid = valid && uint32_t(first[d] + shift[d]) < uint32_t(p.input[axis]);
        }
        copy_or_zero<kBytes>(smem + stage * a_stage_bytes,
                             valid ? row_start + tap_offset : any_address, valid);
      }
    }
  }

  // The column's vectors of w for every output channel this thread owns.
  __device__ __forceinline__ void load_b(ConvFwdParams const& p, int stage, bool k_valid) {
    using conv_detail::copy_or_zero;
    CUTE_UNROLL
    for (int i = 0; i < kLoadsB; ++i) {
      if (i + 1 < kLoadsB || b_last_in_tile) {
        const Element* row;
        uint32_t smem;
        if constexpr (kRowsInRegisters) {
          row = b_row[i];
          smem = b_smem[i];
        } else {
          auto sB = stages_b();
          b_row_at(p, i, sB, row, smem);
        }
        const bool valid = k_valid && row != nullptr;
        copy_or_zero<kBytes>(smem + stage * b_stage_bytes, valid ? row + k : any_address, valid);
      }
    }
  }

  // The column TileK further along the reduction.
  __device__ __forceinline__ void advance(ConvFwdParams const& p) {
    k += TileK;
    channel += TileK;
    normalize(p);
  }
};

// The accumulator tile into y. Each even/odd pair of accumulator elements
// holds two adjacent output channels of one row (the layout of both mma.sync
// and wgmma accumulators); a pair goes out as one 4-byte store where y's
// layout keeps pairs aligned (params.paired_stores), else one by one.
// coords: the same partition of an identity tensor over the tile.
template <class Element, class Acc, class Coords>
__device__ __forceinline__ void store_tile(ConvFwdParams const& p, ConvRow const* rows,
                                           Element* y_group, int32_t first_channel,
                                           Acc const& acc, Coords const& coords) {
  using namespace cute;
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 2) {
    const int r = get<0>(coords(i));
    const int32_t channel = first_channel + get<1>(coords(i));
    const int64_t y_base = rows[r].y_base;
    if (y_base < 0 || channel >= p.out_channels) continue;
    Element* dst = y_group + y_base + channel;
    const Element lo(acc(i));
    const Element hi(acc(i + 1));
    if (p.paired_stores && channel + 1 < p.out_channels) {
      *reinterpret_cast<uint32_t*>(dst) = uint32_t(lo.raw()) | (uint32_t(hi.raw()) << 16);
    } else {
      dst[0] = lo;
      if (channel + 1 < p.out_channels) dst[1] = hi;
    }
  }
}

}  // namespace ckfmha::kernel
