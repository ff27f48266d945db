// Which (query, key) pairs a tile may combine, for no mask, causal and
// sliding-window masks. Positions are local to the sequence.
#pragma once

#include "ckfmha/kernel/common/features.h"

#include <cute/tensor.hpp>

#include <cmath>

namespace ckfmha::kernel {

template <MaskMode Mode>
struct AttentionMask {
  int seqlen_k;
  int offset;  // 0 (top-left) or seqlen_k - seqlen_q (bottom-right)
  int left;    // < 0: unbounded
  int right;   // < 0: unbounded

  // The mask of one sequence of `seqlen_q` queries and `seqlen_k` keys, every
  // kernel's alike. Params: FwdParams or BwdParams (bottom_right and the
  // window bounds).
  template <class Params>
  __device__ __forceinline__ static AttentionMask for_sequence(Params const& p, int seqlen_q,
                                                               int seqlen_k) {
    return {seqlen_k, p.bottom_right ? seqlen_k - seqlen_q : 0, p.window_left, p.window_right};
  }

  __device__ __forceinline__ bool has_left() const { return Mode == MaskMode::kWindow && left >= 0; }
  __device__ __forceinline__ bool has_right() const {
    return Mode == MaskMode::kCausal || (Mode == MaskMode::kWindow && right >= 0);
  }

  // Key blocks [first, last) that hold any key visible to rows
  // [m_begin, m_begin + block_m); blocks outside are never loaded.
  __device__ __forceinline__ void key_block_range(int m_begin, int block_m, int block_n,
                                                  int* first, int* last) const {
    int lo = 0;
    int hi = (seqlen_k + block_n - 1) / block_n;
    if (has_right()) {
      int end = m_begin + block_m + offset + right;  // one past the last row's last key
      hi = end <= 0 ? 0 : min(hi, (end + block_n - 1) / block_n);
    }
    if (has_left()) {
      int start = m_begin + offset - left;  // the first row's first key
      lo = start <= 0 ? 0 : start / block_n;
    }
    *first = lo;
    *last = max(lo, hi);
  }

  // The inverse for the backward: query blocks [first, last) holding a row
  // that sees any key of [n_begin, n_begin + block_n) (keys past seqlen_k
  // excluded); blocks outside contribute nothing to this key tile.
  __device__ __forceinline__ void query_block_range(int n_begin, int block_n, int block_m,
                                                    int seqlen_q, int* first, int* last) const {
    int lo = 0;
    int hi = (seqlen_q + block_m - 1) / block_m;
    if (has_right()) {
      // Row i reaches keys up to i + offset + right: it needs i >= n_begin - offset - right.
      int reach = Mode == MaskMode::kCausal ? 0 : right;
      int start = n_begin - offset - reach;
      lo = start <= 0 ? 0 : start / block_m;
    }
    if (has_left()) {
      // Row i starts at key i + offset - left: it needs i <= n_end - 1 - offset + left.
      int n_end = min(n_begin + block_n, seqlen_k);
      int stop = n_end - 1 - offset + left;  // last row, inclusive
      hi = stop < 0 ? 0 : min(hi, stop / block_m + 1);
    }
    *first = lo;
    *last = max(lo, hi);
  }

  // Does this tile straddle an edge? Uniform across the CTA: a cheap branch.
  __device__ __forceinline__ bool tile_needs_mask(int m_begin, int n_begin, int block_m,
                                                  int block_n) const {
    bool cut = n_begin + block_n > seqlen_k;
    if (has_right()) cut = cut || n_begin + block_n - 1 > m_begin + offset + right;
    if (has_left()) cut = cut || n_begin < m_begin + block_m - 1 + offset - left;
    return cut;
  }

  // Is key `col` visible to query `row` (both local to the sequence)? The
  // element-wise form of apply(), for loops that handle one score at a time.
  __device__ __forceinline__ bool visible(int row, int col) const {
    int reach_right = Mode == MaskMode::kCausal ? 0 : right;
    bool ok = col < seqlen_k;
    if (has_right()) ok = ok && col <= row + offset + reach_right;
    if (has_left()) ok = ok && col >= row + offset - left;
    return ok;
  }

  // scores: (rows, cols) view of the S accumulator; coords: same view of the
  // identity tensor giving each element's (row, col) within the tile.
  template <class Scores, class Coords>
  __device__ __forceinline__ void apply(Scores& scores, Coords const& coords, int m_begin,
                                        int n_begin) const {
    apply_rows(scores, coords, [m_begin](int tile_row) { return m_begin + tile_row; }, n_begin);
  }

  // As apply, with `query_of(tile_row)` giving each tile row's query position
  // (split-KV packs several heads' rows into one tile, so rows repeat positions).
  template <class Scores, class Coords, class QueryOf>
  __device__ __forceinline__ void apply_rows(Scores& scores, Coords const& coords,
                                             QueryOf const& query_of, int n_begin) const {
    using namespace cute;
    bool bounded_left = has_left();
    bool bounded_right = has_right();
    int reach_right = Mode == MaskMode::kCausal ? 0 : right;
    CUTE_UNROLL
    for (int i = 0; i < size<0>(scores); ++i) {
      int row = query_of(get<0>(coords(i, 0)));
      int col_end = min(seqlen_k, bounded_right ? row + offset + reach_right + 1 : seqlen_k);
      int col_begin = bounded_left ? row + offset - left : 0;
      CUTE_UNROLL
      for (int j = 0; j < size<1>(scores); ++j) {
        int col = n_begin + get<1>(coords(i, j));
        if (col >= col_end || col < col_begin) scores(i, j) = -INFINITY;
      }
    }
  }
};

}  // namespace ckfmha::kernel
