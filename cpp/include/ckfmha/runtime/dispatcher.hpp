// Kernel selection for forward problems: hard rules reject kernels that
// cannot run the problem, then a preference order picks among the rest.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel_entry.h"

#include <string>
#include <vector>

namespace ckfmha::runtime {

// Can SASS built for `kernel_arch` (e.g. 80, 90 with the "a" suffix in
// arch_name) run on a device of `device_arch`?
bool arch_runs_on(ckfmha_kernel_entry const& kernel, int device_arch);

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

// A fwd kernel's preference among those that fit: the narrowest mask kind.
bool mask_kind_preferred(ckfmha_mask_kind kind, ckfmha_mask mask);

struct Selection {
  bool found = false;
  ckfmha_kernel_entry kernel{};
  std::string why_none;  // when !found: what is missing and what is available
};

Selection select_fwd(std::vector<ckfmha_kernel_entry> const& kernels,
                     ckfmha_fwd_problem const& problem, int device_arch);

std::string explain_fwd(std::vector<ckfmha_kernel_entry> const& kernels,
                        ckfmha_fwd_problem const& problem, int device_arch);

// ---- backward: a plan of three stages

// Empty when `kernel` (of any backward family) can run its stage of
// `problem` on `device_arch`, else why not.
std::string reject_reason_bwd(ckfmha_kernel_entry const& kernel,
                              ckfmha_bwd_problem const& problem, int device_arch);

struct BwdPlan {
  bool found = false;
  ckfmha_kernel_entry dot_do_o{};
  ckfmha_kernel_entry dq_dk_dv{};
  ckfmha_kernel_entry convert_dq{};
  std::string why_none;
};

// `forced` (may be null) names the bwd_dq_dk_dv kernel to use; the row-wise
// stages are always chosen to match.
BwdPlan select_bwd(std::vector<ckfmha_kernel_entry> const& kernels,
                   ckfmha_bwd_problem const& problem, int device_arch,
                   ckfmha_kernel_entry const* forced = nullptr);

std::string explain_bwd(std::vector<ckfmha_kernel_entry> const& kernels,
                        ckfmha_bwd_problem const& problem, int device_arch);

}  // namespace ckfmha::runtime
