// Host-side launcher for one sm80-path forward instance. Generated instance
// files include this header and instantiate launch_fwd_sm80<Traits> once.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel/common/launch.cuh"
#include "ckfmha/kernel/params/fwd_params_from_problem.h"
#include "ckfmha/kernel/sm80/fwd_kernel.cuh"
#include "ckfmha/kernel/sm80/fwd_traits.cuh"
#include "ckfmha/kernel_entry.h"

namespace ckfmha::kernel {

template <class Traits>
int launch_fwd_sm80(void const* problem, void const* args,
    ckfmha_launch_context const* context, ckfmha_stream_t stream) {
  auto const& pr = *static_cast<ckfmha_fwd_problem const*>(problem);
  return launch_kernel(&fwd_sm80_kernel<Traits>, fwd_grid(pr, Traits::kBlockM), Traits::kThreads,
                       Traits::kSmemBytes, stream,
                       make_fwd_params(pr, *static_cast<ckfmha_fwd_args const*>(args), context));
}

}  // namespace ckfmha::kernel
