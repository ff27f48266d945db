// The elementwise bias gradient of the backward: dbias = dL/d(logit) =
// P (dP - D), dS before the soft-cap's derivative and the softmax scale. The
// bwd_dq_dk_dv CTA of a key tile owns those columns of dbias for every query
// head of its KV head's group, so each element has exactly one writer (plain
// stores: deterministic). It stores the tiles it visits from registers and
// zeroes the rest of its columns: the query rows the mask leaves out and, in
// group mode, the padding past a sequence's lengths.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>

#include <cstdint>

namespace ckfmha::kernel {

template <class Element>
struct DbiasPlane {
  Element* rows;       // this (batch or sequence, query head)'s [seqlen_q, seqlen_k] plane
  int64_t row_stride;  // elements
  // Two neighbouring columns (the first even) go out as one 4-byte store when
  // the plane and its rows keep that alignment.
  bool pairs;

  __device__ __forceinline__ static DbiasPlane at(void* base, int64_t offset, int64_t row_stride) {
    Element* rows = static_cast<Element*>(base) + offset;
    bool pairs = ((reinterpret_cast<uintptr_t>(rows) | uintptr_t(row_stride * int64_t(sizeof(Element)))) &
                  uintptr_t(2 * sizeof(Element) - 1)) == 0;
    return DbiasPlane{rows, row_stride, pairs};
  }

  // (row, col) and (row, col + 1) with col even; each is stored if inside
  // [0, rows_end) x [0, cols_end).
  __device__ __forceinline__ void store_pair(int row, int col, Element a, Element b, int rows_end,
                                             int cols_end) const {
    if (row >= rows_end) return;
    Element* dst = rows + int64_t(row) * row_stride + col;
    if (pairs && col + 1 < cols_end) {
      cutlass::Array<Element, 2> both;
      both[0] = a;
      both[1] = b;
      *reinterpret_cast<uint32_t*>(dst) = *reinterpret_cast<uint32_t const*>(&both);
    } else {
      if (col < cols_end) dst[0] = a;
      if (col + 1 < cols_end) dst[1] = b;
    }
  }

  // A tile of the S accumulator's (rows, cols) view (neighbouring columns at
  // j, j + 1 for even j), tile origin (m_begin, n_begin).
  template <class Values, class Coords>
  __device__ __forceinline__ void store_tile(Values const& values, Coords const& coords,
                                             int m_begin, int n_begin, int rows_end,
                                             int cols_end) const {
    using namespace cute;
    static_assert(decltype(size<1>(values))::value % 2 == 0, "columns come in pairs");
    CUTE_UNROLL
    for (int i = 0; i < size<0>(values); ++i) {
      const int row = m_begin + get<0>(coords(i, 0));
      CUTE_UNROLL
      for (int j = 0; j < size<1>(values); j += 2) {
        store_pair(row, n_begin + get<1>(coords(i, j)), values(i, j), values(i, j + 1), rows_end,
                   cols_end);
      }
    }
  }

  // Zeroes rows [row_begin, row_end) x columns [col_begin, col_end) of the
  // key tile that starts at n_begin (BlockN columns): each thread takes one
  // column pair of a row, Threads / (BlockN / 2) rows per pass.
  template <int Threads, int BlockN>
  __device__ __forceinline__ void zero(int tid, int n_begin, int row_begin, int row_end,
                                       int col_begin, int col_end) const {
    static_assert(BlockN % 2 == 0 && Threads % (BlockN / 2) == 0,
                  "whole rows of column pairs per pass");
    constexpr int kPairsPerRow = BlockN / 2;
    constexpr int kRowsPerPass = Threads / kPairsPerRow;
    const int col = n_begin + 2 * (tid % kPairsPerRow);
    if (row_begin >= row_end || col + 1 < col_begin || col >= col_end) return;
    const Element z(0.f);
    const bool whole_pair = pairs && col >= col_begin && col + 1 < col_end;
    for (int row = row_begin + tid / kPairsPerRow; row < row_end; row += kRowsPerPass) {
      Element* dst = rows + int64_t(row) * row_stride + col;
      if (whole_pair) {
        *reinterpret_cast<uint32_t*>(dst) = 0u;
      } else {
        if (col >= col_begin && col < col_end) dst[0] = z;
        if (col + 1 >= col_begin && col + 1 < col_end) dst[1] = z;
      }
    }
  }
};

}  // namespace ckfmha::kernel
