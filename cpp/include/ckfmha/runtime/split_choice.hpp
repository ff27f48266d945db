// Which split-KV kernel serves a problem, and into how many key splits: the
// CTAs each SM holds (the occupancy calculator's count, or an estimate), the
// wave model for fp16/bf16 K/V, and the ranking by CTAs at work for fp8 K/V,
// whose pace is its own widening. fwd_plan.cpp builds plans from them.
#pragma once

#include "ckfmha/runtime/fwd_plan.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace ckfmha::runtime {

// The fewest key tiles a fp16/bf16 split keeps, and the most splits the wave
// model tries (split_choice.cpp says why).
constexpr int64_t kMinKeyTilesPerSplit = 2;
constexpr int64_t kAutoMaxSplits = 128;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Query rows a split-KV tile packs per K/V head: the heads sharing it times
// the query positions.
inline int64_t packed_rows(ckfmha_fwd_problem const& p) {
  return int64_t(p.seqlen_q) * (p.nhead_q / p.nhead_k);
}

// The split-KV kernel of `family` (fwd_splitkv or a paged family) for `p`,
// with the split count left to heuristic_num_splits when p.num_splits is 0.
bool find_split_kernel(std::vector<ckfmha_kernel_entry> const& kernels,
                       ckfmha_fwd_problem const& p, PlanContext const& context,
                       ckfmha_kernel_entry* out,
                       ckfmha_family family = CKFMHA_FAMILY_FWD_SPLITKV);

// The split count the dispatcher chooses for `split` when the problem leaves
// num_splits at 0.
int heuristic_num_splits(ckfmha_fwd_problem const& problem, ckfmha_kernel_entry const& split,
                         PlanContext const& context);

// CTAs of `split` one SM holds at once: the occupancy calculator's count on a
// live device (context.live_device), else the estimate below.
int resident_ctas_per_sm(ckfmha_kernel_entry const& split, PlanContext const& context);

// The same count estimated from the split kernel's shared memory, threads and
// a worst-case 256 registers per thread (ptxas's count is known only to the
// compiled code).
int estimated_resident_ctas_per_sm(ckfmha_kernel_entry const& split, int device_arch);

// "N resident CTAs per SM (where N comes from)", for plans' reasons.
std::string resident_ctas_text(ckfmha_kernel_entry const& split, PlanContext const& context);

}  // namespace ckfmha::runtime
