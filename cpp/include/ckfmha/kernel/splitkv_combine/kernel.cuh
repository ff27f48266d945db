// fwd_splitkv_combine: merges the S fp32 partials of a split-KV forward into
// O (in the input dtype) and, when asked, the LSE.
//
// Split s left O_s normalised by its own softmax sum and lse_s = log of that
// sum (with the max folded in), so with lse = log(sum_s exp(lse_s)) the exact
// result is O = sum_s exp(lse_s - lse) * O_s. The weights are formed relative
// to max_s lse_s so nothing overflows; splits that saw no visible key have
// lse_s = -inf and weigh 0, and a row no split saw gets O = 0 and LSE = -inf,
// as the one-stage forward kernels give.
//
// Threads: a row of HeadDimV outputs is spread over HeadDimV / 4 threads, 4
// adjacent columns each (one 16-byte load per partial); a CTA covers
// kRowsPerCta rows of the flattened [batch, nhead_q, seqlen_q] index.
#pragma once

#include "ckfmha/kernel/common/sequence_slice.cuh"
#include "ckfmha/kernel/params/fwd_params.h"

#include <cutlass/numeric_types.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace ckfmha::kernel {

template <class Element_, int HeadDimV, int Warps, bool IsGroupMode>
struct FwdSplitKvCombineTraits {
  using Element = Element_;
  static constexpr int kHeadDimV = HeadDimV;
  static constexpr int kThreads = Warps * 32;
  static constexpr int kColsPerThread = 4;
  static constexpr int kThreadsPerRow = HeadDimV / kColsPerThread;
  static constexpr int kRowsPerCta = kThreads / kThreadsPerRow;
  static constexpr bool kIsGroupMode = IsGroupMode;
  static_assert(HeadDimV % kColsPerThread == 0 && kThreads % kThreadsPerRow == 0,
                "whole rows per CTA");
  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                    std::is_same_v<Element, cutlass::bfloat16_t>,
                "split-KV runs on the fp16/bf16 tensor-core path");
};

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads)
    fwd_splitkv_combine_kernel(__grid_constant__ const FwdParams p) {
  using Element = typename Traits::Element;
  constexpr int kCols = Traits::kColsPerThread;
  const int64_t rows_per_split = int64_t(p.batch) * p.nhead_q * p.seqlen_q;
  const int64_t row = int64_t(blockIdx.x) * Traits::kRowsPerCta +
                      int(threadIdx.x) / Traits::kThreadsPerRow;
  if (row >= rows_per_split) return;
  const int col = int(threadIdx.x) % Traits::kThreadsPerRow * kCols;
  const int query = int(row % p.seqlen_q);
  const int head = int(row / p.seqlen_q % p.nhead_q);
  const int batch = int(row / (int64_t(p.seqlen_q) * p.nhead_q));
  const SequenceSlice seq = locate_queries<Traits::kIsGroupMode>(p, batch);
  if (seq.skip || query >= seq.seqlen_q) return;

  float max_lse = -INFINITY;
  for (int s = 0; s < p.num_splits; ++s) {
    max_lse = fmaxf(max_lse, p.partial_lse[s * rows_per_split + row]);
  }
  float acc[kCols] = {};
  float weight_sum = 0.f;
  if (max_lse != -INFINITY) {
    for (int s = 0; s < p.num_splits; ++s) {
      const int64_t index = s * rows_per_split + row;
      const float weight = __expf(p.partial_lse[index] - max_lse);
      weight_sum += weight;
      const float4 part =
          *reinterpret_cast<float4 const*>(p.partial_o + index * Traits::kHeadDimV + col);
      acc[0] += weight * part.x;
      acc[1] += weight * part.y;
      acc[2] += weight * part.z;
      acc[3] += weight * part.w;
    }
  }
  // weight_sum >= 1 whenever any split saw a key (the max split weighs 1).
  const float inv = max_lse == -INFINITY ? 0.f : 1.f / weight_sum;

  const int64_t o_origin = Traits::kIsGroupMode ? seq.q_token0 * p.o_row_stride
                                                : batch * p.o_batch_stride;
  Element* o = static_cast<Element*>(p.o) + o_origin + head * p.o_head_stride +
               int64_t(query) * p.o_row_stride + col;
  Element out[kCols];
  for (int i = 0; i < kCols; ++i) out[i] = Element(acc[i] * inv);
  *reinterpret_cast<uint2*>(o) = *reinterpret_cast<uint2 const*>(out);  // 4 x 16-bit

  if (p.lse != nullptr && col == 0) {
    float* lse = p.lse + (Traits::kIsGroupMode ? seq.q_token0 : batch * p.lse_batch_stride) +
                 head * p.lse_head_stride;
    lse[query] = max_lse == -INFINITY ? -INFINITY : max_lse + logf(weight_sum);
  }
}

}  // namespace ckfmha::kernel
