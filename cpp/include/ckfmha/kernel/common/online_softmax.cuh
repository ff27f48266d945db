// Online (streaming) softmax state for the rows a thread owns.
//
// A row is spread over a group of LaneGroup consecutive lanes, so row
// reductions finish with log2(LaneGroup) xor-shuffles: 4 for a row of a 16x8
// mma.sync accumulator atom (a quad), 8 on the SIMT path. The running sum
// stays per-thread until the end: only the final normalisation needs the
// group total.
#pragma once

#include <cute/tensor.hpp>

#include <cmath>
#include <type_traits>

namespace ckfmha::kernel {

template <int LaneGroup>
__device__ __forceinline__ float lane_group_max(float x) {
  static_assert(LaneGroup >= 1 && LaneGroup <= 32 && (LaneGroup & (LaneGroup - 1)) == 0);
  CUTE_UNROLL
  for (int lane_mask = 1; lane_mask < LaneGroup; lane_mask <<= 1) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, lane_mask));
  }
  return x;
}

template <int LaneGroup>
__device__ __forceinline__ float lane_group_sum(float x) {
  static_assert(LaneGroup >= 1 && LaneGroup <= 32 && (LaneGroup & (LaneGroup - 1)) == 0);
  CUTE_UNROLL
  for (int lane_mask = 1; lane_mask < LaneGroup; lane_mask <<= 1) {
    x += __shfl_xor_sync(0xffffffff, x, lane_mask);
  }
  return x;
}

// op over row i of scores (rows, cols), in pairs, then pairs of pairs.
template <class Scores, class Op>
__device__ __forceinline__ float row_tree_reduce(Scores const& scores, int i, Op op) {
  using namespace cute;
  constexpr int kCols = decltype(size<1>(scores))::value;
  float part[kCols];
  CUTE_UNROLL
  for (int j = 0; j < kCols; ++j) part[j] = scores(i, j);
  CUTE_UNROLL
  for (int stride = 1; stride < kCols; stride *= 2) {
    CUTE_UNROLL
    for (int j = 0; j + stride < kCols; j += 2 * stride) part[j] = op(part[j], part[j + stride]);
  }
  return part[0];
}

template <int Rows, int LaneGroup = 4>
struct OnlineSoftmax {
  float row_max[Rows];  // in raw score units (before the softmax scale)
  float row_sum[Rows];  // this thread's share of sum(exp(scale * (s - row_max)))

  // Per-row factors for the output accumulator after a maximum moved, and
  // whether any of this thread's rows moved (all factors are 1 otherwise).
  struct Corrections {
    float row[Rows];
    bool any;
  };

  __device__ __forceinline__ void reset() {
    CUTE_UNROLL
    for (int i = 0; i < Rows; ++i) {
      row_max[i] = -INFINITY;
      row_sum[i] = 0.f;
    }
  }

  // Turns scores (rows, cols) into unnormalised probabilities in place and
  // rescales the output accumulator rows for the new running maximum.
  template <bool FirstTile, class Scores, class Output>
  __device__ __forceinline__ void update(Scores& scores, Output& out, float scale_log2) {
    const Corrections correction = update_scores<FirstTile>(scores, scale_log2);
    if constexpr (!FirstTile) rescale(out, correction);
  }

  // The score half of update: the output rows' corrections are returned for
  // the caller to apply once nothing else writes the accumulator (on Hopper
  // the previous tile's P V product may still be accumulating into it).
  // A first tile's corrections are left unset: there is nothing to rescale.
  //
  // With a lazy `MaxSlack` (> 0, log2 units), a row keeps its running maximum
  // until a tile's scores exceed it by more than that: probabilities then
  // reach up to 2^MaxSlack instead of 1 (harmless in fp32 sums and in
  // fp16/bf16 P), and most tiles need no correction of O at all.
  // `ProbOffset` (log2 units) scales every probability and sum by
  // 2^ProbOffset, which O's normalisation cancels and the caller takes off
  // the LSE: e4m3 P keeps more of a row's small probabilities that way.
  // `Tree` reduces a row's maximum and sum pairwise rather than in one chain
  // (shorter dependency chains, where the products are fast enough for the
  // softmax's latency to show: the fp8 forward).
  template <bool FirstTile, class Scores, int MaxSlack = 0, int ProbOffset = 0, bool Tree = false>
  __device__ __forceinline__ Corrections update_scores(Scores& scores, float scale_log2,
                                                       std::integral_constant<int, MaxSlack> = {},
                                                       std::integral_constant<int, ProbOffset> = {},
                                                       std::bool_constant<Tree> = {}) {
    using namespace cute;
    static_assert(decltype(size<0>(scores))::value == Rows);
    Corrections correction{};
    correction.any = MaxSlack == 0;
    CUTE_UNROLL
    for (int i = 0; i < Rows; ++i) {
      float tile_max = row_max[i];
      if constexpr (Tree) {
        tile_max = fmaxf(tile_max, row_tree_reduce(scores, i, [](float a, float b) {
                           return fmaxf(a, b);
                         }));
      } else {
        CUTE_UNROLL
        for (int j = 0; j < size<1>(scores); ++j) tile_max = fmaxf(tile_max, scores(i, j));
      }
      tile_max = lane_group_max<LaneGroup>(tile_max);
      if constexpr (!FirstTile && MaxSlack > 0) {
        // -inf - -inf is NaN: a row without keys so far moves as soon as it
        // sees one.
        const bool moves = row_max[i] == -INFINITY
                               ? tile_max != -INFINITY
                               : (tile_max - row_max[i]) * scale_log2 > float(MaxSlack);
        if (!moves) tile_max = row_max[i];
        correction.any |= moves;
      }
      // A row that has seen only masked keys keeps max -inf; subtracting 0
      // instead keeps exp2 at 0 rather than NaN.
      float shift = tile_max == -INFINITY ? 0.f : tile_max * scale_log2;
      if constexpr (!FirstTile) {
        // A row that saw nothing yet has zero accumulators; its correction
        // must be 0, not exp2(0 - shift), which overflows for very negative
        // logits (ALiBi, biases) and turns 0 * inf into NaN.
        correction.row[i] =
            row_max[i] == -INFINITY ? 0.f : exp2f(row_max[i] * scale_log2 - shift);
        row_sum[i] *= correction.row[i];
      }
      row_max[i] = tile_max;
      if constexpr (ProbOffset != 0) shift -= float(ProbOffset);
      float sum = 0.f;
      CUTE_UNROLL
      for (int j = 0; j < size<1>(scores); ++j) {
        float p = exp2f(scores(i, j) * scale_log2 - shift);
        scores(i, j) = p;
        if constexpr (!Tree) sum += p;
      }
      if constexpr (Tree) sum = row_tree_reduce(scores, i, [](float a, float b) { return a + b; });
      row_sum[i] += sum;
    }
    return correction;
  }

