// Shared by every pipeline and by the backward stages, so batch and group
// (varlen) mode resolve sequences identically whatever the kernel's thread
// mapping.
//
// Group mode reads each sequence's token range from device memory. A range
// that leaves the packed tensors, runs backwards or is longer than the
// longest sequence the launch was sized for (the grid, the backward
// workspace and the dropout values all are) would take the kernel outside
// the caller's buffers: such a sequence is skipped (its outputs are left as
// they were) and reported through params.errors.
#pragma once

#include "ckfmha/kernel/common/device_errors.cuh"
#include "ckfmha/kernel/params/fwd_params.h"

#include <cstdint>

namespace ckfmha::kernel {

// Where this CTA's sequence lives: lengths and token offsets (group mode) or
// the batch index (batch mode).
struct SequenceSlice {
  int seqlen_q, seqlen_k;
  int64_t q_token0, k_token0;  // first token of the sequence (group mode), else 0
  bool skip;
};

// A sequence that reads and writes nothing.
__device__ __forceinline__ SequenceSlice skipped_sequence() { return {0, 0, 0, 0, true}; }

// Params: FwdParams or BwdParams (cu_seqlens_q/k, total_q/k, seqlen_q/k,
// skip_min_seqlen_q, errors).
template <bool IsGroupMode, class Params>
__device__ __forceinline__ SequenceSlice locate_sequence(Params const& p, int batch) {
  if constexpr (IsGroupMode) {
    const int q0 = p.cu_seqlens_q[batch], q1 = p.cu_seqlens_q[batch + 1];
    const int k0 = p.cu_seqlens_k[batch], k1 = p.cu_seqlens_k[batch + 1];
    if (!range_fits(q0, q1, p.total_q, p.seqlen_q) || !range_fits(k0, k1, p.total_k, p.seqlen_k)) {
      report_device_error(p.errors, &DeviceErrors::sequence_range, batch);
      return skipped_sequence();
    }
    const int sq = q1 - q0;
    return {sq, k1 - k0, q0, k0, sq < p.skip_min_seqlen_q};
  } else {
    return {p.seqlen_q, p.seqlen_k, 0, 0, false};
  }
}

// The query side alone, for kernels that never touch keys (the split-KV
// combine); paged plans, whose keys come from page tables, have no
// cu_seqlens_k. seqlen_k and k_token0 are left 0.
template <bool IsGroupMode, class Params>
__device__ __forceinline__ SequenceSlice locate_queries(Params const& p, int batch) {
  if constexpr (IsGroupMode) {
    const int q0 = p.cu_seqlens_q[batch], q1 = p.cu_seqlens_q[batch + 1];
    if (!range_fits(q0, q1, p.total_q, p.seqlen_q)) {
      report_device_error(p.errors, &DeviceErrors::sequence_range, batch);
      return skipped_sequence();
    }
    const int sq = q1 - q0;
    return {sq, 0, q0, 0, sq < p.skip_min_seqlen_q};
  } else {
    return {p.seqlen_q, 0, 0, 0, false};
  }
}

}  // namespace ckfmha::kernel
