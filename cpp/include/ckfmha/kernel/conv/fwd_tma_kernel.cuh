// Grouped convolution forward as an implicit GEMM fed by the tensor-copy
// engine (sm_90a). The gathering kernels (fwd_sm90_kernel.cuh) spend most of
// their issue slots on per-thread copies and wait on them; here one thread
// asks the copy engine for each k-tile: x's tile in im2col mode (TileM
// consecutive output positions, TileK channels of one filter tap, zeros where
// the tap reads padding or a row lies past the batch) and w's tile as a 3D box
// (channels of the taps, output channels, group), or, reading a transposed
// filter view (backward-data), as runs of 64 output channels of one tap.
// Consumer warpgroups wait on a stage's full barrier, multiply, and free the
// stage.
//
// Persistent: a CTA per SM (two where their shared memory fits) walks the
// output tiles, output-channel tiles of one row tile first, so that
// neighbouring CTAs read the same input rows from L2. The producer runs ahead
// into the next tile while the consumers store. Where the tiles are too few
// for the SMs, a cluster's CTAs share each tile's k-tiles instead
// (fwd_tma_split.cuh).
#pragma once

#include "ckfmha/kernel/conv/fwd_tma_epilogue.cuh"
#include "ckfmha/kernel/conv/fwd_tma_split.cuh"
#include "ckfmha/kernel/conv/fwd_tma_traits.cuh"
#include "ckfmha/kernel/conv/gather.cuh"
#include "ckfmha/kernel/conv/wgmma_batch.cuh"
#include "ckfmha/kernel/params/conv_params.h"

#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <cstdint>

