// The pieces of forward planning that the hand rules (fwd_plan.cpp) and the
// learned and tuned selections (fwd_selection.cpp) both build plans from.
#pragma once

#include "ckfmha/runtime/fwd_plan.hpp"

#include <string>
#include <vector>

namespace ckfmha::runtime {

// The combine kernel for split plans of `p` (this arch's SASS preferred).
bool find_combine(std::vector<ckfmha_kernel_entry> const& kernels, ckfmha_fwd_problem const& p,
                  int device_arch, ckfmha_kernel_entry* out);

FwdPlan one_stage(ckfmha_kernel_entry const& kernel, std::string why);
FwdPlan not_found(std::string why);
// A split plan of `num_splits`, or not found when its grid exceeds 2^31 - 1 CTAs.
FwdPlan split_plan(ckfmha_kernel_entry const& split, ckfmha_kernel_entry const& combine,
                   ckfmha_fwd_problem const& p, int num_splits, std::string why);

// The hand rules' automatic plan of a contiguous problem, no kernel forced.
FwdPlan plan_fwd_rules(std::vector<ckfmha_kernel_entry> const& kernels,
                       ckfmha_fwd_problem const& p, PlanContext const& context);

}  // namespace ckfmha::runtime
