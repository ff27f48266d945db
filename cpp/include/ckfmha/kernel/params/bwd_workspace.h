// Where the backward plan keeps D and the fp32 dQ accumulator inside the
// caller's workspace. Host-only and shared by the runtime (which reports the
// size) and the launchers (which carve it up), so the two cannot disagree.
#pragma once

#include "ckfmha/ckfmha.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace ckfmha::kernel {

// Deterministic mode: key tiles are dealt to this many CTAs per (batch, KV
// head), aiming at about two waves of a 132-SM GPU; each split owns a dQ slice.
inline constexpr int64_t kBwdDeterministicTargetCtas = 264;
inline constexpr int64_t kBwdDeterministicKeyBlock = 128;
// Regions start on 256-byte boundaries.
inline constexpr int64_t kBwdWorkspaceAlign = 256;
// Every (sequence, query head) owns a whole number of 64-row blocks in each
// region: a query tile's D, LSE and dQ rows then lie in bounds and 16-byte
// aligned, as bulk copies (TMA) need, whatever seqlen_q is.
inline constexpr int32_t kBwdWorkspaceRowBlock = 64;

struct BwdWorkspaceLayout {
  int32_t dq_splits;
  int32_t rows_per_head;                    // seqlen_q rounded up to kBwdWorkspaceRowBlock
  int64_t delta_offset, delta_elems;        // bytes offset, fp32 elements
  int64_t lse_log2_offset;                  // bytes offset; delta_elems fp32 elements
  int64_t dq_accum_offset, dq_accum_elems;  // all splits
  int64_t dq_accum_split_stride;            // elements per split
  int64_t bytes;
};

inline int32_t bwd_dq_splits(ckfmha_bwd_problem const& p) {
  if (!p.deterministic) return 1;
  int64_t key_blocks = (int64_t(p.seqlen_k) + kBwdDeterministicKeyBlock - 1) /
                       kBwdDeterministicKeyBlock;
  int64_t kv_slices = std::max<int64_t>(1, int64_t(p.batch) * p.nhead_k);
  int64_t wanted = (kBwdDeterministicTargetCtas + kv_slices - 1) / kv_slices;
  return int32_t(std::max<int64_t>(1, std::min(key_blocks, wanted)));
}

inline int32_t bwd_workspace_rows_per_head(int32_t seqlen_q) {
  return (seqlen_q + kBwdWorkspaceRowBlock - 1) / kBwdWorkspaceRowBlock * kBwdWorkspaceRowBlock;
}

inline BwdWorkspaceLayout bwd_workspace_layout(ckfmha_bwd_problem const& p) {
  auto round_up = [](int64_t bytes) {
    return (bytes + kBwdWorkspaceAlign - 1) / kBwdWorkspaceAlign * kBwdWorkspaceAlign;
  };
  BwdWorkspaceLayout w{};
  w.dq_splits = bwd_dq_splits(p);
  w.rows_per_head = bwd_workspace_rows_per_head(p.seqlen_q);
  int64_t rows = int64_t(p.batch) * p.nhead_q * w.rows_per_head;
  w.delta_offset = 0;
  w.delta_elems = rows;
  w.lse_log2_offset = round_up(rows * int64_t(sizeof(float)));
  w.dq_accum_offset = w.lse_log2_offset + round_up(rows * int64_t(sizeof(float)));
  w.dq_accum_split_stride = rows * p.hdim_q;
  w.dq_accum_elems = w.dq_accum_split_stride * w.dq_splits;
  w.bytes = w.dq_accum_offset + round_up(w.dq_accum_elems * int64_t(sizeof(float)));
  return w;
}

}  // namespace ckfmha::kernel