namespace ckfmha::kernel {

struct ConvFwdTmaParams {
  ConvFwdParams conv;
  // x as (channels of all groups, w, h, [d,] batch) for im2col copies, and w
  // as (filter taps x channels, out channels, groups).
  cute::TmaDescriptor x_map;
  cute::TmaDescriptor w_map;
  int64_t tiles_m;  // row tiles
  int32_t tiles_n;  // output-channel tiles of a group
  // The transposed-filter variant's w map is (the filter's input channels,
  // its taps, its output channels, groups); the problem's tap (z, y, x) is
  // the filter's tap first_tap + z * tap_step[0] + y * tap_step[1] +
  // x * tap_step[2] (the view's offsets in whole taps).
  int32_t filter_first_tap;
  int32_t filter_tap_step[3];
  // log2 of the CTAs of a cluster sharing each tile's k-tiles
  // (conv_fwd_tma_splits, a power of two); the grid is a whole number of
  // clusters of this size.
  int32_t split_shift;
};

namespace conv_detail {

// The output tile a CTA takes on its `index`-th turn: channel tiles of a row
// tile, then row tiles, then groups.
struct ConvTileIndex {
  int64_t row_tile;
  int32_t channel_tile;
  int32_t group;
};

__device__ __forceinline__ ConvTileIndex conv_tile_at(ConvFwdTmaParams const& params,
                                                      int64_t tile) {
  ConvTileIndex t;
  t.channel_tile = int32_t(tile % params.tiles_n);
  const int64_t rest = tile / params.tiles_n;
  t.row_tile = rest % params.tiles_m;
  t.group = int32_t(rest / params.tiles_m);
  return t;
}

__device__ __forceinline__ int64_t conv_tile_count(ConvFwdTmaParams const& params) {
  return params.tiles_m * params.tiles_n * params.conv.groups;
}

// Run by one thread: for every tile of this CTA, each k-tile's x and w into
// the next free stage. The reduction index is tap x channels + channel with
// the channel count a multiple of TileK, so k-tile t covers channels
// (t mod chunks) x TileK of tap t / chunks, and its w columns start at
// t x TileK.
template <class Traits, bool kSplit>
__device__ __forceinline__ void conv_fwd_tma_load(ConvFwdTmaParams const& params,
                                                  uint64_t* full, uint64_t* empty,
                                                  typename Traits::Element* smem_a,
                                                  typename Traits::Element* smem_b) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int kTileK = Traits::kTileK;
  constexpr int kStages = Traits::kStages;
  constexpr int kElemsA = Traits::kTileM * kTileK;
  constexpr int kElemsB = Traits::kTileN * kTileK;
  ConvFwdParams const& p = params.conv;
  cute::prefetch_tma_descriptor(&params.x_map);
  cute::prefetch_tma_descriptor(&params.w_map);
  const int32_t chunks = p.in_channels / kTileK;
  const ConvSplitRange range =
      conv_split_range<kSplit>(params.split_shift, p.reduction / kTileK);
  const uint64_t hint = uint64_t(cute::TMA::CacheHintSm90::EVICT_NORMAL);
  int count = 0;
  for (int64_t tile = range.first_tile; tile < conv_tile_count(params);
       tile += range.tile_step) {
    const ConvTileIndex t = conv_tile_at(params, tile);
    // The tile's first output position, and the input coordinates of its
    // first tap: the copy engine walks on from there.
    int64_t rest = t.row_tile * Traits::kTileM;
    int32_t corner[3];
    for (int d = 2; d >= 0; --d) {
      const int64_t next = rest / p.output[d];
      corner[d] = int32_t(rest - next * p.output[d]) * p.stride[d] - p.padding[d];
      rest = next;
    }
    const int32_t image = int32_t(rest);
    const int32_t first_channel = t.channel_tile * Traits::kTileN;
    // The split's first k-tile: chunk `chunk` of tap (d, h, w), w fastest
    // (the divisions only where a split starts past k-tile 0: they delay a
    // tile's first copy).
    int32_t chunk = 0;
    int32_t tap[3] = {0, 0, 0};
    if (range.begin > 0) {
      chunk = range.begin % chunks;
      const int32_t first_tap = range.begin / chunks;
      tap[0] = first_tap / (p.filter[2] * p.filter[1]);
      tap[1] = first_tap / p.filter[2] % p.filter[1];
      tap[2] = first_tap % p.filter[2];
    }
    for (int32_t k_tile = range.begin; k_tile < range.end; ++k_tile, ++count) {
      const int stage = count % kStages;
      Barrier::wait(&empty[stage], uint32_t(((count / kStages) & 1) ^ 1));
      Barrier::arrive_and_expect_tx(&full[stage],
                                    uint32_t(Traits::kStageBytesA + Traits::kStageBytesB));
      const int32_t channel = t.group * p.in_channels + chunk * kTileK;
      const auto off_w = uint16_t(tap[2] * p.dilation[2]);
      const auto off_h = uint16_t(tap[1] * p.dilation[1]);
      if constexpr (Traits::kSpatialDims == 2) {
        cute::SM90_TMA_LOAD_IM2COL_4D::copy(&params.x_map, &full[stage], smem_a + stage * kElemsA,
                                            channel, corner[2], corner[1], image, off_w, off_h);
      } else {
        const auto off_d = uint16_t(tap[0] * p.dilation[0]);
        cute::SM90_TMA_LOAD_IM2COL_5D::copy(&params.x_map, &full[stage], smem_a + stage * kElemsA,
                                            channel, corner[2], corner[1], corner[0], image,
                                            off_w, off_h, off_d);
      }
      if constexpr (Traits::kFilterTransposed) {
        constexpr int kRun = Traits::kFilterRun;
        const int32_t filter_tap = params.filter_first_tap + tap[0] * params.filter_tap_step[0] +
                                   tap[1] * params.filter_tap_step[1] +
                                   tap[2] * params.filter_tap_step[2];
#pragma unroll
        for (int run = 0; run < Traits::kTileN / kRun; ++run) {
          cute::SM90_TMA_LOAD_4D::copy(&params.w_map, &full[stage], hint,
                                       smem_b + stage * kElemsB + run * kRun * kTileK,
                                       first_channel + run * kRun, filter_tap, chunk * kTileK,
                                       t.group);
        }
      } else {
        cute::SM90_TMA_LOAD_3D::copy(&params.w_map, &full[stage], hint, smem_b + stage * kElemsB,
                                     k_tile * kTileK, first_channel, t.group);
      }
      if (++chunk == chunks) {
        chunk = 0;
        if (++tap[2] == p.filter[2]) {
          tap[2] = 0;
          if (++tap[1] == p.filter[1]) {
            tap[1] = 0;
            ++tap[0];
          }
        }
      }
    }
    if constexpr (kSplit) {
      // The consumers' barriers of the split sum (store_tile_split_sum): the
      // stages hold partial sums from the first to the third, which only a
      // cluster with another tile waits at.
      conv_cluster_barrier<false>();
      conv_cluster_barrier<false>();
      if (range.has_next(tile, conv_tile_count(params))) conv_cluster_barrier<false>();
    }
  }
}

}  // namespace conv_detail

