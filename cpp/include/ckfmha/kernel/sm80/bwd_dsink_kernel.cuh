// The sink gradient of the backward, launched by the bwd_dot_do_o stage right
// after its row kernel when the forward had sinks:
//   dsink[h] = -sum over (batch, query) of exp(sink[h] - LSE) * D,
// with D = rowsum(dO * O): exp(sink - LSE) is the share of the row's softmax
// the sink takes, and d(every key's probability)/d(sink) = -that share times
// the probability, so dO/dsink = -share * O (dropout included).
//
// It reads only what bwd_dot_do_o has just written to the workspace: D and the
// log2-domain LSE, 8 bytes per (query, head) against the 4 * hdim_v bytes of
// O and dO that stage reads, so it adds a launch and little traffic.
//
// One CTA per query head walks that head's rows of every sequence; each
// thread keeps the rows r = tid, tid + threads, ... and the CTA combines the
// partials with a fixed shuffle tree. No atomics: the bits of dsink depend
// only on the problem, never on the run or on the dQ mode.
#pragma once

#include "ckfmha/kernel/common/online_softmax.cuh"
#include "ckfmha/kernel/common/sequence_slice.cuh"
#include "ckfmha/kernel/params/bwd_params.h"
#include "ckfmha/kernel/params/bwd_workspace_rows.cuh"

#include <cmath>
#include <cstdint>

namespace ckfmha::kernel {

// Threads per CTA: enough loads in flight to stream one head's rows, few
// enough warps that the final combine is one warp's shuffle tree.
inline constexpr int kBwdDsinkThreads = 512;

template <bool IsGroupMode>
__global__ void __launch_bounds__(kBwdDsinkThreads)
    bwd_dsink_kernel(__grid_constant__ const BwdParams p) {
  constexpr int kWarps = kBwdDsinkThreads / 32;
  static_assert(kWarps <= 32, "one warp combines the warps' partial sums");
  constexpr float kLog2e = 1.4426950408889634f;
  __shared__ float warp_sums[kWarps];

  const int head = blockIdx.x;
  const int tid = threadIdx.x;
  // The workspace LSE is +inf for a row that saw nothing (LSE -inf), which
  // makes its term exp2(-inf) * D = 0 rather than NaN.
  const float sink_log2 = p.sink[head] * kLog2e;
  float sum = 0.f;
  for (int batch = 0; batch < p.batch; ++batch) {
    // The rows bwd_dot_do_o wrote: a sequence it skipped (metadata out of
    // range) has none, and group-mode rows past a sequence's end are never
    // written, so only [0, seqlen_q) of each sequence is read.
    const SequenceSlice seq = locate_sequence<IsGroupMode>(p, batch);
    const int64_t row0 = bwd_workspace_row0(p, batch, head);
    float const* delta = p.delta + row0;
    float const* lse_log2 = p.lse_log2 + row0;
#pragma unroll 4
    for (int r = tid; r < seq.seqlen_q; r += kBwdDsinkThreads) {
      sum += exp2f(sink_log2 - lse_log2[r]) * delta[r];
    }
  }

  sum = lane_group_sum<32>(sum);
  if (tid % 32 == 0) warp_sums[tid / 32] = sum;
  __syncthreads();
  if (tid < 32) {
    float total = lane_group_sum<32>(tid < kWarps ? warp_sums[tid] : 0.f);
    if (tid == 0) p.dsink[head] = -total;
  }
}

}  // namespace ckfmha::kernel
