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
// kRowsPerCta rows of the flattened [batch, nhead_q, seqlen_q] index, and its
// remaining threads form kSplitGroups groups per row that take every
// kSplitGroups-th split each. Decode steps have few rows and many splits (32
// rows of 94 at batch 1, 32 query heads over 4 K/V heads, 12k keys): one
// thread walking all splits waits on one load round trip after another, so
// each group issues kUnroll splits' loads before it merges them, and the
// groups merge through shared memory at the end.
#pragma once

#include "ckfmha/kernel/common/sequence_slice.cuh"
#include "ckfmha/kernel/params/fwd_params.h"

#include <cutlass/numeric_types.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace ckfmha::kernel {

template <class Element_, int HeadDimV, int Warps, bool IsGroupMode, int RowsPerCta = 1>
struct FwdSplitKvCombineTraits {
  using Element = Element_;
  static constexpr int kHeadDimV = HeadDimV;
  static constexpr int kThreads = Warps * 32;
  static constexpr int kColsPerThread = 4;
  static constexpr int kThreadsPerRow = HeadDimV / kColsPerThread;
  static constexpr int kRowsPerCta = RowsPerCta;
  static constexpr int kSplitGroups = kThreads / (kRowsPerCta * kThreadsPerRow);
  // Splits whose loads a group issues before merging them.
  static constexpr int kUnroll = 8;
  static constexpr bool kIsGroupMode = IsGroupMode;
  static_assert(HeadDimV % kColsPerThread == 0 &&
                    kThreads % (kRowsPerCta * kThreadsPerRow) == 0 && kSplitGroups >= 1,
                "whole rows per CTA, whole thread groups per row");
  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                    std::is_same_v<Element, cutlass::bfloat16_t>,
                "split-KV runs on the fp16/bf16 tensor-core path");
};

// The running merge of one thread's splits: the largest LSE so far, and the
// sum of weights and the weighted O columns relative to it.
template <int Cols>
struct PartialMerge {
  float top = -INFINITY;
  float weight_sum = 0.f;
  float acc[Cols] = {};

  // Folds in a merge whose largest LSE is `lse`, with weight sum `sum` and
  // columns `cols` relative to it: one split is lse_s, 1 and its O_s.
  __device__ __forceinline__ void add(float lse, float sum, float const (&cols)[Cols]) {
    if (lse == -INFINITY) return;  // a split (or group) that saw no visible key
    const float new_top = fmaxf(top, lse);
    const float keep = top == -INFINITY ? 0.f : __expf(top - new_top);
    const float w = __expf(lse - new_top);
    weight_sum = weight_sum * keep + w * sum;
    for (int i = 0; i < Cols; ++i) acc[i] = acc[i] * keep + w * cols[i];
    top = new_top;
  }
};

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads)
    fwd_splitkv_combine_kernel(__grid_constant__ const FwdParams p) {
  using Element = typename Traits::Element;
  constexpr int kCols = Traits::kColsPerThread;
  constexpr int kGroups = Traits::kSplitGroups;
  constexpr int kUnroll = Traits::kUnroll;
  const int64_t rows_per_split = int64_t(p.batch) * p.nhead_q * p.seqlen_q;
  const int thread = int(threadIdx.x);
  const int lane_in_row = thread % Traits::kThreadsPerRow;
  const int group = thread / Traits::kThreadsPerRow % kGroups;
  const int row_in_cta = thread / (Traits::kThreadsPerRow * kGroups);
  const int64_t row = int64_t(blockIdx.x) * Traits::kRowsPerCta + row_in_cta;
  const int col = lane_in_row * kCols;
  const int query = int(row % p.seqlen_q);
  const int head = int(row / p.seqlen_q % p.nhead_q);
  const int batch = int(row / (int64_t(p.seqlen_q) * p.nhead_q));
  // Rows past the end and skipped sequences still reach the group merge's barrier.
  bool active = row < rows_per_split;
  SequenceSlice seq{};
  if (active) {
    seq = locate_queries<Traits::kIsGroupMode>(p, batch);
    active = !seq.skip && query < seq.seqlen_q;
  }

  PartialMerge<kCols> merge;
  if (active) {
    for (int first = group; first < p.num_splits; first += kGroups * kUnroll) {
      float lse[kUnroll];
      float4 part[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int s = first + u * kGroups;
        const int64_t index = int64_t(s < p.num_splits ? s : 0) * rows_per_split + row;
        lse[u] = s < p.num_splits ? p.partial_lse[index] : -INFINITY;
        part[u] = *reinterpret_cast<float4 const*>(p.partial_o + index * Traits::kHeadDimV + col);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float cols[kCols] = {part[u].x, part[u].y, part[u].z, part[u].w};
        merge.add(lse[u], 1.f, cols);
      }
    }
  }

  if constexpr (kGroups > 1) {
    // Group g's state at [g][row_in_cta][lane_in_row]; group 0 merges the others.
    constexpr int kSlots = Traits::kRowsPerCta * Traits::kThreadsPerRow;
    __shared__ float tops[kGroups][kSlots], sums[kGroups][kSlots], accs[kGroups][kCols][kSlots];
    const int slot = row_in_cta * Traits::kThreadsPerRow + lane_in_row;
    tops[group][slot] = merge.top;
    sums[group][slot] = merge.weight_sum;
    for (int i = 0; i < kCols; ++i) accs[group][i][slot] = merge.acc[i];
    __syncthreads();
    if (group != 0) return;
    for (int g = 1; g < kGroups; ++g) {
      float cols[kCols];
      for (int i = 0; i < kCols; ++i) cols[i] = accs[g][i][slot];
      merge.add(tops[g][slot], sums[g][slot], cols);
    }
  }
  if (!active) return;

  // weight_sum >= 1 whenever any split saw a key (the largest split weighs 1).
  const float inv = merge.top == -INFINITY ? 0.f : 1.f / merge.weight_sum;
  const int64_t o_origin = Traits::kIsGroupMode ? seq.q_token0 * p.o_row_stride
                                                : batch * p.o_batch_stride;
  Element* o = static_cast<Element*>(p.o) + o_origin + head * p.o_head_stride +
               int64_t(query) * p.o_row_stride + col;
  Element out[kCols];
  for (int i = 0; i < kCols; ++i) out[i] = Element(merge.acc[i] * inv);
  *reinterpret_cast<uint2*>(o) = *reinterpret_cast<uint2 const*>(out);  // 4 x 16-bit

  if (p.lse != nullptr && col == 0) {
    float* lse = p.lse + (Traits::kIsGroupMode ? seq.q_token0 : batch * p.lse_batch_stride) +
                 head * p.lse_head_stride;
    lse[query] = merge.top == -INFINITY ? -INFINITY : merge.top + logf(merge.weight_sum);
  }
}

}  // namespace ckfmha::kernel
