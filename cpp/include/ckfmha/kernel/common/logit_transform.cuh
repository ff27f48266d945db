// Logit modifiers applied between S = Q K^T and the softmax: soft-capping and
// additive biases. When any is on, scores are rewritten in the log2 domain
// (t = log2(e) * logit) so the softmax can use exp2 with unit scale.
#pragma once

#include "ckfmha/kernel/common/features.h"
#include "ckfmha/kernel/params/fwd_params.h"

#include <cute/tensor.hpp>
#include <cutlass/array.h>

#include <cmath>
#include <cstdint>

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
  float inv_scale;  // 1 / scale, where a bias is added in score units
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
      if constexpr (kBiasInScoreUnits) t.inv_scale = 1.f / p.scale;
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

  // The additive term at (row, col) of the sequence, in logit units: the
  // elementwise bias (0 past the sequence, where the mask takes over), ALiBi's
  // distance penalty, or 0.
  __device__ __forceinline__ float bias_at(int row, int col) const {
    if constexpr (Bias == BiasMode::kElementwise) {
      // Rows/columns past the sequence are masked later; never read them.
      if (row < seqlen_q && col < seqlen_k) {
        return float(bias_rows[int64_t(row) * bias_row_stride + col]);
      }
      return 0.f;
    } else if constexpr (Bias == BiasMode::kAlibi) {
      return -alibi_slope * fabsf(float(row + seqlen_k - seqlen_q - col));
    } else {
      return 0.f;
    }
  }

  // One raw score s = q.k with its additive term: the log2-domain logit.
  // cap_grad gets d(logit)/d(scale * s) of the soft-cap, 1 - tanh^2 (1
  // without one), which the backward's chain rule needs.
  __device__ __forceinline__ float biased_logit_log2(float s, float bias, float& cap_grad) const {
    float logit;
    if constexpr (HasSoftcap) {
      float capped = tanhf(s * softcap_prescale);
      cap_grad = 1.f - capped * capped;
      logit = softcap * capped;
    } else {
      cap_grad = 1.f;
      logit = s * scale;
    }
    if constexpr (Bias != BiasMode::kNone) logit += bias;
    return logit * kLog2e;
  }

  // The same for the raw score at (row, col) of the sequence.
  __device__ __forceinline__ float logit_log2(float s, int row, int col, float& cap_grad) const {
    return biased_logit_log2(s, bias_at(row, col), cap_grad);
  }

  // Soft-cap without a bias, on the Hopper forward: scores leave cap_scores()
  // as tanh(scale * s / cap), and the softmax's own multiply-add takes them
  // to the log2 domain with softmax_scale_log2() = cap * log2(e). Scaling
  // each score here first (by cap, then by log2(e)) cost two instructions a
  // score, and the consumers issue at a fixed rate (NOTES 98).
  static constexpr bool kCapScaledBySoftmax = HasSoftcap && Bias == BiasMode::kNone;
  // ALiBi without a soft-cap, likewise: alibi_scores() adds the distance
  // penalty in raw score units (over the softmax scale, which the problem's
  // checks keep positive), one multiply-add a score on a float distance, and
  // the softmax scales as for plain scores. Scaling to log2 units here, on an
  // integer distance converted per score, cost three instructions more.
  static constexpr bool kAlibiInScoreUnits = Bias == BiasMode::kAlibi && !HasSoftcap;
  // An elementwise bias without a soft-cap, likewise: added in raw score
  // units (bias / scale, one multiply-add a score, bias_for_softmax); taken
  // to log2 units here, it cost a multiply more a score.
  static constexpr bool kBiasInScoreUnits = Bias == BiasMode::kElementwise && !HasSoftcap;

  // The factor from what the scores hold to log2-domain logits: cap * log2(e)
  // after cap_scores(), the plain scale after alibi_scores() and after
  // bias_for_softmax() without a cap, 1 after apply() (log2-domain already).
  // Params: FwdParams, as for for_sequence.
  template <class Params>
  __device__ __forceinline__ static float softmax_scale_log2(Params const& p) {
    if constexpr (kCapScaledBySoftmax) {
      return p.softcap * kLog2e;
    } else if constexpr (kAlibiInScoreUnits || kBiasInScoreUnits) {
      return p.scale_log2;
    } else {
      return 1.f;
    }
  }

  // The Hopper forward's biased score: in score units (kBiasInScoreUnits),
  // else the log2-domain logit.
  __device__ __forceinline__ float bias_for_softmax(float s, float bias) const {
    if constexpr (kBiasInScoreUnits) {
      return fmaf(bias, inv_scale, s);
    } else {
      float cap_grad;
      return biased_logit_log2(s, bias, cap_grad);
    }
  }

  // scores/coords as in apply(). A row's distances to this thread's keys
  // differ by the columns' offsets, which are constants once unrolled: one
  // conversion per row, then one add and one multiply-add a score.
  template <class Scores, class Coords>
  __device__ __forceinline__ void alibi_scores(Scores& scores, Coords const& coords,
                                               int m_begin, int n_begin) const {
    using namespace cute;
    static_assert(kAlibiInScoreUnits, "a soft-cap takes ALiBi through apply()");
    const float penalty = -alibi_slope / scale;
    CUTE_UNROLL
    for (int i = 0; i < size<0>(scores); ++i) {
      const int col0 = get<1>(coords(i, 0));
      const int row = m_begin + get<0>(coords(i, 0));
      const float base = float(row + seqlen_k - seqlen_q - n_begin - col0);
      CUTE_UNROLL
      for (int j = 0; j < size<1>(scores); ++j) {
        const float distance = base - float(get<1>(coords(i, j)) - col0);
        scores(i, j) = fmaf(fabsf(distance), penalty, scores(i, j));
      }
    }
  }

  template <class Scores>
  __device__ __forceinline__ void cap_scores(Scores& scores) const {
    using namespace cute;
    static_assert(kCapScaledBySoftmax, "a bias is added after the cap, in apply()");
    CUTE_UNROLL
    for (int i = 0; i < size(scores); ++i) scores(i) = tanhf(scores(i) * softcap_prescale);
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

  // An elementwise bias tile read into `bias` (a (rows, cols) fragment laid
  // out as the scores, fp16/bf16) ahead of its scores, so that the loads are
  // in flight while the S product runs instead of after it. Rows and columns
  // past the sequence read its last row or column instead of testing each
  // element: the mask overwrites those columns, and those rows are never
  // stored. Fragment columns 2k and 2k + 1 are neighbouring keys, read as one
  // 4-byte word where the bias rows allow it.
  template <class Fragment, class Coords>
  __device__ __forceinline__ void load_bias(Fragment& bias, Coords const& coords, int m_begin,
                                            int n_begin) const {
    using namespace cute;
    static_assert(Bias == BiasMode::kElementwise, "only an elementwise bias is read");
    static_assert(sizeof(Element) == 2 && decltype(size<1>(bias))::value % 2 == 0);
    // Pairs start on even keys; with an even key count a pair never straddles the end.
    const bool pairs = reinterpret_cast<uintptr_t>(bias_rows) % 4 == 0 &&
                       bias_row_stride % 2 == 0 && seqlen_k % 2 == 0;
    CUTE_UNROLL
    for (int i = 0; i < size<0>(bias); ++i) {
      const int row = min(m_begin + get<0>(coords(i, 0)), seqlen_q - 1);
      Element const* row_bias = bias_rows + int64_t(row) * bias_row_stride;
      CUTE_UNROLL
      for (int j = 0; j < size<1>(bias); j += 2) {
        const int col = n_begin + get<1>(coords(i, j));
        if (pairs) {
          const auto word = *reinterpret_cast<cutlass::Array<Element, 2> const*>(
              row_bias + min(col, seqlen_k - 2));
          bias(i, j) = word[0];
          bias(i, j + 1) = word[1];
        } else {
          bias(i, j) = row_bias[min(col, seqlen_k - 1)];
          bias(i, j + 1) = row_bias[min(col + 1, seqlen_k - 1)];
        }
      }
    }
  }

  // The Hopper forward's elementwise bias read ahead by load_bias, added as
  // bias_for_softmax() adds it.
  template <class Scores, class Fragment>
  __device__ __forceinline__ void apply_loaded(Scores& scores, Fragment const& bias) const {
    using namespace cute;
    static_assert(Bias == BiasMode::kElementwise, "only an elementwise bias is read ahead");
    CUTE_UNROLL
    for (int i = 0; i < size<0>(scores); ++i) {
      CUTE_UNROLL
      for (int j = 0; j < size<1>(scores); ++j) {
        scores(i, j) = bias_for_softmax(scores(i, j), float(bias(i, j)));
      }
    }
  }
};

}  // namespace ckfmha::kernel
