// The backward-weight kernels' epilogue: a CTA's accumulator tile of dw into
// dw itself (one split) or added into the fp32 partial sums (several), for
// the mma.sync and the wgmma templates alike, or (sm_90) summed over the
// split CTAs of one cluster through distributed shared memory and stored:
// pulled by each rank (the gathering wgmma kernel) or pushed to the rank that
// owns each row (the TMA kernel).
// Pairs of accumulator elements are adjacent reduction columns of one output
// channel in both instructions' accumulator layouts.
#pragma once

#include "ckfmha/kernel/conv/cluster_split_sum.cuh"
#include "ckfmha/kernel/conv/packed_weight_divisors.cuh"
#include "ckfmha/kernel/params/conv_params.h"

#include <cooperative_groups.h>
#include <cute/tensor.hpp>

#include <cstdint>

namespace ckfmha::kernel::conv_detail {

template <class Element>
__device__ __forceinline__ void store_weight_value(ConvBwdWeightParams const& bp, int64_t offset,
                                                   float value) {
  if (bp.accum != nullptr) {
    atomicAdd(bp.accum + offset, value);
  } else {
    // w holds dw here: the gradient this kernel writes.
    static_cast<Element*>(const_cast<void*>(bp.conv.w))[offset] = Element(value);
  }
}

// One element of a packed tile (bp.pack > 1): the packed output channel and
// reduction column name a group each; only a group's products with itself
// belong to dw, at that group's real place.
template <class Element>
__device__ __forceinline__ void store_packed_weight(ConvBwdWeightParams const& bp,
                                                    PackedWeightDivisors const& div,
                                                    int32_t packed_group, int32_t k_packed,
                                                    int32_t n_packed, float value) {
  int k_member, k, tap, rest, c_member, c;
  div.group_out(k_member, k, k_packed);
  div.packed_in(tap, rest, n_packed);
  div.group_in(c_member, c, rest);
  if (c_member != k_member) return;
  const int64_t group = int64_t(packed_group) * bp.pack + k_member;
  const int64_t offset = (group * bp.group_out_channels + k) * bp.group_reduction +
                         int64_t(tap) * bp.group_in_channels + c;
  store_weight_value<Element>(bp, offset, value);
}

// log2 of a power of two. (The host pass sees device code too, without the
// device intrinsics.)
__host__ __device__ __forceinline__ int32_t log2_of_power_of_two(int32_t v) {
#if defined(__CUDA_ARCH__)
  return __ffs(v) - 1;
#else
  return __builtin_ctz(uint32_t(v));
#endif
}

// Where a packed tile's elements map to dw with shifts: a group's input and
// output channels are powers of two, the input channels even (ResNeXt's
// groups of 8 to 32, and every packed plan of the TMA kernel, whose tap holds
// 64 channels). A column's tap, group and channel are then a shift and two
// masks, a row's group a shift, and an even column and the next are one
// group's adjacent channels of one tap.
struct PackedWeightShifts {
  int32_t tap_shift;     // log2 of the packed group's input channels
  int32_t member_shift;  // log2 of a group's input channels
  int32_t row_shift;     // log2 of a group's output channels
  bool usable;

  __device__ explicit PackedWeightShifts(ConvBwdWeightParams const& bp)
      : tap_shift(log2_of_power_of_two(bp.conv.in_channels)),
        member_shift(log2_of_power_of_two(bp.group_in_channels)),
        row_shift(log2_of_power_of_two(bp.group_out_channels)),
        usable(bp.group_in_channels >= 2 &&
               (bp.group_in_channels & (bp.group_in_channels - 1)) == 0 &&
               (bp.group_out_channels & (bp.group_out_channels - 1)) == 0) {}

