// Grouped convolution backward-weight as an implicit GEMM on the tensor cores
// of sm_90a: the sm80 kernel's position tables and gathers, with the products
// issued as asynchronous wgmma batches from channel-major shared memory.
// Every warp both gathers and multiplies. A k-tile's batch is short (a 64 x
// TileN x 64 product a warpgroup) and its gathers long, so the kernel waits
// for each batch before the next barrier and keeps the copies of all the
// other stages in flight: Stages - 1 tiles ahead, where waiting on the batch
// one step later would cost a stage of prefetch. The next tile's position
// table is decoded while the batch runs.
#pragma once

#include "ckfmha/kernel/conv/bwd_weight_loader.cuh"
#include "ckfmha/kernel/conv/bwd_weight_sm90_traits.cuh"
#include "ckfmha/kernel/conv/bwd_weight_store.cuh"
#include "ckfmha/kernel/conv/gather.cuh"
#include "ckfmha/kernel/conv/wgmma_batch.cuh"
#include "ckfmha/kernel/params/conv_params.h"

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <cstdint>

namespace ckfmha::kernel {

// Grid: x = (K tiles) x (reduction tiles), y = splits of the positions,
// z = groups (past 65535 they loop in the CTA), as the sm80 kernel's.
template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinCtasPerSm)
    conv_bwd_weight_sm90_kernel(ConvBwdWeightGemmParams const __grid_constant__ gp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using namespace conv_detail;
  using Element = typename Traits::Element;
  constexpr int kTileM = Traits::kTileM;
  constexpr int kTileN = Traits::kTileN;
  constexpr int kTileK = Traits::kTileK;
  constexpr int kStages = Traits::kStages;
  constexpr int kAhead = Traits::kLoadsAhead;
  constexpr int kThreads = Traits::kThreads;
  constexpr int kDims = Traits::kSpatialDims;
  ConvBwdWeightParams const& bp = gp.weight;
  ConvFwdParams const& p = bp.conv;

  extern __shared__ __align__(1024) char smem[];
  Element* smem_a = reinterpret_cast<Element*>(smem);
  Element* smem_b = smem_a + cosize_v<typename Traits::SmemLayoutA>;
  ConvRow* tables = reinterpret_cast<ConvRow*>(smem + Traits::kSmemBytes);  // [2][kTileK]
  Tensor sA = make_tensor(make_smem_ptr(smem_a), typename Traits::SmemLayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(smem_b), typename Traits::SmemLayoutB{});

  const int tid = threadIdx.x;
  const int32_t tiles_k_out = (p.out_channels + kTileM - 1) / kTileM;
  const int32_t first_k = int32_t(blockIdx.x % tiles_k_out) * kTileM;
  const int32_t first_n = int32_t(blockIdx.x / tiles_k_out) * kTileN;
  const int64_t position_tiles = (p.rows + kTileK - 1) / kTileK;
  const int64_t tile_begin = int64_t(blockIdx.y) * bp.tiles_per_split;
  const int64_t tile_end = cute::min(tile_begin + bp.tiles_per_split, position_tiles);
  const int32_t k_tiles = tile_end > tile_begin ? int32_t(tile_end - tile_begin) : 0;

  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tid);
  Tensor tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(sA));  // (MMA, M, K, stage)
  Tensor tCrB = thr_mma.make_fragment_B(thr_mma.partition_B(sB));
  Tensor acc = partition_fragment_C(tiled_mma, Shape<Int<kTileM>, Int<kTileN>>{});

  // Tile t's positions into its table slot.
  PositionDecoder const& decode = gp.positions;
  auto fill = [&](int32_t t) {
    fill_positions<kDims, kTileK, kThreads>(p, decode, (tile_begin + t) * kTileK,
                                            tables + (t % 2) * kTileK);
  };

  for (int32_t group = blockIdx.z; group < p.groups; group += gridDim.z) {
    __syncthreads();  // the last group's reads of the stages and tables are done
    ConvBwdWeightLoader<Traits> load_tile(p, group, first_k, first_n, tid, smem_a, smem_b);
    if (k_tiles > 0) fill(0);
    // Each tile's table is published by a barrier before its loads are
    // issued; the slot a fill reuses was read by loads issued before that
    // barrier.
    CUTE_UNROLL
    for (int t = 0; t < kAhead; ++t) {
      __syncthreads();
      if (t < k_tiles) {
        load_tile(p, tables + (t % 2) * kTileK, t);
        if (t + 1 < k_tiles) fill(t + 1);
      }
      cp_async_fence();
    }
    clear(acc);
    for (int32_t k_tile = 0; k_tile < k_tiles; ++k_tile) {
      cp_async_wait<kAhead - 1>();
      // cp.async writes through the generic proxy, wgmma reads through the
      // async one.
      cutlass::arch::fence_view_async_shared();
      // Tile k_tile has landed everywhere, every warpgroup has finished the
      // batch of tile k_tile - 1, whose stage the next gathers reuse, and the
      // table of tile k_tile + kAhead is written.
      __syncthreads();
      const int32_t ahead = k_tile + kAhead;
      if (ahead < k_tiles) load_tile(p, tables + (ahead % 2) * kTileK, ahead % kStages);
      cp_async_fence();
      const int stage = k_tile % kStages;
      issue_wgmma_batch(tiled_mma, tCrA, tCrB, stage, acc);
      // The slot it reuses held tile ahead - 1's table, whose loads were
      // issued before this iteration's barrier.
      if (ahead + 1 < k_tiles) fill(ahead + 1);
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc);
    }
    cp_async_wait<0>();
    Tensor coords = thr_mma.partition_C(make_identity_tensor(Shape<Int<kTileM>, Int<kTileN>>{}));
    if (bp.cluster_sum) {
      // The stages (and tables) hold the CTA's partial tile once the
      // cluster's first barrier shows every copy and product done.
      cluster_sum_weight_tile<Element>(bp, gp.packed, group, first_k, first_n, acc, coords,
                                       reinterpret_cast<float*>(smem), tid, kThreads);
      continue;
    }
    // A split with no positions adds nothing; one split stores zeros then.
    if (k_tiles == 0 && bp.accum != nullptr) continue;
    store_weight_tile<Element>(bp, gp.packed, group, first_k, first_n, acc, coords);
  }
#endif
}

}  // namespace ckfmha::kernel
