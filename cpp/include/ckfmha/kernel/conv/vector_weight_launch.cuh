// Host-side launcher of the backward-weight vector path, which the direct
// backward-weight instances of 1, 2, 4 and 8 channels a group run where the
// tensors allow.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel/common/launch.cuh"
#include "ckfmha/kernel/conv/vector_weight_kernel.cuh"
#include "ckfmha/kernel/params/conv_params.h"

#include <algorithm>
#include <cstdint>

namespace ckfmha::kernel {

// The backward-weight vector path (vector_weight_kernel.cuh) for groups of
// kG channels, where vector_weight_fits. A CTA takes the largest power-of-two
// block of vectors up to 8 that divides the problem's and up to
// vector_weight_warps tasks (filter row, block of columns), that many warps
// shared between them. A task's threads cover a strip: as many runs along w
// as they hold (in even chunks) by the rows left over. Strips shorten, down to those rows,
// until the grid has eight strips a CTA on a wave of one CTA an SM (the
// unevenness of the CTAs' last strips then costs at most an eighth).
template <class Element, int kG>
int launch_conv_bwd_weight_vector(ConvFwdParams const& conv, float* accum,
                                  ckfmha_stream_t stream) {
  constexpr int kVec = conv_vector_weight_channels(kG);
  int sms = 0;
  if (int err = current_device_sms(&sms)) return err;
  const int64_t total_vectors = conv.groups * kG / kVec;
  constexpr int kRun = conv_vector_weight_run(kG);
  constexpr int32_t kWarps = conv_detail::vector_weight_warps(kG);
  const int64_t runs_w = (conv.output[2] + kRun - 1) / kRun;
  const int64_t images = int64_t(conv.batch) * conv.output[0];
  if (images * conv.output[1] * runs_w == 0) return 0;
  ConvVectorWeightParams dp{};
  dp.conv = conv;
  dp.accum = accum;
  dp.vectors_per_cta = 8;
  while (total_vectors % dp.vectors_per_cta != 0) dp.vectors_per_cta /= 2;
  // Filter columns a task sums: one for eight-channel groups (64 sums a
  // column), four for one-channel groups' rows wider than 3 (a 7-wide row in
  // two blocks), else three.
  const int32_t cols = kG == 8 ? 1 : kG == 1 && conv.filter[2] > 3 ? 4 : 3;
  dp.column_blocks = (conv.filter[2] + cols - 1) / cols;
  const int32_t tasks = conv.filter[0] * conv.filter[1] * dp.column_blocks;
  const int32_t task_blocks = (tasks + kWarps - 1) / kWarps;
  dp.tasks_per_cta = (tasks + task_blocks - 1) / task_blocks;
  dp.warps_per_task = kWarps / dp.tasks_per_cta;
  const int32_t slots = dp.warps_per_task * 32 / dp.vectors_per_cta;
  dp.w_chunks = int32_t((runs_w + slots - 1) / slots);
  dp.w_slots = int32_t((runs_w + dp.w_chunks - 1) / dp.w_chunks);
  dp.h_slots = slots / dp.w_slots;
  const int64_t group_blocks = total_vectors / dp.vectors_per_cta;
  const int64_t blocks_yz = group_blocks * task_blocks;
  // One CTA an SM (its registers fill the SM): a grid past the SM count
  // would run a second wave for its last few CTAs.
  const int64_t wave_x = std::max<int64_t>(1, int64_t(sms) / blocks_yz);
  auto strips = [&](int64_t rows) {
    return images * ((conv.output[1] + rows - 1) / rows) * dp.w_chunks;
  };
  int64_t rows = conv.output[1];
  while (rows > dp.h_slots && strips(rows) < 8 * wave_x) {
    rows = std::max<int64_t>(dp.h_slots, (rows + 1) / 2);
  }
  dp.rows_per_strip = int32_t(rows);
  if (group_blocks > 65535) return -int(cudaErrorInvalidConfiguration);
  const dim3 grid{unsigned(std::min(strips(rows), wave_x)), unsigned(group_blocks),
                  unsigned(task_blocks)};
  const int threads = dp.tasks_per_cta * dp.warps_per_task * 32;
  const int smem = int(threads / 32 * cols * dp.vectors_per_cta * kVec * kG * sizeof(float));
  auto kernel = conv.stride[2] == 1 ? &conv_bwd_weight_vector_kernel<Element, 1, 3, kG>
                                    : &conv_bwd_weight_vector_kernel<Element, 2, 3, kG>;
  if constexpr (kG == 8) {
    kernel = conv.stride[2] == 1 ? &conv_bwd_weight_vector_kernel<Element, 1, 1, kG>
                                 : &conv_bwd_weight_vector_kernel<Element, 2, 1, kG>;
  } else if constexpr (kG == 1) {
    if (cols == 4) {
      kernel = conv.stride[2] == 1 ? &conv_bwd_weight_vector_kernel<Element, 1, 4, kG>
                                   : &conv_bwd_weight_vector_kernel<Element, 2, 4, kG>;
    }
  }
  return launch_kernel(kernel, grid, threads, smem, stream, dp);
}

// Whether the vector path runs a problem of groups of kG channels: its
// geometry (conv_vector_weight_limit), x and dy as kVec-channel vectors
// (aligned pointers, strides in whole vectors), and rows whose offsets count
// in 32 bits.
template <int kG>
inline bool vector_weight_fits(ConvFwdParams const& conv) {
  constexpr int kVec = conv_vector_weight_channels(kG);
  if (conv.in_channels != kG ||
      conv_vector_weight_limit(conv.groups, conv.in_channels, conv.out_channels,
                               int64_t(conv.filter[0]) * conv.filter[1] * conv.filter[2],
                               conv.filter[2], conv.stride[2], conv.dilation[2]) != nullptr) {
    return false;
  }
  bool aligned = reinterpret_cast<uintptr_t>(conv.x) % (2 * kVec) == 0 &&
                 reinterpret_cast<uintptr_t>(conv.y) % (2 * kVec) == 0;
  for (int d = 0; d < 4; ++d) {
    aligned = aligned && conv.x_stride[d] % kVec == 0 && conv.y_stride[d] % kVec == 0;
  }
  constexpr int64_t kLimit = int64_t(1) << 30;
  return aligned && conv.x_stride[3] * (conv.input[2] + 8) < kLimit &&
         conv.y_stride[3] * (conv.output[2] + 8) < kLimit;
}

}  // namespace ckfmha::kernel
