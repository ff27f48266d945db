// Forward plans decided by the tuning table or the learned cost model
// (ckfmha_selection in ckfmha.h) instead of the hand rules alone.
#pragma once

#include "ckfmha/runtime/fwd_plan.hpp"

#include <string>
#include <vector>

namespace ckfmha::runtime {

// The plan the context's selection picks for a contiguous problem with no
// kernel forced and num_splits 0; `rules` is the hand rules' plan, returned
// (its reason saying why) where the table and the model do not decide.
FwdPlan plan_fwd_selected(std::vector<ckfmha_kernel_entry> const& kernels,
                          ckfmha_fwd_problem const& problem, PlanContext const& context,
                          FwdPlan rules);

// explain's lines for a learned or tuned selection: every candidate plan with
// its predicted time, fastest first, or why the model does not rank them.
std::string explain_fwd_predictions(std::vector<ckfmha_kernel_entry> const& kernels,
                                    ckfmha_fwd_problem const& problem,
                                    PlanContext const& context);

}  // namespace ckfmha::runtime
