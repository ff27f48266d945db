// A per-thread memo of recent forward plans. Planning walks every registered
// kernel and formats its reasons; serving loops ask for the same few shapes
// over and over, and each ckfmha_fwd call plans twice (workspace size, then
// the launch), so remembering the answer keeps that off the launch path.
#include "ckfmha/runtime/fwd_plan.hpp"

#include <array>
#include <cstring>
#include <string>

namespace ckfmha::runtime {

namespace {

struct CachedPlan {
  bool valid = false;
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
  FwdPlan plan;
};

constexpr size_t kCachedPlans = 8;

bool same_key(CachedPlan const& entry, std::vector<ckfmha_kernel_entry> const& kernels,
              ckfmha_fwd_problem const& problem, PlanContext const& context) {
  const char* forced = context.forced != nullptr && context.forced->name != nullptr
                           ? context.forced->name
                           : "";
  // Byte comparison: a difference in padding can only cause a miss, never a
  // wrong hit.
  return entry.valid && entry.kernel_count == kernels.size() &&
         entry.device_arch == context.device_arch && entry.num_sms == context.num_sms &&
         entry.live_device == context.live_device &&
         entry.workspace_available == context.workspace_available &&
         entry.selection == context.selection &&
         entry.selection_generation == context.selection_generation &&
         entry.forced_name == forced &&
         std::memcmp(&entry.problem, &problem, sizeof(problem)) == 0;
}

}  // namespace

FwdPlan const& cached_plan_fwd(std::vector<ckfmha_kernel_entry> const& kernels,
                               ckfmha_fwd_problem const& problem, PlanContext const& context) {
  thread_local std::array<CachedPlan, kCachedPlans> cache;
  thread_local size_t next_slot = 0;
  for (auto const& entry : cache) {
    if (same_key(entry, kernels, problem, context)) return entry.plan;
  }
  CachedPlan& slot = cache[next_slot];
  next_slot = (next_slot + 1) % kCachedPlans;
  slot.valid = false;
  slot.plan = plan_fwd(kernels, problem, context);
  // Failed plans are not kept: their messages may depend on state the key
  // does not hold, and the error path need not be fast.
  if (!slot.plan.found) return slot.plan;
  std::memcpy(&slot.problem, &problem, sizeof(problem));
  slot.device_arch = context.device_arch;
  slot.num_sms = context.num_sms;
  slot.live_device = context.live_device;
  slot.workspace_available = context.workspace_available;
  slot.selection = context.selection;
  slot.selection_generation = context.selection_generation;
  slot.forced_name =
      context.forced != nullptr && context.forced->name != nullptr ? context.forced->name : "";
  slot.kernel_count = kernels.size();
  slot.valid = true;
  return slot.plan;
}

}  // namespace ckfmha::runtime
