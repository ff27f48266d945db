// Grouped convolution backward-weight as an implicit GEMM on the sm80 path:
// per group dw[K, taps * C] = sum over positions of dy[pos, K]^T x[pos + tap, C].
// A CTA owns a TileM x TileN tile of one group's dw and reduces one split's
// range of positions, TileK a stage. Each stage's positions are decoded once
// into a table in shared memory (batch offset, first input coordinates, dy
// offset), which every thread's gathers read; two slots let the next tile's
// table be written while the current one is issued.
#pragma once

#include "ckfmha/kernel/conv/bwd_weight_loader.cuh"
#include "ckfmha/kernel/conv/bwd_weight_store.cuh"
#include "ckfmha/kernel/conv/bwd_weight_traits.cuh"
#include "ckfmha/kernel/conv/gather.cuh"
#include "ckfmha/kernel/params/conv_params.h"

#include <cute/tensor.hpp>

#include <cstdint>

namespace ckfmha::kernel {

// Grid: x = (K tiles) x (reduction tiles), y = splits of the positions,
// z = groups (past 65535 they loop in the CTA).
template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads)
    conv_bwd_weight_sm80_kernel(ConvBwdWeightGemmParams const __grid_constant__ gp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using namespace cute;
  using namespace conv_detail;
  using Element = typename Traits::Element;
  constexpr int kTileM = Traits::kTileM;
  constexpr int kTileN = Traits::kTileN;
  constexpr int kTileK = Traits::kTileK;
  constexpr int kStages = Traits::kStages;
  constexpr int kThreads = Traits::kThreads;
  constexpr int kDims = Traits::kSpatialDims;
  ConvBwdWeightParams const& bp = gp.weight;
  ConvFwdParams const& p = bp.conv;

  extern __shared__ __align__(128) char smem[];
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
  auto thr_mma = tiled_mma.get_slice(tid);
  Tensor tCrA = thr_mma.partition_fragment_A(sA(_, _, 0));
  Tensor tCrB = thr_mma.partition_fragment_B(sB(_, _, 0));
  Tensor acc = partition_fragment_C(tiled_mma, Shape<Int<kTileM>, Int<kTileN>>{});
  auto s2r_a = make_tiled_copy_A(typename Traits::SmemLoadAtom{}, tiled_mma);
  auto s2r_b = make_tiled_copy_B(typename Traits::SmemLoadAtom{}, tiled_mma);
  auto thr_s2r_a = s2r_a.get_slice(tid);
  auto thr_s2r_b = s2r_b.get_slice(tid);
  Tensor tXsA = thr_s2r_a.partition_S(sA);
  Tensor tXrA = thr_s2r_a.retile_D(tCrA);
  Tensor tXsB = thr_s2r_b.partition_S(sB);
  Tensor tXrB = thr_s2r_b.retile_D(tCrB);

  // Tile t's positions into its table slot.
  PositionDecoder const& decode = gp.positions;
  auto fill = [&](int32_t t) {
    fill_positions<kDims, kTileK, kThreads>(p, decode, (tile_begin + t) * kTileK,
                                            tables + (t % 2) * kTileK);
  };

  for (int32_t group = blockIdx.z; group < p.groups; group += gridDim.z) {
    __syncthreads();  // the last group's reads of the stages and tables are done
    ConvBwdWeightLoader<Traits> load_tile(p, group, first_k, first_n, tid, smem_a, smem_b);
    clear(acc);
    if (k_tiles > 0) fill(0);
    // Each tile's table is published by the barrier before its loads are
    // issued; the slot it reuses was read by loads issued before that barrier.
    CUTE_UNROLL
    for (int stage = 0; stage < kStages - 1; ++stage) {
      __syncthreads();
      if (stage < k_tiles) {
        load_tile(p, tables + (stage % 2) * kTileK, stage);
        if (stage + 1 < k_tiles) fill(stage + 1);
      }
      cp_async_fence();
    }
    for (int32_t k_tile = 0; k_tile < k_tiles; ++k_tile) {
      cp_async_wait<kStages - 2>();
      __syncthreads();  // tile k_tile has landed; the stage it replaces is consumed
      const int32_t next = k_tile + kStages - 1;
      if (next < k_tiles) {
        load_tile(p, tables + (next % 2) * kTileK, next % kStages);
        if (next + 1 < k_tiles) fill(next + 1);
      }
      cp_async_fence();
      const int stage = k_tile % kStages;
      CUTE_UNROLL
      for (int kk = 0; kk < size<2>(tCrA); ++kk) {
        copy(s2r_a, tXsA(_, _, kk, stage), tXrA(_, _, kk));
        copy(s2r_b, tXsB(_, _, kk, stage), tXrB(_, _, kk));
        gemm(tiled_mma, tCrA(_, _, kk), tCrB(_, _, kk), acc);
      }
    }
    cp_async_wait<0>();
    // A split with no positions adds nothing; one split stores zeros then.
    if (k_tiles == 0 && bp.accum != nullptr) continue;
    Tensor coords = thr_mma.partition_C(make_identity_tensor(Shape<Int<kTileM>, Int<kTileN>>{}));
    store_weight_tile<Element>(bp, gp.packed, group, first_k, first_n, acc, coords);
  }
#endif
}

}  // namespace ckfmha::kernel
