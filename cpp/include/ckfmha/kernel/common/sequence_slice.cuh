// Shared by every pipeline and by the backward stages, so batch and group
// (varlen) mode resolve sequences identically whatever the kernel's thread
// mapping.
#pragma once

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

// Params: FwdParams or BwdParams (cu_seqlens_q/k, seqlen_q/k, skip_min_seqlen_q).
template <bool IsGroupMode, class Params>
__device__ __forceinline__ SequenceSlice locate_sequence(Params const& p, int batch) {
  if constexpr (IsGroupMode) {
    int q0 = p.cu_seqlens_q[batch], k0 = p.cu_seqlens_k[batch];
    int sq = p.cu_seqlens_q[batch + 1] - q0, sk = p.cu_seqlens_k[batch + 1] - k0;
    return {sq, sk, q0, k0, sq < p.skip_min_seqlen_q};
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
    int q0 = p.cu_seqlens_q[batch];
    int sq = p.cu_seqlens_q[batch + 1] - q0;
    return {sq, 0, q0, 0, sq < p.skip_min_seqlen_q};
  } else {
    return {p.seqlen_q, 0, 0, 0, false};
  }
}

}  // namespace ckfmha::kernel
