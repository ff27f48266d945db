// The element-wise steps of the Hopper backward main stage on a warpgroup's
// (keys, queries) accumulators, viewed as (rows, cols) of this thread:
// P^T = exp2(S^T * scale_log2 - LSE_log2) in place of S^T (0 where the mask
// hides the pair), and dS^T = P^T (dP^T - D) in place of dP^T. The LSE and D
// of a query tile come from its ring stage in shared memory. A bias broadcast
// over the query rows adds one value per key (BwdSm90KeyBias). With ALiBi or
// a soft-cap the logits are rewritten first (LogitTransform), and the
// soft-cap's derivative joins P^T in dS^T.
#pragma once

#include "ckfmha/kernel/common/logit_transform.cuh"

#include <cute/tensor.hpp>

#include <type_traits>

namespace ckfmha::kernel {

// A bias broadcast over the query rows ([b, 1 or h, 1, sk]: key padding)
// holds one value per key, and a thread's rows of S^T are keys: it reads
// that value once a query tile (a GQA walk changes heads between tiles) and
// adds it to each row's log2-domain logits, one add a score. Keys past the
// sequence read 0: the mask hides them.
template <int Rows>
struct BwdSm90KeyBias {
  float log2[Rows];

  template <class Element, class Coords>
  __device__ __forceinline__ static BwdSm90KeyBias load(Element const* keys, int seqlen_k,
                                                        Coords const& coords, int n_begin) {
    using namespace cute;
    constexpr float kLog2e = 1.4426950408889634f;
    BwdSm90KeyBias bias;
    CUTE_UNROLL
    for (int i = 0; i < Rows; ++i) {
      const int key = n_begin + get<0>(coords(i, 0));
      bias.log2[i] = key < seqlen_k ? float(keys[key]) * kLog2e : 0.f;
    }
    return bias;
  }
};

// No key bias: the logits are the scaled scores alone.
struct BwdSm90NoKeyBias {};

// `coords` holds each element's (key, query) within the tile, whose first
// query row is `m_begin` and first key `n_begin`.
template <bool kMasked, class Probs, class Coords, class Mask, class KeyBias = BwdSm90NoKeyBias>
__device__ __forceinline__ void bwd_sm90_probabilities(Probs& probs, Coords const& coords,
                                                       Mask const& mask, float const* lse_log2,
                                                       float scale_log2, int m_begin,
                                                       int n_begin, KeyBias const& key_bias = {}) {
  using namespace cute;
  constexpr bool kKeyBias = !std::is_same_v<KeyBias, BwdSm90NoKeyBias>;
  CUTE_UNROLL
  for (int i = 0; i < size<0>(probs); ++i) {
    CUTE_UNROLL
    for (int j = 0; j < size<1>(probs); ++j) {
      bool visible = true;
      if constexpr (kMasked) {
        visible = mask.visible(m_begin + get<1>(coords(i, j)), n_begin + get<0>(coords(i, j)));
      }
      const int col = get<1>(coords(i, j));
      float logit;
      if constexpr (kKeyBias) {
        // A padded key's -inf minus an empty row's +inf LSE stays -inf.
        logit = fmaf(probs(i, j), scale_log2, key_bias.log2[i]) - lse_log2[col];
      } else {
        logit = probs(i, j) * scale_log2 - lse_log2[col];
      }
      probs(i, j) = visible ? exp2f(logit) : 0.f;
    }
  }
}

// The forward's dropout as the backward sees it: bit i * cols + j of `keep`
// for element (i, j) of the thread's fragment, and 1 / (1 - p).
struct BwdSm90Dropout {
  uint32_t keep;
  float rescale;

  // A probability or its gradient as the forward's dropout passed it on:
  // rescaled where element `bit` was kept, 0 where it was dropped.
  __device__ __forceinline__ float passed(int bit, float value) const {
    return (keep >> bit) & 1u ? value * rescale : 0.f;
  }
};

// P^T one element at a time, through a logit transform and dropout (each
// optional): `weights` (the input dtype, same layout) gets the forward's
// weights of V, P^T dropped and rescaled, and `probs` P^T times the
// soft-cap's derivative (1 without one), which dS^T needs; the transform's
// rows are queries and its columns keys.
template <bool kMasked, bool kDropout, class Transform, class Probs, class Weights, class Coords,
          class Mask>
__device__ __forceinline__ void bwd_sm90_transformed_probabilities(
    Probs& probs, Weights& weights, Coords const& coords, Mask const& mask,
    Transform const& transform, BwdSm90Dropout const& dropout, float scale_log2,
    float const* lse_log2, int m_begin, int n_begin) {
  using namespace cute;
  using Element = typename Weights::value_type;
  CUTE_UNROLL
  for (int i = 0; i < size<0>(probs); ++i) {
    CUTE_UNROLL
    for (int j = 0; j < size<1>(probs); ++j) {
      const int key = n_begin + get<0>(coords(i, j));
      const int col = get<1>(coords(i, j));
      const int query = m_begin + col;
      float cap_grad = 1.f;
      const float logit = Transform::kActive
                              ? transform.logit_log2(probs(i, j), query, key, cap_grad)
                              : probs(i, j) * scale_log2;
      const bool visible = !kMasked || mask.visible(query, key);
      const float prob = visible ? exp2f(logit - lse_log2[col]) : 0.f;
      weights(i, j) = Element(kDropout ? dropout.passed(i * size<1>(probs) + j, prob) : prob);
      probs(i, j) = prob * cap_grad;
    }
  }
}

// The weights of dV's product without a logit transform: P^T (in `probs`)
// dropped and rescaled, into `weights` in the input dtype. Made from P^T when
// the product is issued, so that P^T and its weights are not both held while
// dP^T runs.
template <class Probs, class Weights>
__device__ __forceinline__ void bwd_sm90_dropped_weights(Probs const& probs, Weights& weights,
                                                         BwdSm90Dropout const& dropout) {
  using namespace cute;
  using Element = typename Weights::value_type;
  CUTE_UNROLL
  for (int i = 0; i < size<0>(probs); ++i) {
    CUTE_UNROLL
    for (int j = 0; j < size<1>(probs); ++j) {
      weights(i, j) = Element(dropout.passed(i * size<1>(probs) + j, probs(i, j)));
    }
  }
}

// With dropout, dP^T passes through the forward's mask and rescale first.
template <bool kDropout = false, class Probs, class Scores, class Coords>
__device__ __forceinline__ void bwd_sm90_score_gradients(Scores& dscores, Probs const& probs,
                                                         Coords const& coords,
                                                         float const* delta,
                                                         BwdSm90Dropout const& dropout = {}) {
  using namespace cute;
  CUTE_UNROLL
  for (int i = 0; i < size<0>(probs); ++i) {
    CUTE_UNROLL
    for (int j = 0; j < size<1>(probs); ++j) {
      const float dp = kDropout ? dropout.passed(i * size<1>(probs) + j, dscores(i, j))
                                : dscores(i, j);
      dscores(i, j) = probs(i, j) * (dp - delta[get<1>(coords(i, j))]);
    }
  }
}

}  // namespace ckfmha::kernel