  // update_scores for scales that change from row to row and tile to tile
  // (the fp8 forward's dequantisation scales, per block of queries and
  // keys): row i's scores are multiplied by scale_log2[i] before exp2, and
  // row_max is kept in log2 units (scaled), since raw maxima of tiles with
  // different scales do not compare. finalize then takes max_to_log2 = 1.
  // Maxima and sums are reduced pairwise, as with `Tree` above.
  template <bool FirstTile, class Scores, int MaxSlack = 0, int ProbOffset = 0>
  __device__ __forceinline__ Corrections update_scaled_scores(
      Scores& scores, float const (&scale_log2)[Rows], std::integral_constant<int, MaxSlack> = {},
      std::integral_constant<int, ProbOffset> = {}) {
    using namespace cute;
    static_assert(decltype(size<0>(scores))::value == Rows);
    Corrections correction{};
    correction.any = MaxSlack == 0;
    CUTE_UNROLL
    for (int i = 0; i < Rows; ++i) {
      const float raw_max = lane_group_max<LaneGroup>(
          row_tree_reduce(scores, i, [](float a, float b) { return fmaxf(a, b); }));
      // Scales are positive: scaling keeps the order, and -inf stays -inf.
      float tile_max = fmaxf(row_max[i], raw_max * scale_log2[i]);
      if constexpr (!FirstTile && MaxSlack > 0) {
        const bool moves = row_max[i] == -INFINITY ? tile_max != -INFINITY
                                                   : tile_max - row_max[i] > float(MaxSlack);
        if (!moves) tile_max = row_max[i];
        correction.any |= moves;
      }
      float shift = tile_max == -INFINITY ? 0.f : tile_max;
      if constexpr (!FirstTile) {
        correction.row[i] = row_max[i] == -INFINITY ? 0.f : exp2f(row_max[i] - shift);
        row_sum[i] *= correction.row[i];
      }
      row_max[i] = tile_max;
      if constexpr (ProbOffset != 0) shift -= float(ProbOffset);
      CUTE_UNROLL
      for (int j = 0; j < size<1>(scores); ++j) {
        scores(i, j) = exp2f(scores(i, j) * scale_log2[i] - shift);
      }
      row_sum[i] += row_tree_reduce(scores, i, [](float a, float b) { return a + b; });
    }
    return correction;
  }

  template <class Output>
  __device__ __forceinline__ void rescale(Output& out, Corrections const& correction) const {
    using namespace cute;
    CUTE_UNROLL
    for (int i = 0; i < Rows; ++i) {
      CUTE_UNROLL
      for (int j = 0; j < size<1>(out); ++j) out(i, j) *= correction.row[i];
    }
  }

  // Normalises the output rows and returns each row's log-sum-exp (natural
  // log). max_to_log2 converts row_max to the log2 domain (the softmax scale
  // times log2(e), or 1 when scores were already transformed). A sink adds
  // exp(sink) to the denominator; without one, rows that saw no visible key
  // give 0 and -inf, never NaN. `rescale` folds in dropout's 1/(1-p) (and
  // the fp8 forward's v scale). `ProbOffset` is update_scores': the sums
  // carry 2^ProbOffset, which the LSE takes off.
  template <bool HasSink, int ProbOffset = 0, class Output>
  __device__ __forceinline__ void finalize(Output& out, float max_to_log2, float sink_log2,
                                           float rescale, float (&lse)[Rows]) {
    using namespace cute;
    static_assert(!HasSink || ProbOffset == 0, "a sink's weight would need the offset too");
    constexpr float kLn2 = 0.6931471805599453f;
    CUTE_UNROLL
    for (int i = 0; i < Rows; ++i) {
      float total = lane_group_sum<LaneGroup>(row_sum[i]);
      float max_log2 = row_max[i] == -INFINITY ? -INFINITY : row_max[i] * max_to_log2;
      float inv;
      if constexpr (HasSink) {
        float top = fmaxf(max_log2, sink_log2);
        float weight = max_log2 == -INFINITY ? 0.f : exp2f(max_log2 - top);
        float denom = total * weight + exp2f(sink_log2 - top);
        inv = weight / denom;
        lse[i] = (top + log2f(denom)) * kLn2;
      } else {
        bool empty = total == 0.f || total != total;
        inv = empty ? 0.f : 1.f / total;
        lse[i] = empty ? -INFINITY : (max_log2 + log2f(total) - float(ProbOffset)) * kLn2;
      }
      inv *= rescale;
      CUTE_UNROLL
      for (int j = 0; j < size<1>(out); ++j) out(i, j) *= inv;
    }
  }
};

}  // namespace ckfmha::kernel
