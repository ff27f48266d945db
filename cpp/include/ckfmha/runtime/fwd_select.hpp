// One-stage forward selection: the reasons a kernel cannot run a forward
// problem, the kernel the dispatcher picks, and the explanation of both.
// Plans (one stage or split-KV) are made from these in fwd_plan.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel_entry.h"

#include <string>
#include <vector>

namespace ckfmha::runtime {

// Empty when `kernel` can run `problem` on `device_arch`, else why not.
// `family` is the stage asked for: a fwd_splitkv kernel computes the same
// signature as a fwd one, in the first stage of a split-KV plan.
std::string reject_reason(ckfmha_kernel_entry const& kernel, ckfmha_fwd_problem const& problem,
                          int device_arch, ckfmha_family family = CKFMHA_FAMILY_FWD);

// Family, dtype, mode and head dims match: a cheap test that skips building a
// reject reason for most of a large registry on every call.
bool same_shape(ckfmha_kernel_entry const& kernel, ckfmha_fwd_problem const& problem,
                ckfmha_family family);

// Paged K/V: whether the problem reads a page cache, whether a family does,
// the family a paged problem runs (fwd_pagedkv in batch mode, batch_prefill in
// group mode).
bool is_paged(ckfmha_fwd_problem const& problem);
bool is_paged_family(ckfmha_family family);
ckfmha_family paged_family(ckfmha_fwd_problem const& problem);

struct Selection {
  bool found = false;
  ckfmha_kernel_entry kernel{};
  std::string why_none;  // when !found: what is missing and what is available
};

Selection select_fwd(std::vector<ckfmha_kernel_entry> const& kernels,
                     ckfmha_fwd_problem const& problem, int device_arch);

std::string explain_fwd(std::vector<ckfmha_kernel_entry> const& kernels,
                        ckfmha_fwd_problem const& problem, int device_arch);

}  // namespace ckfmha::runtime
