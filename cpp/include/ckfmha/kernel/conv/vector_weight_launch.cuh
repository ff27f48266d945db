// Host-side launcher of the backward-weight vector path, which the direct
// backward-weight instances of 1, 2, 4 and 8 channels a group run where the
// tensors allow.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel/common/launch.cuh"
#include "ckfmha/kernel/conv/vector_weight_kernel.cuh"
#include "ckfmha/kernel/params/conv_params.h"
#include "ckfmha/kernel/params/conv_vector_weight_layout.h"

#include <algorithm>
#include <cstdint>

namespace ckfmha::kernel {

using VectorWeightKernel = void (*)(ConvVectorWeightParams);

// The vector path's instantiation for groups of kG channels, tasks of `cols`
// columns (conv_vector_weight_cols), the stride along w and runs of `run`
// positions (conv_vector_weight_run, or one fewer where
// conv_vector_weight_has_short_runs).
template <class Element, int kG>
VectorWeightKernel vector_weight_kernel(int32_t cols, int32_t stride_w, int32_t run) {
  constexpr int kCols = kG == 8 ? 1 : 3;
  if constexpr (kG == 1) {
    constexpr int kRow = conv_vector_weight_cols(kG, kDepthwiseMaxWidth);
    constexpr int kRowRun = conv_vector_weight_run(kG, kRow, 1);
    static_assert(conv_vector_weight_has_short_runs(kG, kRow, 1));
    if (cols == kRow) {
      if (stride_w != 1) {
        return &conv_bwd_weight_vector_kernel<Element, 2, kRow, kG,
                                              conv_vector_weight_run(kG, kRow, 2)>;
      }
      return run == kRowRun ? &conv_bwd_weight_vector_kernel<Element, 1, kRow, kG, kRowRun>
                            : &conv_bwd_weight_vector_kernel<Element, 1, kRow, kG, kRowRun - 1>;
    }
  }
  return stride_w == 1
             ? &conv_bwd_weight_vector_kernel<Element, 1, kCols, kG,
                                              conv_vector_weight_run(kG, kCols, 1)>
             : &conv_bwd_weight_vector_kernel<Element, 2, kCols, kG,
                                              conv_vector_weight_run(kG, kCols, 2)>;
}

// The backward-weight vector path (vector_weight_kernel.cuh) for groups of
// kG channels, where conv_vector_weight_fits, on conv_vector_weight_layout's
// grid. `accum` is the zeroed fp32 workspace where the layout adds into it,
// and null where it stores dw (conv.w) itself; the runtime reads the same
// layout to know which.
template <class Element, int kG>
int launch_conv_bwd_weight_vector(ConvFwdParams const& conv, float* accum,
                                  ckfmha_stream_t stream) {
  if (int64_t(conv.batch) * conv.output[0] * conv.output[1] * conv.output[2] == 0) return 0;
  int sms = 0;
  if (int err = current_device_sms(&sms)) return err;
  const int32_t cols = conv_vector_weight_cols(kG, conv.filter[2]);
  VectorWeightKernel kernel = vector_weight_kernel<Element, kG>(
      cols, conv.stride[2], conv_vector_weight_run(kG, cols, conv.stride[2]));
  // Clusters where the instance's code is sm_90's (the kernel's exchange
  // through distributed shared memory is compiled there only).
  cudaFuncAttributes attributes{};
  if (cudaError_t err = cudaFuncGetAttributes(&attributes, kernel); err != cudaSuccess) {
    return -int(err);
  }
  const ConvVectorWeightLayout l =
      conv_vector_weight_layout(kG, conv, sms, attributes.binaryVersion >= 90);
  kernel = vector_weight_kernel<Element, kG>(cols, conv.stride[2], l.run);
  // The runtime decided from the same layout: a workspace exactly where sums are added.
  if ((accum == nullptr) != (l.stores_dw != 0)) return -int(cudaErrorInvalidValue);
  if (l.grid[1] > 65535 || l.grid[2] > 65535) return -int(cudaErrorInvalidConfiguration);
  ConvVectorWeightParams dp{};
  dp.conv = conv;
  dp.accum = accum;
  dp.vectors_per_cta = l.vectors_per_cta;
  dp.column_blocks = l.column_blocks;
  dp.tasks_per_cta = l.tasks_per_cta;
  dp.warps_per_task = l.warps_per_task;
  dp.w_slots = l.w_slots;
  dp.h_slots = l.h_slots;
  dp.w_chunks = l.w_chunks;
  dp.rows_per_strip = l.rows_per_strip;
  dp.stores_dw = l.stores_dw;
  const dim3 grid{unsigned(l.grid[0]), unsigned(l.grid[1]), unsigned(l.grid[2])};
  const int32_t row_chunks = (conv.output[1] + l.rows_per_strip - 1) / l.rows_per_strip;
  dp.strip_step = conv_strip_digits(grid.x, l.w_chunks, row_chunks, conv.output[0]);
  const int threads = l.tasks_per_cta * l.warps_per_task * 32;
  // The warps' sums, then (clusters) the CTA's totals the others read.
  const int per_warp = l.cols * l.vectors_per_cta * conv_vector_weight_channels(kG, l.cols) * kG;
  const int slots = threads / 32 + (l.stores_dw && grid.x > 1 ? l.tasks_per_cta : 0);
  const int smem = int(slots * per_warp * sizeof(float));
  if (l.stores_dw && grid.x > 1) {
    return launch_kernel_cluster(kernel, grid, dim3(grid.x, 1, 1), threads, smem, stream, dp);
  }
  return launch_kernel(kernel, grid, threads, smem, stream, dp);
}

}  // namespace ckfmha::kernel