  // Column n's offset within the dw row of packed row k (a packed group's
  // rows are its groups' rows of dw, one after another), or -1 where the
  // column belongs to another group than the row.
  __device__ __forceinline__ int32_t column(ConvBwdWeightParams const& bp, int32_t k,
                                            int32_t n) const {
    const int32_t rest = n & (bp.conv.in_channels - 1);
    if ((rest >> member_shift) != (k >> row_shift)) return -1;
    return (n >> tap_shift) * bp.group_in_channels + (rest & (bp.group_in_channels - 1));
  }
};

// The thread's pairs of adjacent columns, each stored at once: a float2
// reduction into the partial sums (kSums; two floats before sm_90) or two
// elements in one 4-byte store where `aligned`. dw's row of packed row k
// starts at (group x rows + k) x `row_length`; `column(k, n)` is n's place in
// it, or -1 where nothing is stored. A row's start is worked out before the
// pair's checks, so that the pairs of one row share it.
template <class Element, bool kSums, class Acc, class Coords, class Column>
__device__ __forceinline__ void store_weight_pairs(ConvBwdWeightParams const& bp, int32_t group,
                                                   int32_t first_k, int32_t first_n,
                                                   Acc const& acc, Coords const& coords,
                                                   int32_t pair_first, int32_t pair_step,
                                                   int32_t row_length, bool aligned,
                                                   Column const& column) {
  using namespace cute;
  ConvFwdParams const& p = bp.conv;
  Element* dw = static_cast<Element*>(const_cast<void*>(p.w));
  const int64_t group_rows = int64_t(group) * p.out_channels;
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 2) {
    if ((i / 2) % pair_step != pair_first) continue;
    const int32_t k = first_k + get<0>(coords(i));
    const int32_t n = first_n + get<1>(coords(i));
    const int64_t row = (group_rows + k) * row_length;
    if (k >= p.out_channels || n >= p.reduction) continue;
    const int32_t place = column(k, n);
    if (place < 0) continue;
    const int64_t offset = row + place;
    if constexpr (kSums) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      // The offset is even and the workspace 16-byte aligned.
      atomicAdd(reinterpret_cast<float2*>(bp.accum + offset), make_float2(acc(i), acc(i + 1)));
#else
      atomicAdd(bp.accum + offset, acc(i));
      atomicAdd(bp.accum + offset + 1, acc(i + 1));
#endif
    } else if (aligned) {
      const Element lo(acc(i));
      const Element hi(acc(i + 1));
      *reinterpret_cast<uint32_t*>(dw + offset) = uint32_t(lo.raw()) | (uint32_t(hi.raw()) << 16);
    } else {
      dw[offset] = Element(acc(i));
      dw[offset + 1] = Element(acc(i + 1));
    }
  }
}

// store_weight_pairs for the sums or for dw, chosen once a tile.
template <class Element, class Acc, class Coords, class Column>
__device__ __forceinline__ void store_weight_pairs_to(ConvBwdWeightParams const& bp,
                                                      int32_t group, int32_t first_k,
                                                      int32_t first_n, Acc const& acc,
                                                      Coords const& coords, int32_t pair_first,
                                                      int32_t pair_step, int32_t row_length,
                                                      bool aligned, Column const& column) {
  if (bp.accum != nullptr) {
    store_weight_pairs<Element, true>(bp, group, first_k, first_n, acc, coords, pair_first,
                                      pair_step, row_length, aligned, column);
  } else {
    store_weight_pairs<Element, false>(bp, group, first_k, first_n, acc, coords, pair_first,
                                       pair_step, row_length, aligned, column);
  }
}

// The thread's pairs of accumulator elements p with p % pair_step ==
// pair_first (all by default). Element by element, with three run-time
// divisions each, packed tiles' epilogue held about two thirds of the TMA
// kernel's warp samples on ResNeXt's groups of 32 (NOTES 128): pairs where the
// layouts allow them, the element-by-element stores elsewhere. `div`: the
// launcher's divisors of bp's packed groups.
template <class Element, class Acc, class Coords>
__device__ __forceinline__ void store_weight_tile(ConvBwdWeightParams const& bp,
                                                  PackedWeightDivisors const& div, int32_t group,
                                                  int32_t first_k, int32_t first_n,
                                                  Acc const& acc, Coords const& coords,
                                                  int32_t pair_first = 0,
                                                  int32_t pair_step = 1) {
  using namespace cute;
  ConvFwdParams const& p = bp.conv;
  if (bp.pack == 1 && bp.paired_stores) {
    // The reduction is even and dw 4-byte aligned (the launcher checks both).
    store_weight_pairs_to<Element>(bp, group, first_k, first_n, acc, coords, pair_first,
                                   pair_step, p.reduction, true,
                                   [](int32_t, int32_t n) { return n; });
    return;
  }
  if (bp.pack > 1) {
    const PackedWeightShifts shifts(bp);
    if (shifts.usable) {
      const bool aligned = reinterpret_cast<uintptr_t>(p.w) % 4 == 0;
      store_weight_pairs_to<Element>(
          bp, group, first_k, first_n, acc, coords, pair_first, pair_step, bp.group_reduction,
          aligned, [&](int32_t k, int32_t n) { return shifts.column(bp, k, n); });
      return;
    }
    CUTE_UNROLL
    for (int i = 0; i < size(acc); i += 2) {
      if ((i / 2) % pair_step != pair_first) continue;
      const int32_t k = first_k + get<0>(coords(i));
      const int32_t n = first_n + get<1>(coords(i));
      if (k >= p.out_channels || n >= p.reduction) continue;
      store_packed_weight<Element>(bp, div, group, k, n, acc(i));
      if (n + 1 < p.reduction) store_packed_weight<Element>(bp, div, group, k, n + 1, acc(i + 1));
    }
    return;
  }
  const int64_t group_offset = int64_t(group) * p.out_channels * p.reduction;
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 2) {
    if ((i / 2) % pair_step != pair_first) continue;
    const int32_t k = first_k + get<0>(coords(i));
    const int32_t n = first_n + get<1>(coords(i));
    if (k >= p.out_channels || n >= p.reduction) continue;
    const int64_t offset = group_offset + int64_t(k) * p.reduction + n;
    store_weight_value<Element>(bp, offset, acc(i));
    if (n + 1 < p.reduction) store_weight_value<Element>(bp, offset + 1, acc(i + 1));
  }
}

