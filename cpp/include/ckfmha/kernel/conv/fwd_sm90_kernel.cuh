// Grouped convolution forward as an implicit GEMM on the tensor cores of
// sm_90a: the sm80 kernel's tiling and gathers (gather.cuh), with the products
// issued as asynchronous wgmma batches from shared memory. Every warp both
// gathers and multiplies: while a k-tile's batch runs, the warps wait for the
// next tile's copies and issue the gathers of the tile after it.
#pragma once

#include "ckfmha/kernel/conv/fwd_sm90_traits.cuh"
#include "ckfmha/kernel/conv/gather.cuh"
#include "ckfmha/kernel/conv/wgmma_batch.cuh"
#include "ckfmha/kernel/params/conv_params.h"

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <cstdint>

namespace ckfmha::kernel {

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinCtasPerSm)
    conv_fwd_sm90_kernel(ConvFwdParams const __grid_constant__ p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using namespace conv_detail;
  using Element = typename Traits::Element;
  constexpr int kTileM = Traits::kTileM;
  constexpr int kTileN = Traits::kTileN;
  constexpr int kTileK = Traits::kTileK;
  constexpr int kStages = Traits::kStages;
  constexpr int kAhead = Traits::kLoadsAhead;

  extern __shared__ __align__(1024) char smem[];
  Element* smem_a = reinterpret_cast<Element*>(smem);
  Element* smem_b = smem_a + cosize_v<typename Traits::SmemLayoutA>;
  ConvRow* rows = reinterpret_cast<ConvRow*>(smem + Traits::kSmemBytes);
  Tensor sA = make_tensor(make_smem_ptr(smem_a), typename Traits::SmemLayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(smem_b), typename Traits::SmemLayoutB{});

  const int tid = threadIdx.x;
  const int64_t first_row = int64_t(blockIdx.x) * kTileM;
  const int32_t first_channel = int32_t(blockIdx.y) * kTileN;
  const int32_t k_tiles = (p.reduction + kTileK - 1) / kTileK;
  fill_rows<Traits::kSpatialDims, kTileM, Traits::kThreads>(p, first_row, rows, tid);

  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tid);
  Tensor tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(sA));  // (MMA, M, K, stage)
  Tensor tCrB = thr_mma.make_fragment_B(thr_mma.partition_B(sB));
  Tensor acc = partition_fragment_C(tiled_mma, Shape<Int<kTileM>, Int<kTileN>>{});

  const Element* x = static_cast<const Element*>(p.x);
  const Element* w = static_cast<const Element*>(p.w);
  Element* y = static_cast<Element*>(p.y);

  // Groups beyond the grid's z extent (over 65535) loop in the same CTA.
  for (int32_t group = blockIdx.z; group < p.groups; group += gridDim.z) {
    const Element* x_group = x + int64_t(group) * p.in_channels;
    const Element* w_group;
    if constexpr (Traits::kFilterViewed) {
      w_group = w + int64_t(group) * p.filter_view.group + p.filter_view.first;
    } else {
      w_group = w + (int64_t(group) * p.out_channels) * p.reduction;
    }
    __syncthreads();  // the row table is written; the last group's products are done
    typename Traits::Loader load_tile(p, rows, x_group, w_group, first_channel, tid, smem_a,
                                     smem_b);

    CUTE_UNROLL
    for (int t = 0; t < kAhead; ++t) {
      if (t < k_tiles) load_tile(p, t);
      cp_async_fence();
    }
    clear(acc);
    for (int32_t k_tile = 0; k_tile < k_tiles; ++k_tile) {
      cp_async_wait<kAhead - 1>();
      // cp.async writes through the generic proxy, wgmma reads through the
      // async one.
      cutlass::arch::fence_view_async_shared();
      // Tile k_tile has landed everywhere, and every warpgroup has finished
      // the batch of tile k_tile - 2, whose stage the next gathers reuse.
      __syncthreads();
      const int32_t ahead = k_tile + kAhead;
      if (ahead < k_tiles) {
        load_tile(p, ahead % kStages);
      }
      cp_async_fence();
      const int stage = k_tile % kStages;
      issue_wgmma_batch(tiled_mma, tCrA, tCrB, stage, acc);
      warpgroup_wait<1>();
      warpgroup_fence_operand(acc);
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    cp_async_wait<0>();

    Tensor coords = thr_mma.partition_C(make_identity_tensor(Shape<Int<kTileM>, Int<kTileN>>{}));
    store_tile(p, rows, y + int64_t(group) * p.out_channels, first_channel, acc, coords);
  }
#endif
}

}  // namespace ckfmha::kernel
