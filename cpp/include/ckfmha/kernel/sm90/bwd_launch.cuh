// Host-side launcher of the Hopper backward main stage: picks the consumer
// layout for the head dim, builds the TMA descriptors of Q, dO, K, V and the
// dQ accumulator and launches one CTA per (key tile, KV head, batch entry)
// (causal grids in bwd_sm90_key_tile's order).
// The row-wise stages around it are the sm80 path's.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel/common/launch.cuh"
#include "ckfmha/kernel/params/bwd_params_from_problem.h"
#include "ckfmha/kernel/sm90/bwd_head_split_kernel.cuh"
#include "ckfmha/kernel/sm90/bwd_head_split_traits.cuh"
#include "ckfmha/kernel/sm90/bwd_kernel.cuh"
#include "ckfmha/kernel/sm90/bwd_launch_order.hpp"
#include "ckfmha/kernel/sm90/bwd_traits.cuh"
#include "ckfmha/kernel_entry.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace ckfmha::kernel {

// The generator's traits name for the sm90 backward: 128-key tiles split
// their keys across the consumer warpgroups (d64, d96, d128); 64-key tiles
// split the head dims (d256, d192x128).
template <class Element, int HeadDimQK, int HeadDimV, int BlockM, int BlockN, int Warps,
          int Stages, MaskMode Mask, BiasMode Bias, bool HasDropout, bool HasSoftcap,
          bool HasDbias, bool IsGroupMode, int MinCtasPerSm = 1>
using BwdSm90Traits = std::conditional_t<
    BlockN == 64,
    BwdSm90HeadSplitTraits<Element, HeadDimQK, HeadDimV, BlockM, BlockN, Warps, Stages, Mask,
                           Bias, HasDropout, HasSoftcap, HasDbias, IsGroupMode, MinCtasPerSm>,
    BwdSm90KeySplitTraits<Element, HeadDimQK, HeadDimV, BlockM, BlockN, Warps, Stages, Mask,
                          Bias, HasDropout, HasSoftcap, HasDbias, IsGroupMode, MinCtasPerSm>>;

// (rows, head dim, heads, batch) view of a [batch, heads, rows, dim] tensor
// with arbitrary strides (BHSD, BSHD, ...); the head dim is contiguous.
template <class Traits>
typename Traits::GmemTensor bwd_sm90_gmem_view(void const* data, int rows, int cols, int heads,
                                               int batch, int64_t const (&stride)[3]) {
  using Element = typename Traits::Element;
  return cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(data)),
                           cute::make_shape(rows, cols, heads, batch),
                           cute::make_stride(stride[2], cute::_1{}, stride[1], stride[0]));
}

