// The backward main stage chosen by the tuning table or the learned cost
// model; the row-wise stages follow the main stage as under the hand rules.
#include "ckfmha/runtime/bwd_plan.hpp"
#include "ckfmha/runtime/selection_features.hpp"
#include "ckfmha/runtime/selection_mode.hpp"
#include "ckfmha/runtime/selection_model.hpp"
#include "ckfmha/runtime/tuning_table.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <utility>

namespace ckfmha::runtime {

namespace {

struct Rated {
  ckfmha_kernel_entry kernel{};
  double predicted = 0;
};


std::vector<Rated> rated_main_stages(std::vector<ckfmha_kernel_entry> const& kernels,
                                     ckfmha_bwd_problem const& p, int arch, int num_sms,
                                     CostModel const& model) {
  std::vector<Rated> out;
  std::vector<Features> features;
  const CostShape shape = cost_shape(p);
  for (auto const& k : kernels) {
    if (k.family != CKFMHA_FAMILY_BWD_DQ_DK_DV || !reject_reason_bwd(k, p, arch).empty()) continue;
    out.push_back({k, 0});
    features.push_back(candidate_features(shape, k, 0, num_sms));
  }
  auto logs = model.predict_logs(features);
  for (size_t i = 0; i < out.size(); ++i) out[i].predicted = std::exp(logs[i]);
  return out;
}

}  // namespace

namespace {

ckfmha_kernel_entry choose_main_stage(std::vector<ckfmha_kernel_entry> const& kernels,
                                      ckfmha_bwd_problem const& p, int arch,
                                      BwdSelection const& selection,
                                      ckfmha_kernel_entry const& rules_choice, std::string* why) {
  std::string note;
  if (selection.mode == CKFMHA_SELECTION_TUNED) {
    TunedPlan tuned;
    if (!tuning_find(tuning_key(p), &tuned)) {
      note = "the tuning table has no entry for this problem; ";
    } else {
      auto it = std::find_if(kernels.begin(), kernels.end(), [&](ckfmha_kernel_entry const& k) {
        return tuned.kernel == k.name && k.family == CKFMHA_FAMILY_BWD_DQ_DK_DV;
      });
      std::string reason = it == kernels.end() ? std::string("is not a registered main stage")
                                               : reject_reason_bwd(*it, p, arch);
      if (reason.empty()) {
        *why = "tuned: the tuning table's main stage for this problem (" + format_ms(tuned.ms) +
               " when timed)";
        return *it;
      }
      note = "the tuning table's kernel " + tuned.kernel + " " + reason + "; ";
    }
  }
  auto model = current_selection_model();
  if (auto gap = model_gap(model.get(), "bwd", p.mode, p.dtype, arch); !gap.empty()) {
    *why = std::string(selection_name(selection.mode)) + " selection: " + note + gap +
           "; the hand rules decide";
    return rules_choice;
  }
  auto rated = rated_main_stages(kernels, p, arch, selection.num_sms, model->bwd);
  auto best = std::min_element(rated.begin(), rated.end(), [](auto const& a, auto const& b) {
    return a.predicted < b.predicted;
  });
  auto mine = std::find_if(rated.begin(), rated.end(), [&](Rated const& r) {
    return std::string(r.kernel.name) == rules_choice.name;
  });
  if (best == rated.end()) return rules_choice;
  if (mine != rated.end() && best->predicted >= mine->predicted * (1 - model->bwd.margin)) {
    *why = "learned: " + note + "the hand rules' main stage is predicted " +
           model->format_prediction(mine->predicted) +
           ", within the model's margin of the fastest (" +
           model->format_prediction(best->predicted) + ")";
    return rules_choice;
  }
  *why = "learned: " + note + "predicted " + model->format_prediction(best->predicted) +
         ", the fastest of " + std::to_string(rated.size()) + " main stages";
  return best->kernel;
}

// The backward has no plan cache: a training loop asks for the same shapes
// every step, so the last few choices are remembered per thread (keyed by the
// whole problem, the context and the model/table generation) and the trees
// are walked once per shape.
struct RememberedChoice {
  bool valid = false;
  ckfmha_bwd_problem problem{};
  int arch = 0;
  BwdSelection selection;
  uint64_t generation = 0;
  size_t kernel_count = 0;
  std::string rules_choice;
  ckfmha_kernel_entry chosen{};
  std::string why;
};

constexpr size_t kRememberedChoices = 8;

}  // namespace

ckfmha_kernel_entry select_main_stage(std::vector<ckfmha_kernel_entry> const& kernels,
                                      ckfmha_bwd_problem const& p, int arch,
                                      BwdSelection const& selection,
                                      ckfmha_kernel_entry const& rules_choice, std::string* why) {
  thread_local std::array<RememberedChoice, kRememberedChoices> memo;
  thread_local size_t next_slot = 0;
  const uint64_t generation = selection_generation();
  for (auto const& entry : memo) {
    // Byte comparison: a difference in padding can only cause a miss.
    if (entry.valid && entry.arch == arch && entry.selection.mode == selection.mode &&
        entry.selection.num_sms == selection.num_sms && entry.generation == generation &&
        entry.kernel_count == kernels.size() && entry.rules_choice == rules_choice.name &&
        std::memcmp(&entry.problem, &p, sizeof(p)) == 0) {
      *why = entry.why;
      return entry.chosen;
    }
  }
  RememberedChoice& slot = memo[next_slot];
  next_slot = (next_slot + 1) % kRememberedChoices;
  slot.chosen = choose_main_stage(kernels, p, arch, selection, rules_choice, &slot.why);
  std::memcpy(&slot.problem, &p, sizeof(p));
  slot.arch = arch;
  slot.selection = selection;
  slot.generation = generation;
  slot.kernel_count = kernels.size();
  slot.rules_choice = rules_choice.name;
  slot.valid = true;
  *why = slot.why;
  return slot.chosen;
}

std::string explain_bwd_predictions(std::vector<ckfmha_kernel_entry> const& kernels,
                                    ckfmha_bwd_problem const& p, int arch,
                                    BwdSelection const& selection) {
  if (selection.mode == CKFMHA_SELECTION_HEURISTIC) return {};
  std::ostringstream out;
  out << "selection: " << selection_name(selection.mode) << "\n";
  auto model = current_selection_model();
  if (auto gap = model_gap(model.get(), "bwd", p.mode, p.dtype, arch); !gap.empty()) {
    out << "  model     " << gap << "\n";
    return out.str();
  }
  out << "  model     " << model->describe() << "\n";
  auto rated = rated_main_stages(kernels, p, arch, selection.num_sms, model->bwd);
  std::stable_sort(rated.begin(), rated.end(),
                   [](auto const& a, auto const& b) { return a.predicted < b.predicted; });
  for (auto const& r : rated) {
    out << "  predicted " << model->format_prediction(r.predicted) << "  " << r.kernel.name << "\n";
  }
  return out.str();
}

}  // namespace ckfmha::runtime
