// Layout of the split-KV workspace, shared by the runtime (which sizes it) and
// the launchers (which carve it), so the two can never disagree.
//
// For S splits the workspace holds, in fp32,
//   partial LSE [S, batch, nhead_q, seqlen_q]          (natural log)
//   partial O   [S, batch, nhead_q, seqlen_q, hdim_v]  (normalised by its own split's sum)
// with the O block starting on a 256-byte boundary. Group mode indexes rows by
// (sequence, head, position in the sequence) with seqlen_q the longest
// sequence, so both modes share one layout and no device-side token count is
// needed on the host. One split writes O and LSE directly and needs none.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel/params/fwd_params.h"

#include <cstdint>

namespace ckfmha::kernel {

struct SplitKvWorkspace {
  int64_t rows_per_split;  // batch * nhead_q * seqlen_q
  int64_t lse_offset;      // bytes from the workspace start
  int64_t o_offset;        // bytes from the workspace start, 256-byte aligned
  int64_t bytes;           // total
};

inline SplitKvWorkspace splitkv_workspace(ckfmha_fwd_problem const& problem, int num_splits) {
  constexpr int64_t kAlign = 256;
  SplitKvWorkspace w{};
  w.rows_per_split = int64_t(problem.batch) * problem.nhead_q * problem.seqlen_q;
  const int64_t lse_bytes = int64_t(num_splits) * w.rows_per_split * int64_t(sizeof(float));
  w.lse_offset = 0;
  w.o_offset = (lse_bytes + kAlign - 1) / kAlign * kAlign;
  w.bytes = num_splits == 1 ? 0 : w.o_offset + lse_bytes * problem.hdim_v;
  return w;
}

// The partial pointers inside the caller's workspace, per splitkv_workspace.h.
inline void set_splitkv_params(FwdParams& p, ckfmha_fwd_problem const& problem,
                               ckfmha_fwd_args const& args) {
  p.num_splits = problem.num_splits;
  p.batch = problem.batch;
  if (problem.num_splits == 1) return;  // one split writes O and LSE: no workspace
  SplitKvWorkspace layout = splitkv_workspace(problem, problem.num_splits);
  auto* base = static_cast<char*>(args.workspace);
  p.partial_lse = reinterpret_cast<float*>(base + layout.lse_offset);
  p.partial_o = reinterpret_cast<float*>(base + layout.o_offset);
}

}  // namespace ckfmha::kernel
