// Conv plans under the learned selection: the cost model's choice replaces
// the hand rules' plan when it predicts a candidate faster by more than the
// pass's margin. Choices are remembered per problem shape, so a training loop
// pays for the trees once per layer.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel_entry.h"
#include "ckfmha/runtime/conv_plan.hpp"
#include "ckfmha/runtime/conv_selection.hpp"

#include <string>
#include <vector>

namespace ckfmha::runtime {

// Whether the process's mode asks for the learned selection and a conv model
// ranks `direction` on `arch`; `why_not` (may be null) gets the reason when
// the mode asks but no model can.
bool conv_learned_applies(ckfmha_conv_direction direction, int arch, std::string* why_not);

// Under the learned selection, replaces `plan` (the hand rules' automatic
// plan of the pass) with the model's choice and returns true; returns false
// when the rules' plan stays, with `note` saying why when the mode asked for
// the model. Backward-data's phases are planned by plan_conv_bwd_data.
bool apply_learned_conv_plan(std::vector<ckfmha_kernel_entry> const& kernels,
                             ckfmha_conv_problem const& p, ckfmha_conv_direction direction,
                             ConvPlanContext const& context, ConvPlan* plan, std::string* note);

// The learned choice among `candidates` (already restricted to plans that
// can run), remembered per shape: the chosen candidate's index, or -1 when
// the hand rules' plan stays. `why` gets the account.
int learned_conv_index(ckfmha_conv_problem const& p, ckfmha_conv_direction direction,
                       ConvPlanContext const& context, std::vector<ConvCandidate>* candidates,
                       std::string* why);

// The plans the learned selection weighs for a forward or backward-weight
// pass in `context` (conv_candidates over the kernels that fit).
std::vector<ConvCandidate> learned_conv_candidates(
    std::vector<ckfmha_kernel_entry> const& kernels, ckfmha_conv_problem const& p,
    ckfmha_conv_direction direction, ConvPlanContext const& context);

// explain's lines for `candidates`: each prediction, least first ("" without
// a conv model).
std::string format_conv_predictions(ckfmha_conv_problem const& p,
                                    ckfmha_conv_direction direction, int sm_count,
                                    std::vector<ConvCandidate> candidates);

}  // namespace ckfmha::runtime
