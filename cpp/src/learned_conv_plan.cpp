#include "ckfmha/runtime/learned_conv_plan.hpp"

#include "ckfmha/runtime/selection_mode.hpp"
#include "ckfmha/runtime/selection_model.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <sstream>
#include <unordered_map>

namespace ckfmha::runtime {

namespace {

// A remembered choice: the candidate (kernel name and splits), or none for
// the hand rules' plan, and the account that came with it.
struct Remembered {
  std::string kernel;  // empty: the hand rules' plan
  int32_t splits = 0;
  std::string why;
};

// Enough shapes for every layer of a large network in three passes; past it
// the table starts over rather than growing without bound.
constexpr size_t kMaxRemembered = 4096;

std::mutex remembered_mutex;
std::unordered_map<std::string, Remembered>& remembered() {
  static std::unordered_map<std::string, Remembered> table;
  return table;
}

// Everything a choice depends on: the pass, the shape, the channel vector and
// workspace the call allows, the device and the model's generation.
std::string shape_key(ckfmha_conv_problem const& p, ckfmha_conv_direction direction,
                      ConvPlanContext const& context) {
  const int64_t values[] = {
      int64_t(direction), int64_t(p.dtype), p.spatial_dims, p.batch, p.groups, p.in_channels,
      p.out_channels, p.input[0], p.input[1], p.input[2], p.filter[0], p.filter[1],
      p.filter[2], p.stride[0], p.stride[1], p.stride[2], p.padding[0], p.padding[1],
      p.padding[2], p.dilation[0], p.dilation[1], p.dilation[2], context.vector,
      context.can_split ? 1 : 0, context.device_arch, context.sm_count,
      int64_t(selection_generation())};
  std::string key(sizeof(values), '\0');
  std::memcpy(key.data(), values, sizeof(values));
  return key;
}

std::string describe_candidate(ConvCandidate const& c, ckfmha_conv_direction direction) {
  std::string out = c.kernel->name;
  if (direction == CKFMHA_CONV_BWD_WEIGHT) out += " splits=" + std::to_string(c.splits);
  return out;
}

}  // namespace

bool conv_learned_applies(ckfmha_conv_direction direction, int arch, std::string* why_not) {
  if (current_selection() == CKFMHA_SELECTION_HEURISTIC) return false;
  auto model = current_conv_selection_model();
  std::string gap = conv_model_gap(model.get(), direction, arch);
  if (why_not != nullptr) *why_not = gap;
  return gap.empty();
}

int learned_conv_index(ckfmha_conv_problem const& p, ckfmha_conv_direction direction,
                       ConvPlanContext const& context, std::vector<ConvCandidate>* candidates,
                       std::string* why) {
  const std::string key = shape_key(p, direction, context);
  {
    std::lock_guard<std::mutex> lock(remembered_mutex);
    auto it = remembered().find(key);
    if (it != remembered().end()) {
      *why = it->second.why + " (remembered for this shape)";
      if (it->second.kernel.empty()) return -1;
      for (size_t i = 0; i < candidates->size(); ++i) {
        auto const& c = (*candidates)[i];
        if (it->second.kernel == c.kernel->name && it->second.splits == c.splits) return int(i);
      }
    }
  }
  auto model = current_conv_selection_model();
  if (model == nullptr) return -1;
  predict_conv_candidates(*model, p, direction, context.sm_count, candidates);
  ConvCandidate const* choice = learned_conv_choice(*model, direction, *candidates);
  std::ostringstream text;
  Remembered entry;
  int index = -1;
  if (choice == nullptr) {
    auto best = std::min_element(candidates->begin(), candidates->end(),
                                 [](auto const& a, auto const& b) { return a.predicted < b.predicted; });
    text << "learned: the hand rules' plan, none of " << candidates->size()
         << " candidates predicted faster by more than the margin";
    if (best != candidates->end()) {
      text << " (best: " << model->format_prediction(best->predicted) << ")";
    }
  } else {
    index = int(choice - candidates->data());
    entry.kernel = choice->kernel->name;
    entry.splits = choice->splits;
    text << "learned: predicted " << model->format_prediction(choice->predicted)
         << ", the least of " << candidates->size() << " candidates";
  }
  entry.why = text.str();
  *why = entry.why;
  std::lock_guard<std::mutex> lock(remembered_mutex);
  if (remembered().size() >= kMaxRemembered) remembered().clear();
  remembered()[key] = std::move(entry);
  return index;
}

bool apply_learned_conv_plan(std::vector<ckfmha_kernel_entry> const& kernels,
                             ckfmha_conv_problem const& p, ckfmha_conv_direction direction,
                             ConvPlanContext const& context, ConvPlan* plan, std::string* note) {
  std::string why_not;
  if (!conv_learned_applies(direction, context.device_arch, &why_not)) {
    if (!why_not.empty()) *note = " [learned selection not used: " + why_not + "]";
    return false;
  }
  auto candidates = learned_conv_candidates(kernels, p, direction, context);
  if (candidates.empty()) return false;
  std::string why;
  const int index = learned_conv_index(p, direction, context, &candidates, &why);
  if (index < 0) {
    *note = " [" + why + "]";
    return false;
  }
  plan->kernel = *candidates[size_t(index)].kernel;
  plan->splits = direction == CKFMHA_CONV_BWD_WEIGHT ? candidates[size_t(index)].splits : 1;
  plan->why = why;
  return true;
}

std::string format_conv_predictions(ckfmha_conv_problem const& p,
                                    ckfmha_conv_direction direction, int sm_count,
                                    std::vector<ConvCandidate> candidates) {
  auto model = current_conv_selection_model();
  if (model == nullptr) return {};
  predict_conv_candidates(*model, p, direction, sm_count, &candidates);
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](auto const& a, auto const& b) { return a.predicted < b.predicted; });
  std::ostringstream out;
  out << "learned selection (" << candidates.size() << " candidates, margin "
      << model->family(conv_model_family(direction))->margin << "):\n";
  for (auto const& c : candidates) {
    out << "  predicted " << model->format_prediction(c.predicted) << "  "
        << describe_candidate(c, direction) << "\n";
  }
  return out.str();
}

std::vector<ConvCandidate> learned_conv_candidates(
    std::vector<ckfmha_kernel_entry> const& kernels, ckfmha_conv_problem const& p,
    ckfmha_conv_direction direction, ConvPlanContext const& context) {
  auto candidates = conv_candidates(kernels, p, direction, context.device_arch,
                                    context.sm_count, [&](ckfmha_kernel_entry const& k) {
                                      return conv_kernel_fits(k, p, direction, context);
                                    });
  // Without a workspace the weight gradient cannot add partial sums.
  if (!context.can_split) {
    candidates.erase(std::remove_if(candidates.begin(), candidates.end(),
                                    [](auto const& c) { return c.splits > 1; }),
                     candidates.end());
  }
  return candidates;
}

std::string explain_conv_predictions(std::vector<ckfmha_kernel_entry> const& kernels,
                                     ckfmha_conv_problem const& p,
                                     ckfmha_conv_direction direction,
                                     ConvPlanContext const& context) {
  std::string why_not;
  if (!conv_learned_applies(direction, context.device_arch, &why_not)) {
    return why_not.empty() ? std::string() : "learned selection not used: " + why_not + "\n";
  }
  return format_conv_predictions(p, direction, context.sm_count,
                                 learned_conv_candidates(kernels, p, direction, context));
}

}  // namespace ckfmha::runtime
