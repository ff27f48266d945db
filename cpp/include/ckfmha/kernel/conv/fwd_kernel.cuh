// Grouped convolution forward as an implicit GEMM on the sm80 path. Per group
// the GEMM is y[rows, K] = x_gathered[rows, taps * C] * w[K, taps * C]^T, with
// rows the output positions of the whole batch. A CTA owns a TileM x TileN
// tile of one group's output; its reduction runs over k-tiles of TileK
// filter-tap channels, gathered from x (zeros where a tap falls in the
// padding) and w into a ring of shared-memory stages by cp.async, and
// multiplied with mma.sync. Channels are flattened with the taps, so a group
// of few channels (C = 4) fills its k-tiles with several taps instead of
// padding each tap to a tile.
#pragma once

#include "ckfmha/kernel/conv/fwd_traits.cuh"
#include "ckfmha/kernel/conv/gather.cuh"
#include "ckfmha/kernel/params/conv_params.h"

#include <cute/tensor.hpp>

#include <cstdint>



namespace ckfmha::kernel {

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads)
    conv_fwd_sm80_kernel(ConvFwdParams const __grid_constant__ p) {
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

  extern __shared__ __align__(128) char smem[];
  Element* smem_a = reinterpret_cast<Element*>(smem);
  Element* smem_b = smem_a + cosize_v<typename Traits::SmemLayoutA>;
  ConvRow* rows = reinterpret_cast<ConvRow*>(smem + Traits::kSmemBytes);
  Tensor sA = make_tensor(make_smem_ptr(smem_a), typename Traits::SmemLayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(smem_b), typename Traits::SmemLayoutB{});

  const int tid = threadIdx.x;
  const int64_t first_row = int64_t(blockIdx.x) * kTileM;
  const int32_t first_channel = int32_t(blockIdx.y) * kTileN;
  const int32_t k_tiles = (p.reduction + kTileK - 1) / kTileK;

  conv_detail::fill_rows<kDims, kTileM, kThreads>(p, first_row, rows, tid);


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

  const Element* x = static_cast<const Element*>(p.x);
  const Element* w = static_cast<const Element*>(p.w);
  Element* y = static_cast<Element*>(p.y);

  // Groups beyond the grid's z extent (over 65535) loop in the same CTA.
  for (int32_t group = blockIdx.z; group < p.groups; group += gridDim.z) {
    const Element* x_group = x + int64_t(group) * p.in_channels;
    const Element* w_group = w + (int64_t(group) * p.out_channels) * p.reduction;

    __syncthreads();  // the row table is written; the last group's reads of smem are done
    typename Traits::Loader load_tile(p, rows, x_group, w_group, first_channel, tid, smem_a,
                                     smem_b);

    clear(acc);
    CUTE_UNROLL
    for (int stage = 0; stage < kStages - 1; ++stage) {
      if (stage < k_tiles) load_tile(p, stage);
      cp_async_fence();
    }
    for (int32_t k_tile = 0; k_tile < k_tiles; ++k_tile) {
      cp_async_wait<kStages - 2>();
      __syncthreads();  // tile k_tile has landed; the stage it replaces is consumed
      const int32_t next = k_tile + kStages - 1;
      if (next < k_tiles) load_tile(p, next % kStages);
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

    Tensor coords = thr_mma.partition_C(make_identity_tensor(Shape<Int<kTileM>, Int<kTileN>>{}));
    store_tile(p, rows, y + int64_t(group) * p.out_channels, first_channel, acc, coords);
  }
#endif
}

}  // namespace ckfmha::kernel
