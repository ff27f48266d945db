// Forward plans: one stage (a fwd kernel) or two (fwd_splitkv, then
// fwd_splitkv_combine merging its fp32 partials), with the split count and
// the workspace the second kind needs. A split plan of one split is the
// fwd_splitkv stage alone, writing O and LSE itself: no combine, no workspace.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel_entry.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ckfmha::runtime {

// Upper bound on the split count, asked for or chosen.
constexpr int kMaxSplits = 256;

struct FwdPlan {
  bool found = false;
  bool split = false;
  ckfmha_kernel_entry kernel{};   // the one-stage kernel, or the split stage
  ckfmha_kernel_entry combine{};  // split plans; launched only when combined()
  int num_splits = 1;             // split plans: the resolved count (>= 1)
  size_t workspace_bytes = 0;
  std::string why;  // found: why this plan; else what is missing

  // Whether the split stage's partials go through the combine stage (and a
  // workspace): split plans of two or more splits. One split writes O itself.
  bool combined() const { return split && num_splits > 1; }
};

// What the planner knows beyond the problem.
struct PlanContext {
  int device_arch = 0;
  int num_sms = 0;
  // Whether the current device has device_arch. Resident CTAs of a split
  // kernel then come from the occupancy calculator on its compiled code;
  // otherwise (explaining another arch, no device) they are estimated.
  bool live_device = false;
  // Whether the caller gives a workspace. Without one an automatic plan uses
  // no plan that needs one (so callers that never heard of workspaces keep
  // working): one stage, or a split plan of one split.
  bool workspace_available = true;
  // A kernel the caller forces by name, or nullptr.
  ckfmha_kernel_entry const* forced = nullptr;
  // Who decides automatic plans (ckfmha_set_selection), and the generation of
  // the model and tuning table they were made under (selection_model.hpp).
  ckfmha_selection selection = CKFMHA_SELECTION_HEURISTIC;
  uint64_t selection_generation = 0;
};

FwdPlan plan_fwd(std::vector<ckfmha_kernel_entry> const& kernels,
                 ckfmha_fwd_problem const& problem, PlanContext const& context);

// plan_fwd, remembered per thread for the last few (problem, context) keys.
// The reference stays valid until this thread plans again.
FwdPlan const& cached_plan_fwd(std::vector<ckfmha_kernel_entry> const& kernels,
                               ckfmha_fwd_problem const& problem, PlanContext const& context);

// The SM count assumed for `arch` when no device of that arch is present.
int reference_sm_count(int arch);

// explain_fwd's one-stage listing plus the plan and every split-KV kernel's
// fit or rejection.
std::string explain_fwd_plan(std::vector<ckfmha_kernel_entry> const& kernels,
                             ckfmha_fwd_problem const& problem, PlanContext const& context);

}  // namespace ckfmha::runtime
