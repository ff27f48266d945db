// A per-thread memo of recent backward plans. Choosing the three stages walks
// every registered backward kernel and formats a reason for each it rejects;
// a training loop asks for the same few problems step after step, so the
// answer is remembered, as the forward's (fwd_plan_cache.cpp).
#include "ckfmha/runtime/bwd_plan.hpp"
#include "ckfmha/runtime/selection_model.hpp"

#include <array>
#include <cstring>
#include <string>

namespace ckfmha::runtime {

namespace {

struct CachedBwdPlan {
  bool valid = false;
  ckfmha_bwd_problem problem{};
  int device_arch = 0;
  BwdSelection selection{};
  uint64_t selection_generation = 0;
  std::string forced_name;  // empty: automatic selection
  // Registering a module only appends kernels, so the count identifies the
  // registry's contents for the plans made from it.
  size_t kernel_count = 0;
  BwdPlan plan;
};

constexpr size_t kCachedBwdPlans = 8;

const char* forced_name(ckfmha_kernel_entry const* forced) {
  return forced != nullptr && forced->name != nullptr ? forced->name : "";
}

bool same_key(CachedBwdPlan const& entry, std::vector<ckfmha_kernel_entry> const& kernels,
              ckfmha_bwd_problem const& problem, int device_arch,
              ckfmha_kernel_entry const* forced, BwdSelection const& selection,
              uint64_t generation) {
  // Byte comparison: a difference in padding can only cause a miss, never a
  // wrong hit.
  return entry.valid && entry.kernel_count == kernels.size() &&
         entry.device_arch == device_arch && entry.selection.mode == selection.mode &&
         entry.selection.num_sms == selection.num_sms &&
         entry.selection_generation == generation && entry.forced_name == forced_name(forced) &&
         std::memcmp(&entry.problem, &problem, sizeof(problem)) == 0;
}

}  // namespace

BwdPlan const& cached_select_bwd(std::vector<ckfmha_kernel_entry> const& kernels,
                                 ckfmha_bwd_problem const& problem, int device_arch,
                                 ckfmha_kernel_entry const* forced,
                                 BwdSelection const& selection) {
  thread_local std::array<CachedBwdPlan, kCachedBwdPlans> cache;
  thread_local size_t next_slot = 0;
  const uint64_t generation = selection_generation();
  for (auto const& entry : cache) {
    if (same_key(entry, kernels, problem, device_arch, forced, selection, generation)) {
      return entry.plan;
    }
  }
  CachedBwdPlan& slot = cache[next_slot];
  next_slot = (next_slot + 1) % kCachedBwdPlans;
  slot.valid = false;
  slot.plan = select_bwd(kernels, problem, device_arch, forced, selection);
  // Failed plans are not kept: the error path need not be fast.
  if (!slot.plan.found) return slot.plan;
  std::memcpy(&slot.problem, &problem, sizeof(problem));
  slot.device_arch = device_arch;
  slot.selection = selection;
  slot.selection_generation = generation;
  slot.forced_name = forced_name(forced);
  slot.kernel_count = kernels.size();
  slot.valid = true;
  return slot.plan;
}

}  // namespace ckfmha::runtime
