// Host-side launcher for one fwd_splitkv instance: the sm80 forward kernel
// built with SplitKv, writing fp32 partials into the caller's workspace. The
// runtime resolves problem.num_splits (>= 1) and checks the workspace size
// before calling; fwd_splitkv_combine runs next on the same stream. One split
// writes O and LSE itself: no workspace, no combine. Paged
// instances (fwd_pagedkv, batch_prefill) launch the same way, with the page
// tables added to the parameters.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel/common/launch.cuh"
#include "ckfmha/kernel/params/fwd_params_from_problem.h"
#include "ckfmha/kernel/params/paged_kv_params.h"
#include "ckfmha/kernel/params/splitkv_workspace.h"
#include "ckfmha/kernel/sm80/fwd_kernel.cuh"
#include "ckfmha/kernel/sm80/fwd_traits.cuh"
#include "ckfmha/kernel_entry.h"

#include <cstdint>

namespace ckfmha::kernel {

template <class Traits>
int launch_fwd_splitkv_sm80(void const* problem, void const* args,
    ckfmha_launch_context const* context, ckfmha_stream_t stream) {
  static_assert(Traits::kSplitKv, "instantiate with FwdSm80Traits<..., SplitKv=true>");
  auto const& pr = *static_cast<ckfmha_fwd_problem const*>(problem);
  auto const& ar = *static_cast<ckfmha_fwd_args const*>(args);
  if (pr.num_splits < 1 || (pr.num_splits > 1 && ar.workspace == nullptr)) {
    return -int(cudaErrorInvalidValue);
  }
  FwdParams params = make_fwd_params(pr, ar, context);
  set_splitkv_params(params, pr, ar);
  if constexpr (Traits::kPagedKv) set_paged_kv_params(params, pr, ar);
  // Packed rows: each K/V head's query heads times the query positions.
  const int64_t rows = int64_t(pr.seqlen_q) * (pr.nhead_q / pr.nhead_k);
  const int64_t m_blocks = (rows + Traits::kBlockM - 1) / Traits::kBlockM;
  dim3 grid(unsigned(m_blocks * pr.num_splits), unsigned(pr.nhead_k), unsigned(pr.batch));
  return launch_kernel(&fwd_sm80_kernel<Traits>, grid, Traits::kThreads, Traits::kSmemBytes,
                       stream, params);
}

template <class Traits>
int resident_ctas_fwd_splitkv_sm80(int32_t* ctas_per_sm) {
  return resident_ctas_per_sm(&fwd_sm80_kernel<Traits>, Traits::kThreads, Traits::kSmemBytes,
                              ctas_per_sm);
}

}  // namespace ckfmha::kernel
