// Host-side pieces the launchers share: the forward grid, the SM count and
// the launch itself. Return convention of all launchers in a kernel table: 0 on
// success, -cudaError_t when a CUDA call fails (problem checks happen in the
// runtime before a launcher is chosen).
#pragma once

#include "ckfmha/ckfmha.h"

#include <cuda_runtime.h>

namespace ckfmha::kernel {

// SMs of the current device: the persistent forward grid's width, and what
// the backward's causal launch order sizes its chunks by.
inline int current_device_sms(int* sms) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device);
  }
  return err == cudaSuccess ? 0 : -int(err);
}

// One CTA per (query tile, query head, batch or sequence).
inline dim3 fwd_grid(ckfmha_fwd_problem const& problem, int block_m) {
  return dim3((problem.seqlen_q + block_m - 1) / block_m, problem.nhead_q, problem.batch);
}

template <class Params>
int launch_kernel(void (*kernel)(Params), dim3 grid, int threads, int smem_bytes,
                  ckfmha_stream_t stream, Params const& params) {
  if (smem_bytes > 48 * 1024) {
    // The opt-in limit is per function and per device; setting it each
    // launch is cheap and keeps multi-device processes correct.
    cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
    if (err != cudaSuccess) return -int(err);
  }
  kernel<<<grid, threads, smem_bytes, reinterpret_cast<cudaStream_t>(stream)>>>(params);
  cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? 0 : -int(err);
}

}  // namespace ckfmha::kernel
