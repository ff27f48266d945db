// Logit modifiers applied between S = Q K^T and the softmax: soft-capping and
// additive biases. When any is on, scores are rewritten in the log2 domain
// (t = log2(e) * logit) so the softmax can use exp2 with unit scale.
#pragma once

#include "ckfmha/kernel/common/features.h"
#include "ckfmha/kernel/params/fwd_params.h"

#include <cute/tensor.hpp>

#include <cmath>

namespace ckfmha::kernel {

template <class Element, BiasMode Bias, bool HasSoftcap>
struct LogitTransform {
  static constexpr bool kActive = HasSoftcap || Bias != BiasMode::kNone;
  static constexpr float kLog2e = 1.4426950408889634f;

  float scale;
  float softcap;
  float softcap_prescale;
  Element const* bias_rows;  // elementwise: this (batch, head)'s [seqlen_q, seqlen_k] plane
  int64_t bias_row_stride;
  float alibi_slope;
  int seqlen_q;
  int seqlen_k;

  // This (batch, head)'s transform for one sequence; every kernel builds it
  // the same way. Params: FwdParams or BwdParams.
  template <class Params>
  __device__ __forceinline__ static LogitTransform for_sequence(Params const& p, int seqlen_q,
                                                                 int seqlen_k, int batch,
                                                                 int head) {
    LogitTransform t{};
    if constexpr (kActive) {
      t.scale = p.scale;
      t.softcap = p.softcap;
      t.softcap_prescale = p.softcap_prescale;
      t.seqlen_q = seqlen_q;
      t.seqlen_k = seqlen_k;
      if constexpr (Bias == BiasMode::kElementwise) {
        t.bias_rows = static_cast<Element const*>(p.bias) + batch * p.bias_batch_stride +
                      head * p.bias_head_stride;
        t.bias_row_stride = p.bias_row_stride;
      }
      if constexpr (Bias == BiasMode::kAlibi) {
        t.alibi_slope = p.alibi_slopes[batch * p.alibi_batch_stride + head];
      }
    }
    return t;
  }

  // One raw score s = q.k at (row, col) of the sequence: the log2-domain
  // logit. cap_grad gets d(logit)/d(scale * s) of the soft-cap, 1 - tanh^2
  // (1 without one), which the backward's chain rule needs.
  __device__ __forceinline__ float logit_log2(float s, int row, int col, float& cap_grad) const {
    float logit;
    if constexpr (HasSoftcap) {
      float capped = tanhf(s * softcap_prescale);
      cap_grad = 1.f - capped * capped;
      logit = softcap * capped;
    } else {
      cap_grad = 1.f;
      logit = s * scale;
    }
    if constexpr (Bias == BiasMode::kElementwise) {
      // Rows/columns past the sequence are masked later; never read them.
      if (row < seqlen_q && col < seqlen_k) {
        logit += float(bias_rows[int64_t(row) * bias_row_stride + col]);
      }
    } else if constexpr (Bias == BiasMode::kAlibi) {
      logit -= alibi_slope * fabsf(float(row + seqlen_k - seqlen_q - col));
    }
    return logit * kLog2e;
  }

  // scores/coords as in AttentionMask::apply; m_begin/n_begin: tile origin.
  template <class Scores, class Coords>
  __device__ __forceinline__ void apply(Scores& scores, Coords const& coords, int m_begin,
                                        int n_begin) const {
    using namespace cute;
    CUTE_UNROLL
    for (int i = 0; i < size<0>(scores); ++i) {
      int row = m_begin + get<0>(coords(i, 0));
      CUTE_UNROLL
      for (int j = 0; j < size<1>(scores); ++j) {
        float cap_grad;
        scores(i, j) = logit_log2(scores(i, j), row, n_begin + get<1>(coords(i, j)), cap_grad);
      }
    }
  }
};

}  // namespace ckfmha::kernel
