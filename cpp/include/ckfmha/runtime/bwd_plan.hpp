// Backward plans: the three stages (bwd_dot_do_o, bwd_dq_dk_dv,
// bwd_convert_dq) a backward problem runs, each with its reasons.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel_entry.h"

#include <string>
#include <vector>

namespace ckfmha::runtime {

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
  std::string why;  // how a learned or tuned selection chose the main stage
};

// Who picks the main stage (ckfmha_selection) and the SM count its features use.
struct BwdSelection {
  ckfmha_selection mode = CKFMHA_SELECTION_HEURISTIC;
  int num_sms = 0;
};

// `forced` (may be null) names the bwd_dq_dk_dv kernel to use; the row-wise
// stages are always chosen to match.
BwdPlan select_bwd(std::vector<ckfmha_kernel_entry> const& kernels,
                   ckfmha_bwd_problem const& problem, int device_arch,
                   ckfmha_kernel_entry const* forced = nullptr,
                   BwdSelection const& selection = {});

// select_bwd through a per-thread memo of recent plans (bwd_plan_cache.cpp):
// the same problem, arch, forced kernel, selection and registry give the same
// plan without walking the kernels again. The reference stays valid until
// this thread plans again.
BwdPlan const& cached_select_bwd(std::vector<ckfmha_kernel_entry> const& kernels,
                                 ckfmha_bwd_problem const& problem, int device_arch,
                                 ckfmha_kernel_entry const* forced,
                                 BwdSelection const& selection);

std::string explain_bwd(std::vector<ckfmha_kernel_entry> const& kernels,
                        ckfmha_bwd_problem const& problem, int device_arch,
                        BwdSelection const& selection = {});

// The main stage a learned or tuned selection picks in place of the hand
// rules' `rules_choice` (returned where the table and model do not decide),
// with *why saying how it was chosen (bwd_selection.cpp).
ckfmha_kernel_entry select_main_stage(std::vector<ckfmha_kernel_entry> const& kernels,
                                      ckfmha_bwd_problem const& problem, int device_arch,
                                      BwdSelection const& selection,
                                      ckfmha_kernel_entry const& rules_choice, std::string* why);

// explain's lines for a learned or tuned selection: each main stage's
// predicted time, fastest first.
std::string explain_bwd_predictions(std::vector<ckfmha_kernel_entry> const& kernels,
                                    ckfmha_bwd_problem const& problem, int device_arch,
                                    BwdSelection const& selection);

}  // namespace ckfmha::runtime
