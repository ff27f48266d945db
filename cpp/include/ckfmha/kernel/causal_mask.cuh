// Which (query, key) pairs a tile may combine. Positions are absolute within
// the sequence; the functor is applied only to tiles that straddle an edge.
#pragma once

#include <cute/tensor.hpp>

#include <cmath>

namespace ckfmha::kernel {

template <bool IsCausal>
struct AttentionMask {
  int seqlen_k;
  int causal_offset;  // key j visible to query i iff j <= i + causal_offset

  // Does any key in [n_begin, n_begin + block_n) need masking for queries
  // [m_begin, m_begin + block_m)? Uniform across the CTA, so it is a cheap branch.
  __device__ __forceinline__ bool tile_needs_mask(int m_begin, int n_begin, int block_n) const {
    bool past_end = n_begin + block_n > seqlen_k;
    if constexpr (IsCausal) {
      return past_end || n_begin + block_n - 1 > m_begin + causal_offset;
    } else {
      return past_end;
    }
  }

  // scores: (rows, cols) view of the S accumulator; coords: same view of the
  // identity tensor giving each element's (row, col) within the tile.
  template <class Scores, class Coords>
  __device__ __forceinline__ void apply(Scores& scores, Coords const& coords, int m_begin,
                                        int n_begin) const {
    using namespace cute;
    CUTE_UNROLL
    for (int i = 0; i < size<0>(scores); ++i) {
      CUTE_UNROLL
      for (int j = 0; j < size<1>(scores); ++j) {
        int row = m_begin + get<0>(coords(i, j));
        int col = n_begin + get<1>(coords(i, j));
        bool hidden = col >= seqlen_k;
        if constexpr (IsCausal) hidden = hidden || col > row + causal_offset;
        if (hidden) scores(i, j) = -INFINITY;
      }
    }
  }
};

}  // namespace ckfmha::kernel