// kSplit: the instance the launcher runs where clusters split the tiles'
// k-tiles (split_shift > 0); the unsplit one carries none of that code, whose
// epilogue alone had slowed the unsplit launches' main loop.
template <class Traits, bool kSplit>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinCtasPerSm)
    conv_fwd_tma_kernel(ConvFwdTmaParams const __grid_constant__ params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using namespace conv_detail;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using Element = typename Traits::Element;
  constexpr int kTileM = Traits::kTileM;
  constexpr int kTileN = Traits::kTileN;
  constexpr int kStages = Traits::kStages;
  constexpr int kConsumerThreads = Traits::kConsumerThreads;

  extern __shared__ __align__(1024) char smem[];
  Element* smem_a = reinterpret_cast<Element*>(smem);
  Element* smem_b = smem_a + cosize_v<typename Traits::SmemLayoutA>;
  char* epilogue = smem + Traits::kSmemBytes;
  ConvRow* rows = reinterpret_cast<ConvRow*>(epilogue + Traits::kSmemEpilogueBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(rows) +
                                               Traits::kSmemRowBytes);
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
    if (threadIdx.x == 0) {
      conv_fwd_tma_load<Traits, kSplit>(params, full, empty, smem_a, smem_b);
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
  ConvFwdParams const& p = params.conv;
  const int tid = int(threadIdx.x) - 128;
  Tensor sA = make_tensor(make_smem_ptr(smem_a), typename Traits::SmemLayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(smem_b), typename Traits::SmemLayoutB{});
  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tid);
  Tensor tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(sA));  // (MMA, M, K, stage)
  Tensor tCrB = thr_mma.make_fragment_B(thr_mma.partition_B(sB));
  Tensor acc = partition_fragment_C(tiled_mma, Shape<Int<kTileM>, Int<kTileN>>{});
  Tensor coords = thr_mma.partition_C(make_identity_tensor(Shape<Int<kTileM>, Int<kTileN>>{}));
  Element* y = static_cast<Element*>(p.y);
  const ConvSplitRange range =
      conv_split_range<kSplit>(params.split_shift, p.reduction / Traits::kTileK);

  int count = 0;
  for (int64_t tile = range.first_tile; tile < conv_tile_count(params);
       tile += range.tile_step) {
    const ConvTileIndex t = conv_tile_at(params, tile);
    // The last tile's stores have read the row table.
    cutlass::arch::NamedBarrier::sync(kConsumerThreads, 0);
    fill_rows<Traits::kSpatialDims, kTileM, kConsumerThreads>(p, t.row_tile * kTileM, rows, tid);

    clear(acc);
    for (int32_t step = 0; step < range.end - range.begin; ++step, ++count) {
      const int stage = count % kStages;
      Barrier::wait(&full[stage], uint32_t((count / kStages) & 1));
      issue_wgmma_batch(tiled_mma, tCrA, tCrB, stage, acc);
      // The batch before this one is done: its stage is free.
      warpgroup_wait<1>();
      warpgroup_fence_operand(acc);
      if (step > 0) Barrier::arrive(&empty[(count - 1) % kStages]);
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    Barrier::arrive(&empty[(count - 1) % kStages]);

    // The row table is written (and, split, no wgmma reads the stages).
    cutlass::arch::NamedBarrier::sync(kConsumerThreads, 0);
    if constexpr (kSplit) {
      store_tile_split_sum<Traits>(p, rows, y + int64_t(t.group) * p.out_channels,
                                   t.channel_tile * kTileN, acc, coords,
                                   reinterpret_cast<float*>(smem), range,
                                   range.has_next(tile, conv_tile_count(params)), tid);
      continue;
    }
    const int warpgroup = tid / 128;
    store_tile_through_smem<Traits>(
        p, rows, y + int64_t(t.group) * p.out_channels, t.channel_tile * kTileN, acc, coords,
        epilogue + warpgroup * Traits::kRowsPerConsumer * Traits::kEpiloguePitch, warpgroup,
        tid % 128);
  }
#endif
}

}  // namespace ckfmha::kernel