// The split CTAs of a cluster (bp.cluster_sum: the grid's y, one split
// each) hold partial sums of the same tile in the same fragment layout.
// Each thread writes its fragment to `scratch` (kTileM x kTileN floats of
// the CTA's shared memory, free once the cluster's first barrier shows every
// product done); then CTA r of n adds every CTA's values for its pairs r, r +
// n, ... in rank order and stores them into dw. `thread` of `threads` in the
// CTA hold accumulators; the last barrier keeps each CTA's shared memory until
// the others have read it.
template <class Element, class Acc, class Coords>
__device__ __forceinline__ void cluster_sum_weight_tile(ConvBwdWeightParams const& bp,
                                                        PackedWeightDivisors const& div,
                                                        int32_t group, int32_t first_k,
                                                        int32_t first_n, Acc& acc,
                                                        Coords const& coords, float* scratch,
                                                        int thread, int threads) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using namespace cute;
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  __syncwarp();  // the barriers are warp-aligned
  cute::cluster_sync();
  CUTE_UNROLL
  for (int i = 0; i < size(acc); ++i) scratch[i * threads + thread] = acc(i);
  cute::cluster_sync();
  const int32_t ranks = int32_t(cluster.num_blocks());
  const int32_t rank = int32_t(cluster.block_rank());
  CUTE_UNROLL
  for (int i = 0; i < size(acc); ++i) acc(i) = 0.f;
  for (int32_t r = 0; r < ranks; ++r) {
    const float* remote = cluster.map_shared_rank(scratch, r) + thread;
    CUTE_UNROLL
    for (int i = 0; i < size(acc); i += 2) {
      if ((i / 2) % ranks != rank) continue;
      acc(i) += remote[i * threads];
      acc(i + 1) += remote[(i + 1) * threads];
    }
  }
  store_weight_tile<Element>(bp, div, group, first_k, first_n, acc, coords, rank, ranks);
  __syncwarp();
  cute::cluster_sync();
#else
  __trap();  // the launcher forms clusters for sm_90 code only
#endif
}

// The TMA kernel's split CTAs of a cluster (bp.cluster_sum: the grid's y,
// one split each) add their partial kTileM x kTileN tiles through `scratch`
// (its operand stages; cluster_split_sum) and store dw: 16-byte runs of 8
// reduction columns where dw is unpacked and they fit, else element by
// element. Called by each of `threads` consumer threads once its products are
// done. The launcher gives each cluster one tile (no group loop).
template <int kTileM, int kTileN, class Element, class Acc, class Coords>
__device__ __forceinline__ void store_weight_tile_split_sum(ConvBwdWeightParams const& bp,
                                                            PackedWeightDivisors const& div,
                                                            int32_t group, int32_t first_k,
                                                            int32_t first_n, Acc const& acc,
                                                            Coords const& coords, float* scratch,
                                                            int thread, int threads) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  ConvFwdParams const& p = bp.conv;
  Element* dw = static_cast<Element*>(const_cast<void*>(p.w));
  const bool aligned = reinterpret_cast<uintptr_t>(dw) % 16 == 0;
  const bool runs = bp.pack == 1 && p.reduction % 8 == 0 && aligned;
  const int64_t group_offset = int64_t(group) * p.out_channels * p.reduction;
  // Groups of 8 or more input channels, a power of two: a run of 8 columns is
  // one group's 8 adjacent channels of one tap, at an offset that is a
  // multiple of 8.
  const PackedWeightShifts shifts(bp);
  const bool packed_runs = shifts.usable && bp.group_in_channels >= 8;
  cluster_split_sum<kTileM, kTileN>(
      acc, coords, scratch, int32_t(blockIdx.y), int32_t(gridDim.y), thread, threads,
      [&](int row, int run, float const (&sum)[8]) {
        const int32_t k = first_k + row;
        const int32_t n = first_n + run * 8;
        if (k >= p.out_channels || n >= p.reduction) return;
        if (packed_runs) {
          const int32_t column = shifts.column(bp, k, n);
          if (column < 0) return;
          Element* dst = dw + (int64_t(group) * p.out_channels + k) * bp.group_reduction + column;
          if (aligned) {
            *reinterpret_cast<uint4*>(dst) = pack_eight<Element>(sum);
          } else {
            for (int e = 0; e < 8; ++e) dst[e] = Element(sum[e]);
          }
          return;
        }
        if (bp.pack > 1) {
          for (int e = 0; e < 8 && n + e < p.reduction; ++e) {
            store_packed_weight<Element>(bp, div, group, k, n + e, sum[e]);
          }
          return;
        }
        Element* dst = dw + group_offset + int64_t(k) * p.reduction + n;
        if (runs) {
          *reinterpret_cast<uint4*>(dst) = pack_eight<Element>(sum);
        } else {
          for (int e = 0; e < 8 && n + e < p.reduction; ++e) dst[e] = Element(sum[e]);
        }
      });
#else
  __trap();  // the launcher forms clusters for sm_90 code only
#endif
}

}  // namespace ckfmha::kernel::conv_detail
