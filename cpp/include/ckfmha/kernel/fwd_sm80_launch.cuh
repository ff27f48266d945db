// Host-side launcher for one sm80-path forward instance. Generated instance
// files include this header and instantiate launch_fwd_sm80<Traits> once.
//
// Return convention (shared by every launcher in a kernel table): 0 on
// success, -cudaError_t when a CUDA call fails. Problem checks happen in the
// runtime before a launcher is chosen.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel/fwd_params_from_problem.h"
#include "ckfmha/kernel/fwd_sm80_kernel.cuh"
#include "ckfmha/kernel/fwd_sm80_traits.cuh"
#include "ckfmha/kernel_entry.h"

#include <cuda_runtime.h>

namespace ckfmha::kernel {

template <class Traits>
int launch_fwd_sm80(void const* problem, void const* args, ckfmha_stream_t stream) {
  auto const& pr = *static_cast<ckfmha_fwd_problem const*>(problem);
  FwdParams params = make_fwd_params(pr, *static_cast<ckfmha_fwd_args const*>(args));
  dim3 grid((pr.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, pr.nhead_q, pr.batch);
  auto* kernel = &fwd_sm80_kernel<Traits>;
  constexpr int kSmem = Traits::kSmemBytes;
  if constexpr (kSmem > 48 * 1024) {
    // The opt-in limit is per function and per device; setting it each launch
    // is cheap and keeps multi-device processes correct.
    cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err != cudaSuccess) return -int(err);
  }
  kernel<<<grid, Traits::kThreads, kSmem, reinterpret_cast<cudaStream_t>(stream)>>>(params);
  cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? 0 : -int(err);
}

}  // namespace ckfmha::kernel
