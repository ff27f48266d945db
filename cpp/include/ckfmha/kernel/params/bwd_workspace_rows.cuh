// Device-side indexing of the backward workspace (see bwd_workspace.h for
// where its regions lie), shared by every dq_dk_dv pipeline and the row-wise
// stages so that they agree on the rows.
#pragma once

#include "ckfmha/kernel/params/bwd_params.h"
#include "ckfmha/kernel/params/bwd_workspace.h"  // kBwdWorkspaceRowBlock

#include <cmath>
#include <cstdint>

namespace ckfmha::kernel {

// Row-major fp32 workspace rows of (batch or sequence, query head): D, the
// log2-domain LSE and the dQ accumulator give every head workspace_rows rows.
__device__ __forceinline__ int64_t bwd_workspace_row0(BwdParams const& p, int batch, int head) {
  return (int64_t(batch) * p.nhead_q + head) * p.workspace_rows;
}

// One past the last workspace row of a (sequence, head) that a main stage
// reading whole row blocks touches: seqlen_q rounded up to a block. In
// batch mode this is workspace_rows; in group mode a shorter sequence's
// blocks end before it.
__device__ __forceinline__ int bwd_workspace_rows_read(int seqlen_q) {
  return (seqlen_q + kBwdWorkspaceRowBlock - 1) / kBwdWorkspaceRowBlock * kBwdWorkspaceRowBlock;
}

// A forward LSE in the log2 domain, as the main stages subtract it from
// log2-domain logits. A row that saw no key has LSE -inf and P = 0
// everywhere: +inf keeps exp2(s - lse) at 0 instead of NaN (-inf - -inf).
__device__ __forceinline__ float bwd_lse_log2(float lse) {
  constexpr float kLog2e = 1.4426950408889634f;
  return lse == -INFINITY ? INFINITY : lse * kLog2e;
}

}  // namespace ckfmha::kernel
