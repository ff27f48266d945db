// The TMA forward's reduction split over the CTAs of a cluster
// (ConvFwdTmaParams::split_shift > 0, conv_fwd_tma_splits): every CTA of a
// cluster takes the same output tile, rank r multiplies its run of the
// k-tiles, and the partial sums meet in shared memory. The operand stages
// hold them: the producer waits at the same cluster barriers as the
// consumers, so no copy lands in a stage between the last k-tile and the
// next tile's loads. The launcher gives each cluster one tile; the kernel
// still walks several correctly.
#pragma once

#include "ckfmha/kernel/conv/gather.cuh"
#include "ckfmha/kernel/params/conv_params.h"

#include <cooperative_groups.h>
#include <cute/tensor.hpp>

#include <cstdint>

namespace ckfmha::kernel::conv_detail {

// Every thread of the cluster that has not exited arrives: whole consumer
// warps (the .aligned form, which keeps the compiler's uniform registers: the
// form for lone threads cost the k-tile loops theirs) and the lone producer
// thread (the form for any thread). arrive releases this thread's
// shared-memory writes; wait acquires the others'.
template <bool kWholeWarp>
__device__ __forceinline__ void conv_cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kWholeWarp) {
    asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;\n" :::
                     "memory");
  } else {
    asm volatile("barrier.cluster.arrive;\n\tbarrier.cluster.wait;\n" ::: "memory");
  }
#endif
}

// This CTA's share of a tile's k-tiles: [begin, end) of `count`, and the
// stride and first of the tiles its cluster walks.
struct ConvSplitRange {
  int32_t rank;
  int32_t splits;
  int32_t begin;
  int32_t end;
  int64_t first_tile;
  int64_t tile_step;
};

// The launcher's clusters are 2^split_shift CTAs along x, so a CTA's rank
// is blockIdx.x's low bits; the first `k_tiles mod splits` ranks take one
// k-tile more. Shifts and masks, no division: the k-tile loops' counters
// then stay in the compiler's uniform registers, as unsplit (a division by
// the split count, or the cluster's rank register, put them in per-thread
// ones, with more instructions around each k-tile's products).
__device__ __forceinline__ ConvSplitRange conv_split_range(int32_t split_shift,
                                                          int32_t k_tiles) {
  ConvSplitRange r;
  r.splits = 1 << split_shift;
  r.rank = int32_t(blockIdx.x & unsigned(r.splits - 1));
  const int32_t base = k_tiles >> split_shift;
  const int32_t extra = k_tiles & (r.splits - 1);
  r.begin = r.rank * base + min(r.rank, extra);
  r.end = r.begin + base + (r.rank < extra ? 1 : 0);
  r.first_tile = blockIdx.x >> split_shift;
  r.tile_step = gridDim.x >> split_shift;
  return r;
}

// The shared-memory floats the split sum stages a tile in: each rank owns
// kTileM / splits rows of the tile, and its scratch holds one slot of those
// rows per rank, slot q's rows from rank q. Rows are padded by 8 floats, so
// that a warp's pairs of accumulators (8 rows x 4 pairs a write) fall on
// distinct banks.
template <int kTileM, int kTileN>
struct ConvSplitScratch {
  static constexpr int kPitch = kTileN + 8;
  static constexpr int kBytes = kTileM * kPitch * 4;
};

// Called by every consumer thread once the CTA's products of the tile are
// done (no wgmma reads the stages). Past a first cluster barrier (every rank's
// products are done, so its stages are free), writes each accumulator pair
// into the slot of this rank in the scratch of the rank that owns its row (a
// store into another CTA's shared memory waits on nothing, where a load
// would wait a round trip a rank), then, past a second, adds its own rows'
// slots in rank order and stores them as 16-byte runs of 8 channels.
// `more`: the cluster takes another tile, whose partial sums must wait until
// every rank has read this one's (a third barrier; the producer waits at all
// three).
template <class Traits, class Acc, class Coords>
__device__ __forceinline__ void store_tile_split_sum(ConvFwdParams const& p, ConvRow const* rows,
                                                     typename Traits::Element* y_group,
                                                     int32_t first_channel, Acc const& acc,
                                                     Coords const& coords, float* scratch,
                                                     ConvSplitRange const& range, bool more,
                                                     int thread) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kPitch = ConvSplitScratch<Traits::kTileM, Traits::kTileN>::kPitch;
  constexpr int kRuns = Traits::kTileN / 8;
  static_assert(Traits::kTileM % kTmaFwdMaxSplits == 0, "whole rows a rank");
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  const int owned = Traits::kTileM / range.splits;  // rows a rank owns
  conv_cluster_barrier<true>();
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 2) {
    const int r = get<0>(coords(i));
    const int c = get<1>(coords(i));
    const int owner = r / owned;
    float* slot = cluster.map_shared_rank(scratch, owner) + range.rank * owned * kPitch;
    *reinterpret_cast<float2*>(slot + (r - owner * owned) * kPitch + c) =
        make_float2(acc(i), acc(i + 1));
  }
  conv_cluster_barrier<true>();
  for (int v = thread; v < owned * kRuns; v += Traits::kConsumerThreads) {
    const int local = v / kRuns;
    const int run = v % kRuns;
    const int64_t y_base = rows[range.rank * owned + local].y_base;
    const int32_t channel = first_channel + run * 8;
    if (y_base < 0 || channel >= p.out_channels) continue;
    float sum[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    CUTE_UNROLL
    for (int q = 0; q < kTmaFwdMaxSplits; ++q) {
      if (q >= range.splits) break;
      const float4* src =
          reinterpret_cast<const float4*>(scratch + (q * owned + local) * kPitch + run * 8);
      const float4 lo = src[0];
      const float4 hi = src[1];
      sum[0] += lo.x, sum[1] += lo.y, sum[2] += lo.z, sum[3] += lo.w;
      sum[4] += hi.x, sum[5] += hi.y, sum[6] += hi.z, sum[7] += hi.w;
    }
    uint4 value;
    uint32_t* words = reinterpret_cast<uint32_t*>(&value);
    CUTE_UNROLL
    for (int e = 0; e < 4; ++e) {
      words[e] = uint32_t(Element(sum[2 * e]).raw()) |
                 (uint32_t(Element(sum[2 * e + 1]).raw()) << 16);
    }
    Element* dst = y_group + y_base + channel;
    if (p.vector_stores && channel + 8 <= p.out_channels) {
      *reinterpret_cast<uint4*>(dst) = value;
    } else {
      for (int e = 0; e < 8 && channel + e < p.out_channels; ++e) dst[e] = Element(sum[e]);
    }
  }
  // Every rank has read its slots: the next tile may write them, and the
  // producers load into the stages again.
  if (more) conv_cluster_barrier<true>();
#endif
}

}  // namespace ckfmha::kernel::conv_detail
