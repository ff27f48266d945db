// Host-side launcher for one Hopper forward instance: builds the TMA
// descriptors for this problem's tensors and launches fwd_sm90_kernel.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel/fwd_launch_common.cuh"
#include "ckfmha/kernel/fwd_params_from_problem.h"
#include "ckfmha/kernel/fwd_sm90_kernel.cuh"
#include "ckfmha/kernel/fwd_sm90_traits.cuh"
#include "ckfmha/kernel_entry.h"


namespace ckfmha::kernel {

// (rows, head dim, heads, batch) view of a [batch, heads, rows, dim] tensor
// with arbitrary strides (BHSD, BSHD, ...); the head dim is contiguous.
template <class Traits>
typename Traits::GmemTensor gmem_view(void const* data, int rows, int hdim, int heads, int batch,
                                      int64_t const (&stride)[3]) {
  using Element = typename Traits::Element;
  return cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(data)),
                           cute::make_shape(rows, hdim, heads, batch),
                           cute::make_stride(stride[2], cute::_1{}, stride[1], stride[0]));
}

template <class Traits>
int launch_fwd_sm90(void const* problem, void const* args, ckfmha_stream_t stream) {
  using namespace cute;
  auto const& pr = *static_cast<ckfmha_fwd_problem const*>(problem);
  auto const& ar = *static_cast<ckfmha_fwd_args const*>(args);
  // Encoding a descriptor reads only host memory; a bad tensor shows up as a
  // launch error, which the caller reports.
  FwdSm90Params<Traits> params{
      make_fwd_params(pr, ar),
      make_tma_copy(SM90_TMA_LOAD{},
                    gmem_view<Traits>(ar.q, pr.seqlen_q, pr.hdim_q, pr.nhead_q, pr.batch,
                                      pr.q_stride),
                    typename Traits::SmemLayoutQ{},
                    Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDimQK>>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{},
                    gmem_view<Traits>(ar.k, pr.seqlen_k, pr.hdim_q, pr.nhead_k, pr.batch,
                                      pr.k_stride),
                    take<0, 2>(typename Traits::SmemLayoutK{}),
                    Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDimQK>>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{},
                    gmem_view<Traits>(ar.v, pr.seqlen_k, pr.hdim_v, pr.nhead_k, pr.batch,
                                      pr.v_stride),
                    take<0, 2>(typename Traits::SmemLayoutV{}),
                    Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDimV>>{}, _1{}),
  };
  return launch_kernel(&fwd_sm90_kernel<Traits>, fwd_grid(pr, Traits::kBlockM), Traits::kThreads,
                       Traits::kSmemBytes, stream, params);
}

}  // namespace ckfmha::kernel
