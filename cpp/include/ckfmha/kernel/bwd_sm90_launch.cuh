// Host-side launcher of the Hopper backward main stage: builds the TMA
// descriptors of Q, dO, K and V and launches one CTA per (key tile, KV head,
// batch entry). The row-wise stages around it are the sm80 path's.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel/bwd_params_from_problem.h"
#include "ckfmha/kernel/bwd_sm90_kernel.cuh"
#include "ckfmha/kernel/bwd_sm90_traits.cuh"
#include "ckfmha/kernel/fwd_launch_common.cuh"
#include "ckfmha/kernel_entry.h"

namespace ckfmha::kernel {

// (rows, head dim, heads, batch) view of a [batch, heads, rows, dim] tensor
// with arbitrary strides (BHSD, BSHD, ...); the head dim is contiguous.
template <class Traits>
typename Traits::GmemTensor bwd_sm90_gmem_view(void const* data, int rows, int heads, int batch,
                                               int64_t const (&stride)[3]) {
  using Element = typename Traits::Element;
  return cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(data)),
                           cute::make_shape(rows, int(Traits::kHeadDim), heads, batch),
                           cute::make_stride(stride[2], cute::_1{}, stride[1], stride[0]));
}

template <class Traits>
int launch_bwd_dq_dk_dv_sm90(void const* problem, void const* args, ckfmha_stream_t stream) {
  using namespace cute;
  auto const& pr = *static_cast<ckfmha_bwd_problem const*>(problem);
  auto const& ar = *static_cast<ckfmha_bwd_args const*>(args);
  using TileQ = Shape<typename Traits::M, typename Traits::D>;
  using TileK = Shape<typename Traits::N, typename Traits::D>;
  auto q_smem = take<0, 2>(typename Traits::SmemLayoutQ{});
  // Encoding a descriptor reads only host memory; a bad tensor shows up as a
  // launch error, which the caller reports.
  BwdParams const bwd = make_bwd_params(pr, ar);
  // The fp32 dQ accumulator as (padded rows, head dim, batch x heads).
  auto dq_accum = make_tensor(
      make_gmem_ptr(bwd.dq_accum),
      make_shape(bwd.workspace_rows, int(Traits::kHeadDim), pr.nhead_q * pr.batch),
      make_stride(int64_t(Traits::kHeadDim), _1{}, int64_t(bwd.workspace_rows) * Traits::kHeadDim));
  BwdSm90Params<Traits> params{
      bwd,
      make_tma_copy(SM90_TMA_LOAD{},
                    bwd_sm90_gmem_view<Traits>(ar.q, pr.seqlen_q, pr.nhead_q, pr.batch,
                                               pr.q_stride),
                    q_smem, TileQ{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{},
                    bwd_sm90_gmem_view<Traits>(ar.do_, pr.seqlen_q, pr.nhead_q, pr.batch,
                                               pr.do_stride),
                    q_smem, TileQ{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{},
                    bwd_sm90_gmem_view<Traits>(ar.k, pr.seqlen_k, pr.nhead_k, pr.batch,
                                               pr.k_stride),
                    typename Traits::SmemLayoutK{}, TileK{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{},
                    bwd_sm90_gmem_view<Traits>(ar.v, pr.seqlen_k, pr.nhead_k, pr.batch,
                                               pr.v_stride),
                    typename Traits::SmemLayoutK{}, TileK{}, _1{}),
      make_tma_copy(SM90_TMA_REDUCE_ADD{}, dq_accum, typename Traits::SmemLayoutdQHalf{},
                    typename Traits::DqHalf{}, _1{}),
  };
  const int key_tiles = (pr.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  return launch_kernel(&bwd_dq_dk_dv_sm90_kernel<Traits>, dim3(key_tiles, pr.nhead_k, pr.batch),
                       Traits::kThreads, Traits::kSmemBytes, stream, params);
}

}  // namespace ckfmha::kernel
