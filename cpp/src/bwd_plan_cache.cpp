// The backward's plans, remembered per thread (recent_plans.hpp): choosing
// the three stages walks every registered backward kernel, and a training
// loop asks for the same few problems step after step.
#include "ckfmha/runtime/bwd_plan.hpp"
#include "ckfmha/runtime/recent_plans.hpp"
#include "ckfmha/runtime/selection_model.hpp"

#include <cstring>
#include <string>

namespace ckfmha::runtime {

namespace {

struct BwdPlanKey {
  ckfmha_bwd_problem problem{};
  int device_arch = 0;
  ckfmha_selection selection = CKFMHA_SELECTION_HEURISTIC;
  int num_sms = 0;
  uint64_t selection_generation = 0;
  std::string forced_name;  // empty: automatic selection
  // Registering a module only appends kernels, so the count identifies the
  // registry's contents for the plans made from it.
  size_t kernel_count = 0;

  bool operator==(BwdPlanKey const& other) const {
    // Byte comparison: a difference in padding can only cause a miss, never a
    // wrong hit.
    return kernel_count == other.kernel_count && device_arch == other.device_arch &&
           selection == other.selection && num_sms == other.num_sms &&
           selection_generation == other.selection_generation &&
           forced_name == other.forced_name &&
           std::memcmp(&problem, &other.problem, sizeof(problem)) == 0;
  }
};

}  // namespace

BwdPlan const& cached_select_bwd(std::vector<ckfmha_kernel_entry> const& kernels,
                                 ckfmha_bwd_problem const& problem, int device_arch,
                                 ckfmha_kernel_entry const* forced,
                                 BwdSelection const& selection) {
  thread_local RecentPlans<BwdPlanKey, BwdPlan> recent;
  BwdPlanKey key;
  std::memcpy(&key.problem, &problem, sizeof(problem));
  key.device_arch = device_arch;
  key.selection = selection.mode;
  key.num_sms = selection.num_sms;
  key.selection_generation = selection_generation();
  key.forced_name = forced != nullptr && forced->name != nullptr ? forced->name : "";
  key.kernel_count = kernels.size();
  return recent.get(
      key, [&] { return select_bwd(kernels, problem, device_arch, forced, selection); },
      [](BwdPlan const& plan) { return plan.found; });
}

}  // namespace ckfmha::runtime
