// The element-wise steps of the Hopper backward main stage on a warpgroup's
// (keys, queries) accumulators, viewed as (rows, cols) of this thread:
// P^T = exp2(S^T * scale_log2 - LSE_log2) in place of S^T (0 where the mask
// hides the pair), and dS^T = P^T (dP^T - D) in place of dP^T. The LSE and D
// of a query tile come from its ring stage in shared memory.
#pragma once

#include <cute/tensor.hpp>

#include <type_traits>

namespace ckfmha::kernel {

// `coords` holds each element's (key, query) within the tile, whose first
// query row is `m_begin` and first key `n_begin`.
template <bool kMasked, class Probs, class Coords, class Mask>
__device__ __forceinline__ void bwd_sm90_probabilities(Probs& probs, Coords const& coords,
                                                       Mask const& mask, float const* lse_log2,
                                                       float scale_log2, int m_begin,
                                                       int n_begin) {
  using namespace cute;
  CUTE_UNROLL
  for (int i = 0; i < size<0>(probs); ++i) {
    CUTE_UNROLL
    for (int j = 0; j < size<1>(probs); ++j) {
      bool visible = true;
      if constexpr (kMasked) {
        visible = mask.visible(m_begin + get<1>(coords(i, j)), n_begin + get<0>(coords(i, j)));
      }
      const int col = get<1>(coords(i, j));
      probs(i, j) = visible ? exp2f(probs(i, j) * scale_log2 - lse_log2[col]) : 0.f;
    }
  }
}

template <class Probs, class Scores, class Coords>
__device__ __forceinline__ void bwd_sm90_score_gradients(Scores& dscores, Probs const& probs,
                                                         Coords const& coords,
                                                         float const* delta) {
  using namespace cute;
  CUTE_UNROLL
  for (int i = 0; i < size<0>(probs); ++i) {
    CUTE_UNROLL
    for (int j = 0; j < size<1>(probs); ++j) {
      dscores(i, j) = probs(i, j) * (dscores(i, j) - delta[get<1>(coords(i, j))]);
    }
  }
}

}  // namespace ckfmha::kernel
