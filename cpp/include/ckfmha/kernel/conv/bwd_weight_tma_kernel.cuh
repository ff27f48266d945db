// Grouped convolution backward-weight as an implicit GEMM fed by the
// tensor-copy engine (sm_90a). The gathering kernels (bwd_weight_sm90_kernel.cuh)
// spend most of their issue slots on position tables and per-thread copies
// (3.35x the instructions of cuDNN's kernel, NOTES 111); here one thread asks
// the copy engine for each k-tile of TileK consecutive positions: dy's output
// channels and, per 64-column chunk of the N tile, x's 64 channels of one
// filter tap, both in im2col mode (dy's walk is a 1x1 filter's), with zeros
// where a tap reads padding or a position lies past the batch. Consumer
// warpgroups wait on a stage's full barrier, multiply, and free the stage.
//
// Grid as the gathering kernels': x = (K tiles) x (N tiles), y = splits of
// the positions, z = groups (packed, conv_weight_pack; past 65535 they loop).
// A tile's splits add their partial sums into the zeroed fp32 workspace, or
// (bp.cluster_sum, few splits on few tiles) form one cluster along y that
// sums them through the operand stages and stores dw.
#pragma once

#include "ckfmha/kernel/conv/bwd_weight_loader.cuh"
#include "ckfmha/kernel/conv/bwd_weight_store.cuh"
#include "ckfmha/kernel/conv/bwd_weight_tma_traits.cuh"
#include "ckfmha/kernel/conv/wgmma_batch.cuh"
#include "ckfmha/kernel/params/conv_params.h"

#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <cstdint>

