// The forward's plans, remembered per thread (recent_plans.hpp): serving
// loops ask for the same few shapes over and over, and each ckfmha_fwd call
// plans twice (workspace size, then the launch).
#include "ckfmha/runtime/fwd_plan.hpp"
#include "ckfmha/runtime/recent_plans.hpp"

#include <cstring>
#include <string>

namespace ckfmha::runtime {

namespace {

struct FwdPlanKey {
  ckfmha_fwd_problem problem{};
  int device_arch = 0;
  int num_sms = 0;
  bool live_device = false;
  bool workspace_available = false;
  ckfmha_selection selection = CKFMHA_SELECTION_HEURISTIC;
  uint64_t selection_generation = 0;
  std::string forced_name;  // empty: automatic selection
  // Registering a module only appends kernels, so the count identifies the
  // registry's contents for the plans made from it.
  size_t kernel_count = 0;

  bool operator==(FwdPlanKey const& other) const {
    // Byte comparison: a difference in padding can only cause a miss, never a
    // wrong hit.
    return kernel_count == other.kernel_count && device_arch == other.device_arch &&
           num_sms == other.num_sms && live_device == other.live_device &&
           workspace_available == other.workspace_available && selection == other.selection &&
           selection_generation == other.selection_generation &&
           forced_name == other.forced_name &&
           std::memcmp(&problem, &other.problem, sizeof(problem)) == 0;
  }
};

}  // namespace

FwdPlan const& cached_plan_fwd(std::vector<ckfmha_kernel_entry> const& kernels,
                               ckfmha_fwd_problem const& problem, PlanContext const& context) {
  thread_local RecentPlans<FwdPlanKey, FwdPlan> recent;
  FwdPlanKey key;
  std::memcpy(&key.problem, &problem, sizeof(problem));
  key.device_arch = context.device_arch;
  key.num_sms = context.num_sms;
  key.live_device = context.live_device;
  key.workspace_available = context.workspace_available;
  key.selection = context.selection;
  key.selection_generation = context.selection_generation;
  key.forced_name =
      context.forced != nullptr && context.forced->name != nullptr ? context.forced->name : "";
  key.kernel_count = kernels.size();
  return recent.get(
      key, [&] { return plan_fwd(kernels, problem, context); },
      [](FwdPlan const& plan) { return plan.found; });
}

}  // namespace ckfmha::runtime
