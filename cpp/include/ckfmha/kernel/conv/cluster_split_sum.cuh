// Partial sums of one wgmma accumulator tile added over the CTAs of a
// cluster (sm_90): each of `splits` ranks multiplied its share of the
// reduction into the same tile. Each rank owns a band of the tile's rows; a
// rank pushes every partial sum into the owner's shared memory (a store into
// another CTA's shared memory waits on nothing, where a load would wait a
// round trip a rank), and each owner adds its band's slots in rank order.
// The TMA forward (fwd_tma_split.cuh) and the TMA backward-weight
// (bwd_weight_tma_kernel.cuh) stage the slots in their operand stages, free
// once every rank's products are done.
#pragma once

#include "ckfmha/kernel/params/conv_params.h"

#include <cooperative_groups.h>
#include <cute/tensor.hpp>

#include <algorithm>
#include <cstdint>

namespace ckfmha::kernel::conv_detail {

// Shared memory that keeps a second CTA off an SM (two CTAs and the system's
// KiB each would need more than its 228 KiB).
constexpr int kConvOneCtaPerSmBytes = 115 * 1024;

// The dynamic shared memory a cluster launch of `ctas` CTAs asks for on `sms`
// SMs: where they are at most the SMs, enough that each takes an SM of its own,
// the cluster capacity the planner counts (a kernel that fits two CTAs an SM
// could otherwise have a cluster's CTAs placed two to an SM beside idle ones).
// Timed the same as the default placement on the plans that cluster (NOTES 127).
inline int conv_cluster_spread_smem(int smem, int64_t ctas, int sms) {
  return ctas <= sms ? std::max(smem, kConvOneCtaPerSmBytes) : smem;
}

// Every thread of the cluster that has not exited arrives: whole consumer
// warps (the .aligned form, which keeps the compiler's uniform registers: the
// form for lone threads cost the forward's k-tile loops theirs) and lone
// producer threads (the form for any thread). arrive releases this thread's
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

// The slots of a kTileM x kTileN float tile: rank r owns rows [r * owned,
// (r + 1) * owned), and its scratch holds one slot of those rows per rank,
// slot q's from rank q (conv_split_scratch_bytes). Rows are padded by 8 floats
// (conv_split_scratch_pitch), so that a warp's pairs of accumulators (8 rows x
// 4 pairs a write) spread over the banks.
template <int kTileM, int kTileN>
struct ConvSplitScratch {
  static constexpr int kPitch = int(conv_split_scratch_pitch(kTileN));
  static constexpr int kRuns = kTileN / 8;  // 8-column runs a row
  static_assert(kTileN % 8 == 0, "whole 8-column runs");

  __device__ static int owned_rows(int splits) { return (kTileM + splits - 1) / splits; }
};

// Called by every consumer thread (whole warps) once its CTA's products of the
// tile are done and no wgmma reads `scratch`'s bytes. Past a first cluster
// barrier (every rank's products are done, so every owner's scratch is free)
// writes each accumulator pair into this rank's slot at the owner of its row;
// past a second, calls store(row, run, sum) for each 8-column run of the
// rows this rank owns (thread, thread + threads, ...), `sum` the slots' total
// in rank order. The caller keeps the scratch until no rank reads it (a third
// barrier where the cluster takes another tile).
template <int kTileM, int kTileN, class Acc, class Coords, class Store>
__device__ __forceinline__ void cluster_split_sum(Acc const& acc, Coords const& coords,
                                                  float* scratch, int32_t rank, int32_t splits,
                                                  int thread, int threads, Store&& store) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using namespace cute;
  using Scratch = ConvSplitScratch<kTileM, kTileN>;
  constexpr int kPitch = Scratch::kPitch;
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  const int owned = Scratch::owned_rows(splits);
  conv_cluster_barrier<true>();
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 2) {
    const int r = get<0>(coords(i));
    const int c = get<1>(coords(i));
    const int owner = r / owned;
    float* slot = cluster.map_shared_rank(scratch, owner) + rank * owned * kPitch;
    *reinterpret_cast<float2*>(slot + (r - owner * owned) * kPitch + c) =
        make_float2(acc(i), acc(i + 1));
  }
  conv_cluster_barrier<true>();
  const int rows = min(owned, kTileM - rank * owned);
  for (int v = thread; v < rows * Scratch::kRuns; v += threads) {
    const int local = v / Scratch::kRuns;
    const int run = v % Scratch::kRuns;
    float sum[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    CUTE_UNROLL
    for (int q = 0; q < kConvMaxClusterSplits; ++q) {
      if (q >= splits) break;
      const float4* src =
          reinterpret_cast<const float4*>(scratch + (q * owned + local) * kPitch + run * 8);
      const float4 lo = src[0];
      const float4 hi = src[1];
      sum[0] += lo.x, sum[1] += lo.y, sum[2] += lo.z, sum[3] += lo.w;
      sum[4] += hi.x, sum[5] += hi.y, sum[6] += hi.z, sum[7] += hi.w;
    }
    store(rank * owned + local, run, sum);
  }
#endif
}

// Eight sums as 16 bytes of 16-bit elements.
template <class Element>
__device__ __forceinline__ uint4 pack_eight(float const (&sum)[8]) {
  uint4 value;
  uint32_t* words = reinterpret_cast<uint32_t*>(&value);
  CUTE_UNROLL
  for (int e = 0; e < 4; ++e) {
    words[e] = uint32_t(Element(sum[2 * e]).raw()) |
               (uint32_t(Element(sum[2 * e + 1]).raw()) << 16);
  }
  return value;
}

}  // namespace ckfmha::kernel::conv_detail
