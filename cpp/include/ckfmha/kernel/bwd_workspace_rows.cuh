// Device-side indexing of the backward workspace (see bwd_workspace.h for
// where its regions lie), shared by every dq_dk_dv pipeline and the row-wise
// stages so that they agree on the rows.
#pragma once

#include "ckfmha/kernel/bwd_params.h"

#include <cstdint>

namespace ckfmha::kernel {

// Row-major fp32 workspace rows of (batch or sequence, query head): D, the
// log2-domain LSE and the dQ accumulator give every head workspace_rows rows.
__device__ __forceinline__ int64_t bwd_workspace_row0(BwdParams const& p, int batch, int head) {
  return (int64_t(batch) * p.nhead_q + head) * p.workspace_rows;
}

}  // namespace ckfmha::kernel