namespace ckfmha::kernel {

struct ConvBwdWeightTmaParams {
  ConvBwdWeightParams weight;
  PositionDecoder positions;
  PackedWeightDivisors packed;
  // x and dy as (channels of all groups, w, h, [d,] batch) for im2col copies
  // of kChunk channels and TileK positions, or, where a tensor's positions lie
  // one stride apart (flagged below), as (channels, positions) for plain
  // tiled copies: the copy engine's im2col mode moves fewer bytes a cycle, and
  // with both operands in it the main loop ran at about half the tensor
  // cores' rate. dy is such a matrix when dense; x where the filter is 1x1
  // at stride 1 without padding (its positions are the outputs').
  cute::TmaDescriptor x_map;
  cute::TmaDescriptor dy_map;
  int32_t x_rows;   // 1: x_map is tiled over positions
  int32_t dy_rows;  // 1: dy_map is tiled over positions
};

namespace conv_detail {

// Where a CTA's work lies: its first output channel and reduction column of
// the (packed) group, and its range of position k-tiles.
struct WeightTmaWork {
  int32_t first_k;
  int32_t first_n;
  int64_t tile_begin;
  int32_t k_tiles;
};

template <class Traits>
__device__ __forceinline__ WeightTmaWork weight_tma_work(ConvBwdWeightTmaParams const& params) {
  ConvFwdParams const& p = params.weight.conv;
  const int32_t tiles_k_out = (p.out_channels + Traits::kTileM - 1) / Traits::kTileM;
  WeightTmaWork w;
  w.first_k = int32_t(blockIdx.x % tiles_k_out) * Traits::kTileM;
  w.first_n = int32_t(blockIdx.x / tiles_k_out) * Traits::kTileN;
  const int64_t position_tiles = (p.rows + Traits::kTileK - 1) / Traits::kTileK;
  w.tile_begin = int64_t(blockIdx.y) * params.weight.tiles_per_split;
  const int64_t end = cute::min(w.tile_begin + params.weight.tiles_per_split, position_tiles);
  w.k_tiles = end > w.tile_begin ? int32_t(end - w.tile_begin) : 0;
  return w;
}

// Run by one thread: each k-tile's dy and x chunks of every group this CTA
// takes into the next free stage. Chunks past the channels or the reduction
// are not loaded: their rows of the product are never stored.
template <class Traits>
__device__ __forceinline__ void conv_bwd_weight_tma_load(ConvBwdWeightTmaParams const& params,
                                                         uint64_t* full, uint64_t* empty,
                                                         typename Traits::Element* smem_a,
                                                         typename Traits::Element* smem_b) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int kChunk = Traits::kChunk;
  constexpr int kStages = Traits::kStages;
  constexpr int kChunkElems = kChunk * Traits::kTileK;
  ConvFwdParams const& p = params.weight.conv;
  cute::prefetch_tma_descriptor(&params.x_map);
  cute::prefetch_tma_descriptor(&params.dy_map);
  const WeightTmaWork work = weight_tma_work<Traits>(params);
  // The N tile's chunks: each one tap's run of channels, fixed for the CTA.
  int32_t chunks_a = 0;
  int32_t chunks_b = 0;
  int32_t chunk_channel[Traits::kChunksB];
  uint16_t chunk_offset[Traits::kChunksB][3];
  CUTE_UNROLL
  for (int i = 0; i < Traits::kChunksA; ++i) {
    chunks_a += work.first_k + i * kChunk < p.out_channels ? 1 : 0;
  }
  CUTE_UNROLL
  for (int j = 0; j < Traits::kChunksB; ++j) {
    const int32_t n = work.first_n + j * kChunk;
    chunks_b += n < p.reduction ? 1 : 0;
    int32_t tap = n / p.in_channels;
    chunk_channel[j] = n - tap * p.in_channels;
    for (int d = 2; d >= 0; --d) {
      const int32_t next = tap / p.filter[d];
      chunk_offset[j][d] = uint16_t((tap - next * p.filter[d]) * p.dilation[d]);
      tap = next;
    }
  }
  const uint32_t bytes = uint32_t((chunks_a + chunks_b) * Traits::kChunkBytes);
  const uint64_t hint = uint64_t(cute::TMA::CacheHintSm90::EVICT_NORMAL);
  int count = 0;
  for (int32_t group = blockIdx.z; group < p.groups; group += gridDim.z) {
    for (int32_t k_tile = 0; k_tile < work.k_tiles; ++k_tile, ++count) {
      const int stage = count % kStages;
      Barrier::wait(&empty[stage], uint32_t(((count / kStages) & 1) ^ 1));
      Barrier::arrive_and_expect_tx(&full[stage], bytes);
      const int64_t first = (work.tile_begin + k_tile) * Traits::kTileK;
      int32_t position[3];
      const int32_t image = int32_t(params.positions(p, first, position));
      int32_t corner[3];
      for (int d = 0; d < 3; ++d) corner[d] = position[d] * p.stride[d] - p.padding[d];
      typename Traits::Element* a = smem_a + stage * Traits::kTileM * Traits::kTileK;
      typename Traits::Element* b = smem_b + stage * Traits::kTileN * Traits::kTileK;
      CUTE_UNROLL
      for (int i = 0; i < Traits::kChunksA; ++i) {
        if (i >= chunks_a) break;
        const int32_t channel = group * p.out_channels + work.first_k + i * kChunk;
        if (params.dy_rows) {
          cute::SM90_TMA_LOAD_2D::copy(&params.dy_map, &full[stage], hint, a + i * kChunkElems,
                                       channel, int32_t(first));
        } else if constexpr (Traits::kSpatialDims == 2) {
          cute::SM90_TMA_LOAD_IM2COL_4D::copy(&params.dy_map, &full[stage], a + i * kChunkElems,
                                              channel, position[2], position[1], image,
                                              uint16_t(0), uint16_t(0));
        } else {
          cute::SM90_TMA_LOAD_IM2COL_5D::copy(&params.dy_map, &full[stage], a + i * kChunkElems,
                                              channel, position[2], position[1], position[0],
                                              image, uint16_t(0), uint16_t(0), uint16_t(0));
        }
      }
      CUTE_UNROLL
      for (int j = 0; j < Traits::kChunksB; ++j) {
        if (j >= chunks_b) break;
        const int32_t channel = group * p.in_channels + chunk_channel[j];
        if (params.x_rows) {
          cute::SM90_TMA_LOAD_2D::copy(&params.x_map, &full[stage], hint, b + j * kChunkElems,
                                       channel, int32_t(first));
        } else if constexpr (Traits::kSpatialDims == 2) {
          cute::SM90_TMA_LOAD_IM2COL_4D::copy(&params.x_map, &full[stage], b + j * kChunkElems,
                                              channel, corner[2], corner[1], image,
                                              chunk_offset[j][2], chunk_offset[j][1]);
        } else {
          cute::SM90_TMA_LOAD_IM2COL_5D::copy(&params.x_map, &full[stage], b + j * kChunkElems,
                                              channel, corner[2], corner[1], corner[0], image,
                                              chunk_offset[j][2], chunk_offset[j][1],
                                              chunk_offset[j][0]);
        }
      }
    }
  }
}

}  // namespace conv_detail

