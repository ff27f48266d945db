// Host-side launcher for one fwd_splitkv_combine instance; reads the same
// problem, arguments and workspace as the fwd_splitkv launch before it.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel/common/launch.cuh"
#include "ckfmha/kernel/params/fwd_params_from_problem.h"
#include "ckfmha/kernel/params/splitkv_workspace.h"
#include "ckfmha/kernel/splitkv_combine/kernel.cuh"
#include "ckfmha/kernel_entry.h"

#include <cstdint>

namespace ckfmha::kernel {

template <class Traits>
int launch_fwd_splitkv_combine(void const* problem, void const* args,
    ckfmha_launch_context const* context, ckfmha_stream_t stream) {
  auto const& pr = *static_cast<ckfmha_fwd_problem const*>(problem);
  auto const& ar = *static_cast<ckfmha_fwd_args const*>(args);
  if (pr.num_splits < 1 || ar.workspace == nullptr) return -int(cudaErrorInvalidValue);
  FwdParams params = make_fwd_params(pr, ar, context);
  set_splitkv_params(params, pr, ar);
  const int64_t rows = int64_t(pr.batch) * pr.nhead_q * pr.seqlen_q;
  dim3 grid(unsigned((rows + Traits::kRowsPerCta - 1) / Traits::kRowsPerCta));
  return launch_kernel(&fwd_splitkv_combine_kernel<Traits>, grid, Traits::kThreads, 0, stream,
                       params);
}

}  // namespace ckfmha::kernel