template <class Traits>
int launch_bwd_dq_dk_dv_sm90(void const* problem, void const* args,
    ckfmha_launch_context const* context, ckfmha_stream_t stream) {
  using namespace cute;
  auto const& pr = *static_cast<ckfmha_bwd_problem const*>(problem);
  auto const& ar = *static_cast<ckfmha_bwd_args const*>(args);
  using TileQ = Shape<typename Traits::M, typename Traits::D>;
  using TileDo = Shape<typename Traits::M, typename Traits::DV>;
  using TileK = Shape<typename Traits::N, typename Traits::D>;
  using TileV = Shape<typename Traits::N, typename Traits::DV>;
  auto q_smem = take<0, 2>(typename Traits::SmemLayoutQ{});
  auto do_smem = take<0, 2>(typename Traits::SmemLayoutdO{});
  // Encoding a descriptor reads only host memory; a bad tensor shows up as a
  // launch error, which the caller reports.
  BwdParams const bwd = make_bwd_params(pr, ar, context);
  // An elementwise bias is read as one value per key (BwdSm90KeyBias); the
  // runtime's checks send these kernels row-broadcast biases only.
  if constexpr (Traits::kBiasRowsOnly) {
    if (ar.bias == nullptr || pr.bias_stride[2] != 0) return -int(cudaErrorNotSupported);
  }
  // Group mode: one view over the packed tokens (its "batch" stride is any
  // legal value: the view has a single batch). The plan checked that
  // total_q/total_k are given and fit the descriptors' 32-bit coordinates.
  constexpr bool kGroup = Traits::kIsGroupMode;
  const int rows_q = kGroup ? int(pr.total_q) : pr.seqlen_q;
  const int rows_k = kGroup ? int(pr.total_k) : pr.seqlen_k;
  const int views = kGroup ? 1 : pr.batch;
  auto tma_load = [&](void const* data, int rows, int heads, int64_t const(&stride)[3],
                      auto smem_layout, auto tile) {
    const int cols = int(size<1>(tile));
    const int64_t view_stride[3] = {kGroup ? stride[2] * rows : stride[0], stride[1], stride[2]};
    return make_tma_copy(SM90_TMA_LOAD{},
                         bwd_sm90_gmem_view<Traits>(data, rows, cols, heads, views, view_stride),
                         smem_layout, tile, _1{});
  };
  const int key_tiles = (pr.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  auto tma_q = tma_load(ar.q, rows_q, pr.nhead_q, pr.q_stride, q_smem, TileQ{});
  auto tma_do = tma_load(ar.do_, rows_q, pr.nhead_q, pr.do_stride, do_smem, TileDo{});
  auto tma_k = tma_load(ar.k, rows_k, pr.nhead_k, pr.k_stride,
                        typename Traits::SmemLayoutK{}, TileK{});
  auto tma_v = tma_load(ar.v, rows_k, pr.nhead_k, pr.v_stride,
                        typename Traits::SmemLayoutV{}, TileV{});
  // The fp32 dQ accumulator as (padded rows, head dim, batch x heads), added
  // to by TMA reduce-adds of the tiles the traits stage.
  auto dq_accum = make_tensor(make_gmem_ptr(bwd.dq_accum),
                              make_shape(bwd.workspace_rows, int(Traits::kHeadDim),
                                         pr.nhead_q * pr.batch),
                              make_stride(int64_t(Traits::kHeadDim), _1{},
                                          int64_t(bwd.workspace_rows) * Traits::kHeadDim));
  auto tma_dq = make_tma_copy(SM90_TMA_REDUCE_ADD{}, dq_accum, typename Traits::SmemLayoutdQBox{},
                              typename Traits::DqBox{}, _1{});
  // Causal grids launch in chunks of (KV head, batch) pairs
  // (bwd_sm90_key_tile, bwd_sm90_causal_chunks) where a grid's CTAs fit an
  // int; only they ask for the SM count.
  const int64_t pairs = int64_t(pr.nhead_k) * pr.batch;
  BwdSm90CausalChunks chunks{};
  dim3 grid(key_tiles, pr.nhead_k, pr.batch);
  if (kBwdSm90ChunkedCausalOrder<Traits>) {
    int sms = 0;
    if (int err = current_device_sms(&sms); err != 0) return err;
    const bool wave_chunks =
        Traits::kHeadDim >= 128 && key_tiles >= kBwdSm90MinWaveChunkKeyTiles;
    chunks = bwd_sm90_causal_chunks(
        pairs, key_tiles, sms, wave_chunks,
        causal_key_tile_work(pr.seqlen_q, pr.seqlen_k, Traits::kBlockN,
                             pr.mask == CKFMHA_MASK_CAUSAL_BOTTOM_RIGHT));
    if (chunks.chunk_pairs > 0) grid = dim3(unsigned(chunks.ctas));
  }
  const int chunk_ctas = chunks.chunk_pairs * key_tiles;
  BwdSm90Params<Traits> params{bwd, tma_q, tma_do, tma_k, tma_v, tma_dq, rows_q, rows_k, views,
                               chunks.chunk_pairs, chunks.full_chunks,
                               chunks.full_chunks * chunk_ctas,
                               cutlass::FastDivmod(std::max(1, chunk_ctas)),
                               cutlass::FastDivmod(std::max(1, chunks.chunk_pairs)),
                               cutlass::FastDivmod(std::max(1, chunks.last_pairs)),
                               cutlass::FastDivmod(pr.nhead_k)};
  // (Only the layout's own kernel may be instantiated with its traits.)
  if constexpr (Traits::kSplitsHeadDim) {
    return launch_kernel(&bwd_dq_dk_dv_sm90_head_split_kernel<Traits>, grid, Traits::kThreads,
                         Traits::kSmemBytes, stream, params);
  } else {
    return launch_kernel(&bwd_dq_dk_dv_sm90_kernel<Traits>, grid, Traits::kThreads,
                         Traits::kSmemBytes, stream, params);
  }
}

}  // namespace ckfmha::kernel
