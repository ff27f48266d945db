// Host-side launchers of the three backward stages on the sm80 path.
// Generated instance files include this header and instantiate one launcher.
// Return convention as for the forward: 0, or -cudaError_t.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel/common/launch.cuh"
#include "ckfmha/kernel/params/bwd_params_from_problem.h"
#include "ckfmha/kernel/sm80/bwd_dsink_kernel.cuh"
#include "ckfmha/kernel/sm80/bwd_kernel.cuh"
#include "ckfmha/kernel/sm80/bwd_traits.cuh"
#include "ckfmha/kernel_entry.h"

namespace ckfmha::kernel {

// One CTA per (query tile, query head, batch or sequence).
inline dim3 bwd_row_grid(ckfmha_bwd_problem const& problem, int block_m) {
  return dim3((problem.seqlen_q + block_m - 1) / block_m, problem.nhead_q, problem.batch);
}

// With sinks the stage also reduces dsink from the D and LSE rows it has just
// written (bwd_dsink_kernel.cuh): one CTA per query head, on the same stream.
template <class Traits>
int launch_bwd_dot_do_o(void const* problem, void const* args,
    ckfmha_launch_context const* context, ckfmha_stream_t stream) {
  auto const& pr = *static_cast<ckfmha_bwd_problem const*>(problem);
  BwdParams const params =
      make_bwd_params(pr, *static_cast<ckfmha_bwd_args const*>(args), context);
  int status = launch_kernel(&bwd_dot_do_o_kernel<Traits>, bwd_row_grid(pr, Traits::kBlockM),
                             Traits::kThreads, 0, stream, params);
  if (status != 0 || params.dsink == nullptr) return status;
  return launch_kernel(&bwd_dsink_kernel<Traits::kIsGroupMode>, dim3(pr.nhead_q),
                       kBwdDsinkThreads, 0, stream, params);
}

template <class Traits>
int launch_bwd_convert_dq(void const* problem, void const* args,
    ckfmha_launch_context const* context, ckfmha_stream_t stream) {
  auto const& pr = *static_cast<ckfmha_bwd_problem const*>(problem);
  return launch_kernel(&bwd_convert_dq_kernel<Traits>, bwd_row_grid(pr, Traits::kBlockM),
                       Traits::kThreads, 0, stream,
                       make_bwd_params(pr, *static_cast<ckfmha_bwd_args const*>(args), context));
}

// One CTA per (key tile, KV head, batch or sequence); deterministic mode
// deals the key tiles to dq_splits CTAs per (KV head, batch) instead.
template <class Traits>
int launch_bwd_dq_dk_dv_sm80(void const* problem, void const* args,
    ckfmha_launch_context const* context, ckfmha_stream_t stream) {
  auto const& pr = *static_cast<ckfmha_bwd_problem const*>(problem);
  BwdParams params = make_bwd_params(pr, *static_cast<ckfmha_bwd_args const*>(args), context);
  const int key_tiles = (pr.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  const int ctas_x = params.deterministic ? std::min(params.dq_splits, key_tiles) : key_tiles;
  return launch_kernel(&bwd_dq_dk_dv_sm80_kernel<Traits>, dim3(ctas_x, pr.nhead_k, pr.batch),
                       Traits::kThreads, Traits::kSmemBytes, stream, params);
}

}  // namespace ckfmha::kernel
