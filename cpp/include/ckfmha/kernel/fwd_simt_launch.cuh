// Host-side launcher for one fp32 SIMT forward instance. Generated instance
// files include this header and instantiate launch_fwd_simt<Traits> once.
// Same return convention as launch_fwd_sm80: 0, or -cudaError_t.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel/fwd_params_from_problem.h"
#include "ckfmha/kernel/fwd_simt_kernel.cuh"
#include "ckfmha/kernel/fwd_simt_traits.cuh"
#include "ckfmha/kernel_entry.h"

#include <cuda_runtime.h>

namespace ckfmha::kernel {

template <class Traits>
int launch_fwd_simt(void const* problem, void const* args, ckfmha_stream_t stream) {
  auto const& pr = *static_cast<ckfmha_fwd_problem const*>(problem);
  FwdParams params = make_fwd_params(pr, *static_cast<ckfmha_fwd_args const*>(args));
  dim3 grid((pr.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, pr.nhead_q, pr.batch);
  auto* kernel = &fwd_simt_kernel<Traits>;
  constexpr int kSmem = Traits::kSmemBytes;
  if constexpr (kSmem > 48 * 1024) {
    // Per function and per device, like the sm80 launcher.
    cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err != cudaSuccess) return -int(err);
  }
  kernel<<<grid, Traits::kThreads, kSmem, reinterpret_cast<cudaStream_t>(stream)>>>(params);
  cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? 0 : -int(err);
}

}  // namespace ckfmha::kernel