// kClusterSum: the instance the launcher runs where a tile's splits form a
// cluster (bp.cluster_sum); the other carries none of that code, whose
// epilogue alone had slowed the workspace launches of packed groups by up to a
// third.
template <class Traits, bool kClusterSum>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinCtasPerSm)
    conv_bwd_weight_tma_kernel(ConvBwdWeightTmaParams const __grid_constant__ params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using namespace conv_detail;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using Element = typename Traits::Element;
  constexpr int kStages = Traits::kStages;
  constexpr int kConsumerThreads = Traits::kConsumerThreads;

  extern __shared__ __align__(1024) char smem[];
  Element* smem_a = reinterpret_cast<Element*>(smem);
  Element* smem_b = smem_a + cosize_v<typename Traits::SmemLayoutA>;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Traits::kSmemBytes);
  uint64_t* empty = full + kStages;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      Barrier::init(&full[s], 1);
      Barrier::init(&empty[s], kConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (threadIdx.x < 128) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if (threadIdx.x == 0) conv_bwd_weight_tma_load<Traits>(params, full, empty, smem_a, smem_b);
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
  ConvBwdWeightParams const& bp = params.weight;
  const int tid = int(threadIdx.x) - 128;
  const WeightTmaWork work = weight_tma_work<Traits>(params);
  Tensor sA = make_tensor(make_smem_ptr(smem_a), typename Traits::SmemLayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(smem_b), typename Traits::SmemLayoutB{});
  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tid);
  Tensor tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(sA));  // (MMA, M, K, stage)
  Tensor tCrB = thr_mma.make_fragment_B(thr_mma.partition_B(sB));
  Tensor acc =
      partition_fragment_C(tiled_mma, Shape<Int<Traits::kTileM>, Int<Traits::kTileN>>{});
  Tensor coords = thr_mma.partition_C(
      make_identity_tensor(Shape<Int<Traits::kTileM>, Int<Traits::kTileN>>{}));

  int count = 0;
  for (int32_t group = blockIdx.z; group < bp.conv.groups; group += gridDim.z) {
    clear(acc);
    for (int32_t k_tile = 0; k_tile < work.k_tiles; ++k_tile, ++count) {
      const int stage = count % kStages;
      Barrier::wait(&full[stage], uint32_t((count / kStages) & 1));
      issue_wgmma_batch(tiled_mma, tCrA, tCrB, stage, acc);
      // The batch before this one is done: its stage is free.
      warpgroup_wait<1>();
      warpgroup_fence_operand(acc);
      if (k_tile > 0) Barrier::arrive(&empty[(count - 1) % kStages]);
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    if (work.k_tiles > 0) Barrier::arrive(&empty[(count - 1) % kStages]);
    if constexpr (kClusterSum) {
      // Every rank's wgmma reads are done (its full barriers have all
      // flipped, so no copy is in flight): the stages hold the partial sums.
      store_weight_tile_split_sum<Traits::kTileM, Traits::kTileN, Element>(
          bp, params.packed, group, work.first_k, work.first_n, acc, coords,
          reinterpret_cast<float*>(smem), tid, kConsumerThreads);
      continue;
    }
    // A split with no positions adds nothing; one split stores zeros then.
    if (work.k_tiles == 0 && bp.accum != nullptr) continue;
    store_weight_tile<Element>(bp, params.packed, group, work.first_k, work.first_n, acc,
                               coords);
  }
#endif
}

}  // namespace ckfmha::kernel
