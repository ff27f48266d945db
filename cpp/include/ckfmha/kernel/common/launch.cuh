// Host-side pieces the launchers share: the forward grid, the SM count and
// the launch itself. Return convention of all launchers in a kernel table: 0 on
// success, -cudaError_t when a CUDA call fails (problem checks happen in the
// runtime before a launcher is chosen).
#pragma once

#include "ckfmha/ckfmha.h"

#include <cuda_runtime.h>

#include <cstdint>

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

// Shared memory past the 48 KiB default is opt-in per function and per
// device; setting it on every use is cheap and keeps multi-device processes
// correct.
template <class Params>
cudaError_t allow_dynamic_smem(void (*kernel)(Params), int smem_bytes) {
  if (smem_bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
}

template <class Params>
int launch_kernel(void (*kernel)(Params), dim3 grid, int threads, int smem_bytes,
                  ckfmha_stream_t stream, Params const& params) {
  cudaError_t err = allow_dynamic_smem(kernel, smem_bytes);
  if (err != cudaSuccess) return -int(err);
  kernel<<<grid, threads, smem_bytes, reinterpret_cast<cudaStream_t>(stream)>>>(params);
  err = cudaGetLastError();
  return err == cudaSuccess ? 0 : -int(err);
}

// As launch_kernel, with the grid's CTAs in clusters of `cluster` (sm_90 and
// later; each of the grid's dims a multiple of the cluster's).
template <class Params>
int launch_kernel_cluster(void (*kernel)(Params), dim3 grid, dim3 cluster, int threads,
                          int smem_bytes, ckfmha_stream_t stream, Params const& params) {
  cudaError_t err = allow_dynamic_smem(kernel, smem_bytes);
  if (err != cudaSuccess) return -int(err);
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(unsigned(threads), 1, 1);
  config.dynamicSmemBytes = size_t(smem_bytes);
  config.stream = reinterpret_cast<cudaStream_t>(stream);
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = cluster.x;
  attribute.val.clusterDim.y = cluster.y;
  attribute.val.clusterDim.z = cluster.z;
  config.attrs = &attribute;
  config.numAttrs = 1;
  err = cudaLaunchKernelEx(&config, kernel, params);
  if (err == cudaSuccess) err = cudaGetLastError();
  return err == cudaSuccess ? 0 : -int(err);
}

// CTAs of `kernel` one SM of the current device holds at once (the
// ckfmha_resident_ctas_fn convention of kernel_entry.h). The opt-in comes
// first: without it the calculator counts no CTA over 48 KiB.
template <class Params>
int resident_ctas_per_sm(void (*kernel)(Params), int threads, int smem_bytes,
                         int32_t* ctas_per_sm) {
  cudaError_t err = allow_dynamic_smem(kernel, smem_bytes);
  int ctas = 0;
  if (err == cudaSuccess) {
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, threads, smem_bytes);
  }
  *ctas_per_sm = ctas;
  return err == cudaSuccess ? 0 : -int(err);
}

}  // namespace ckfmha::kernel
