// The implicit-GEMM backward-weight kernels' split plans, finished inside the
// kernel: the CTAs that share a tile of dw (the grid's y, one split of the
// positions each) add their partial sums into the zeroed fp32 workspace, and
// the one that finishes last, as the tile's counter tells it, converts the
// tile's sums into dw. The conversion had been a launch of its own after the
// kernel, with the zeroing before it 1-1.8 us of a graph on the H200 (NOTES
// 127); the zeroing stays, and now covers the counters too.
#pragma once

#include "ckfmha/kernel/conv/bwd_weight_store.cuh"
#include "ckfmha/kernel/params/conv_params.h"

#include <cute/config.hpp>

#include <cstdint>

namespace ckfmha::kernel::conv_detail {

// Loads a thread has in flight at once while it converts: each batch waits
// one trip to L2. Eight raised the spills of the mma.sync kernel's 128 x 128
// tile on sm_80 (0 -> 20 bytes), and none on sm_90.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr int kSplitFinishBatch = 4;
#else
constexpr int kSplitFinishBatch = 8;
#endif

// The tile's kTileM x kTileN elements, kThreads threads a step along its
// rows (compile-time steps: a loop over the rows x cols that lie in the
// problem, counted at run time, raised the spills of the 128-register wgmma
// kernels): element (r, c) of those goes from the sums to dw at offset(k, n)
// (-1: nowhere, a packed tile's product of two different groups).
template <class Element, int kTileM, int kTileN, int kThreads, class Offset>
__device__ __forceinline__ void convert_split_elements(ConvBwdWeightParams const& bp,
                                                       int32_t first_k, int32_t first_n,
                                                       int32_t rows, int32_t cols, int thread,
                                                       Offset const& offset) {
  Element* dw = static_cast<Element*>(const_cast<void*>(bp.conv.w));
  constexpr int kElements = kTileM * kTileN;
  constexpr int kSteps = (kElements + kThreads - 1) / kThreads;
  for (int first = 0; first < kSteps; first += kSplitFinishBatch) {
    int64_t place[kSplitFinishBatch];
    float value[kSplitFinishBatch];
    CUTE_UNROLL
    for (int i = 0; i < kSplitFinishBatch; ++i) {
      const int index = (first + i) * kThreads + thread;
      const int r = index / kTileN;
      const int c = index % kTileN;
      place[i] = first + i < kSteps && index < kElements && r < rows && c < cols
                     ? offset(first_k + r, first_n + c)
                     : -1;
      // The sums were added at L2, where the cache-global load reads them.
      value[i] = place[i] >= 0 ? __ldcg(bp.accum + place[i]) : 0.f;
    }
    CUTE_UNROLL
    for (int i = 0; i < kSplitFinishBatch; ++i) {
      if (place[i] >= 0) dw[place[i]] = Element(value[i]);
    }
  }
}

// The tile's sums into dw, by the kThreads threads that finished it, an
// element a load. Inlined: as a call, the saves around it raised the spills of
// the 128-register wgmma kernels (52 -> 72 bytes stored on 128 x 128), and it
// spilled of its own; 16-byte loads of unpacked rows raised them more.
template <class Element, int kTileM, int kTileN, int kThreads>
__device__ __forceinline__ void convert_split_tile(ConvBwdWeightParams const& bp, int32_t group,
                                                int32_t first_k, int32_t first_n, int thread) {
  ConvFwdParams const& p = bp.conv;
  const int32_t rows = min(kTileM, p.out_channels - first_k);
  const int32_t cols = min(kTileN, p.reduction - first_n);
  if (bp.pack == 1) {
    const int64_t group_offset = int64_t(group) * p.out_channels * p.reduction;
    convert_split_elements<Element, kTileM, kTileN, kThreads>(
        bp, first_k, first_n, rows, cols, thread,
        [&](int32_t k, int32_t n) { return group_offset + int64_t(k) * p.reduction + n; });
    return;
  }
  const PackedWeightDivisors div(bp);
  convert_split_elements<Element, kTileM, kTileN, kThreads>(
      bp, first_k, first_n, rows, cols, thread,
      [&](int32_t k, int32_t n) { return packed_weight_offset(bp, div, group, k, n); });
}

// Called by the kThreads threads of the CTA that added its partial tile into
// bp.accum (whole warps, thread 0 among them) once each has added its share;
// `sync` is a barrier of exactly those threads. Counts the CTA's split done
// on the tile's counter, and where it is the last of the grid's y splits,
// converts the tile's sums into dw.
template <class Element, int kTileM, int kTileN, int kThreads, class Sync>
__device__ __forceinline__ void finish_split_tile(ConvBwdWeightParams const& bp, int32_t group,
                                                  int32_t first_k, int32_t first_n,
                                                  int thread, Sync const& sync) {
  __shared__ uint32_t last;
  // This thread's adds reach the whole device before its CTA counts itself.
  __threadfence();
  sync();
  if (thread == 0) {
    uint32_t* counter = bp.tile_counters + (int64_t(group) * gridDim.x + blockIdx.x);
    last = atomicAdd(counter, 1u) == gridDim.y - 1 ? 1u : 0u;
  }
  sync();
  // `last` is written again only past the next call's first barrier, which
  // every thread reaches after reading it here.
  if (last == 0) return;
  // The other splits fenced their adds before counting, and this CTA's count
  // came after theirs.
  __threadfence();
  convert_split_tile<Element, kTileM, kTileN, kThreads>(bp, group, first_k, first_n, thread);
}

}  // namespace ckfmha::kernel::conv_detail
