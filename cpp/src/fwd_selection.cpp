#include "ckfmha/runtime/fwd_selection.hpp"

#include "ckfmha/runtime/fwd_plan_parts.hpp"
#include "ckfmha/runtime/fwd_select.hpp"
#include "ckfmha/runtime/selection_features.hpp"
#include "ckfmha/runtime/selection_mode.hpp"
#include "ckfmha/runtime/selection_model.hpp"
#include "ckfmha/runtime/split_choice.hpp"
#include "ckfmha/runtime/tuning_table.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <set>
#include <sstream>
#include <utility>

namespace ckfmha::runtime {

namespace {

// Split counts the model rates for each split kernel, beside the hand rules'
// own count: the counts the oracle timed.
constexpr int kModelSplitCounts[] = {1, 2, 4, 8, 16, 32, 64};

struct FwdCandidate {
  ckfmha_kernel_entry kernel{};
  size_t index = 0;    // the kernel's position in the registry's entries
  int num_splits = 0;  // 0: one stage
  double predicted = 0;
};

// Every plan that can run `p` as the model sees them: the fitting one-stage
// kernels, and each fitting split kernel at the model's split counts and the
// hand rules' count (counts above one need the combine kernel and a
// workspace), with its predicted time.
std::vector<FwdCandidate> rated_candidates(std::vector<ckfmha_kernel_entry> const& kernels,
                                           ckfmha_fwd_problem const& p,
                                           PlanContext const& context, CostModel const& model) {
  const int arch = context.device_arch;
  std::vector<FwdCandidate> out;
  for (size_t i = 0; i < kernels.size(); ++i) {
    auto const& k = kernels[i];
    if (same_shape(k, p, CKFMHA_FAMILY_FWD) && reject_reason(k, p, arch).empty()) {
      out.push_back({k, i, 0});
    }
  }
  ckfmha_kernel_entry combine{};
  const bool can_combine =
      context.workspace_available && find_combine(kernels, p, arch, &combine);
  for (size_t i = 0; i < kernels.size(); ++i) {
    auto const& k = kernels[i];
    if (!same_shape(k, p, CKFMHA_FAMILY_FWD_SPLITKV) ||
        !reject_reason(k, p, arch, CKFMHA_FAMILY_FWD_SPLITKV).empty()) {
      continue;
    }
    std::set<int> counts(std::begin(kModelSplitCounts), std::end(kModelSplitCounts));
    counts.insert(heuristic_num_splits(p, k, context));
    for (int n : counts) {
      if (n <= kMaxSplits && (n == 1 || can_combine)) out.push_back({k, i, n});
    }
  }
  const CostShape shape = cost_shape(p);
  std::vector<Features> features;
  features.reserve(out.size());
  for (auto const& c : out) {
    features.push_back(candidate_features(shape, c.kernel, c.num_splits, context.num_sms));
  }
  auto logs = model.predict_logs(features);
  for (size_t i = 0; i < out.size(); ++i) out[i].predicted = std::exp(logs[i]);
  return out;
}

FwdPlan plan_of(std::vector<ckfmha_kernel_entry> const& kernels, ckfmha_fwd_problem const& p,
                int arch, ckfmha_kernel_entry const& kernel, int num_splits, std::string why) {
  if (kernel.family == CKFMHA_FAMILY_FWD) return one_stage(kernel, std::move(why));
  ckfmha_kernel_entry combine{};  // one split writes O itself: no combine stage runs
  if (num_splits > 1 && !find_combine(kernels, p, arch, &combine)) {
    return not_found("no fwd_splitkv_combine kernel fits the selected split plan");
  }
  return split_plan(kernel, combine, p, std::max(num_splits, 1), std::move(why));
}

// The tuning table's plan, when it has one for `p` that still fits; else
// false with *note saying why not.
bool tuned_plan(std::vector<ckfmha_kernel_entry> const& kernels, ckfmha_fwd_problem const& p,
                PlanContext const& context, FwdPlan* plan, std::string* note) {
  TunedPlan tuned;
  if (!tuning_find(tuning_key(p), &tuned)) {
    *note = "the tuning table has no entry for this problem; ";
    return false;
  }
  const int arch = context.device_arch;
  auto it = std::find_if(kernels.begin(), kernels.end(),
                         [&](ckfmha_kernel_entry const& k) { return tuned.kernel == k.name; });
  std::string why;
  if (it == kernels.end()) {
    why = "is not registered";
  } else if (it->family == CKFMHA_FAMILY_FWD) {
    why = reject_reason(*it, p, arch);
  } else if (it->family == CKFMHA_FAMILY_FWD_SPLITKV) {
    why = reject_reason(*it, p, arch, CKFMHA_FAMILY_FWD_SPLITKV);
    if (why.empty() && tuned.num_splits > 1 && !context.workspace_available) {
      why = "needs a workspace, and the call gives none";
    }
  } else {
    why = "is not a forward kernel";
  }
  if (!why.empty()) {
    *note = "the tuning table's kernel " + tuned.kernel + " " + why + "; ";
    return false;
  }
  *plan = plan_of(kernels, p, arch, *it, it->family == CKFMHA_FAMILY_FWD ? 0 : tuned.num_splits,
                  "tuned: the tuning table's plan for this problem (" + format_ms(tuned.ms) +
                      " when timed)");
  return plan->found;
}

bool is_rules_plan(FwdCandidate const& c, FwdPlan const& rules) {
  return std::string(c.kernel.name) == rules.kernel.name &&
         c.num_splits == (rules.split ? rules.num_splits : 0);
}

// What the model decided for a problem: keep the hand rules' plan, or run
// `kernel` with `num_splits`; `why` says so with the predictions.
struct LearnedChoice {
  bool keep_rules = true;
  size_t kernel = 0;  // index into the registry's entries (the key holds their count)
  int num_splits = 0;
  std::string why;
};

LearnedChoice decide(std::vector<ckfmha_kernel_entry> const& kernels, ckfmha_fwd_problem const& p,
                     PlanContext const& context, SelectionModel const& model,
                     FwdPlan const& rules) {
  LearnedChoice choice;
  CostModel const& trees = *model.family(forward_family(&model, p));
  auto candidates = rated_candidates(kernels, p, context, trees);
  if (candidates.empty()) {
    choice.why = "no candidate to rank";
    return choice;
  }
  auto best = std::min_element(candidates.begin(), candidates.end(),
                               [](auto const& a, auto const& b) {
                                 return a.predicted < b.predicted;
                               });
  auto mine = std::find_if(candidates.begin(), candidates.end(),
                           [&](FwdCandidate const& c) { return is_rules_plan(c, rules); });
  if (mine != candidates.end() && best->predicted >= mine->predicted * (1 - trees.margin)) {
    choice.why = "the hand rules' plan is predicted " +
                 model.format_prediction(mine->predicted) +
                 ", within the model's margin of the fastest (" +
                 model.format_prediction(best->predicted) + ")";
    return choice;
  }
  std::ostringstream why;
  why << "predicted " << model.format_prediction(best->predicted) << ", the fastest of "
      << candidates.size() << " candidates";
  if (mine != candidates.end()) {
    why << " (the hand rules' plan: " << model.format_prediction(mine->predicted) << ")";
  }
  choice.keep_rules = false;
  choice.kernel = best->index;
  choice.num_splits = best->num_splits;
  choice.why = why.str();
  return choice;
}

// A shape as the learned choice is remembered: the fields that decide which
// kernels fit and how fast they run, with the batch and lengths in steps of a
// sixteenth of an octave (4.4%) above 16, the context, and the model/table
// generation. Serving loops change the key length every step and the batch
// often; neighbouring shapes get the same plan, and the trees are walked
// again only when a length moves to the next step.
using ShapeKey = std::array<int64_t, 28>;

int64_t length_step(int64_t n) {
  return n < 16 ? n : 16 + int64_t(std::floor(std::log2(double(n)) * 16));
}

ShapeKey shape_key(ckfmha_fwd_problem const& p, PlanContext const& context,
                   size_t kernel_count) {
  return {int64_t(p.dtype),          int64_t(p.mode),         length_step(p.batch),
          p.nhead_q,                 p.nhead_k,               length_step(p.seqlen_q),
          length_step(p.seqlen_k),   p.hdim_q,                p.hdim_v,
          int64_t(p.mask),           p.window_left,           p.window_right,
          int64_t(p.bias),           p.bias_stride[2] == 0,   p.store_lse,
          p.dropout_p > 0.f,         p.store_dropout_randval, p.softcap > 0.f,
          p.has_sink,                p.v_col_major,           context.device_arch,
          context.num_sms,           context.workspace_available,
          int64_t(context.selection_generation), int64_t(kernel_count),
          int64_t(p.kv_storage),
          // Group mode: the token counts (the mean lengths are features).
          length_step(p.mode == CKFMHA_MODE_GROUP ? p.total_q : 0),
          length_step(p.mode == CKFMHA_MODE_GROUP ? p.total_k : 0)};
}

struct Remembered {
  bool valid = false;
  ShapeKey key{};
  LearnedChoice choice;
};

constexpr size_t kRemembered = 32;
thread_local std::array<Remembered, kRemembered> remembered_choices;
thread_local size_t next_remembered = 0;

bool remembered(ShapeKey const& key, LearnedChoice* choice) {
  for (auto const& entry : remembered_choices) {
    if (entry.valid && entry.key == key) {
      *choice = entry.choice;
      return true;
    }
  }
  return false;
}

// Replaces the key's entry, if any (a choice that no longer fit), else the
// oldest.
void remember(ShapeKey const& key, LearnedChoice const& choice) {
  for (auto& entry : remembered_choices) {
    if (entry.valid && entry.key == key) {
      entry.choice = choice;
      return;
    }
  }
  Remembered& slot = remembered_choices[next_remembered];
  next_remembered = (next_remembered + 1) % kRemembered;
  slot = Remembered{true, key, choice};
}

// Whether a choice remembered for a neighbouring shape runs `p` too: its
// kernel may be ruled out by this problem's strides.
bool still_fits(LearnedChoice const& choice, std::vector<ckfmha_kernel_entry> const& kernels,
                ckfmha_fwd_problem const& p, int arch) {
  if (choice.keep_rules) return true;
  if (choice.kernel >= kernels.size()) return false;
  auto const& k = kernels[choice.kernel];
  return reject_reason(k, p, arch, ckfmha_family(k.family)).empty();
}

}  // namespace

FwdPlan plan_fwd_selected(std::vector<ckfmha_kernel_entry> const& kernels,
                          ckfmha_fwd_problem const& p, PlanContext const& context,
                          FwdPlan rules) {
  std::string note;
  if (context.selection == CKFMHA_SELECTION_TUNED) {
    FwdPlan tuned;
    if (tuned_plan(kernels, p, context, &tuned, &note)) return tuned;
  }
  if (!rules.found) return rules;  // nothing fits: the rules' message says what exists
  auto model = current_selection_model();
  std::string gap = model_gap(model.get(), forward_family(model.get(), p), p.mode, p.dtype,
                              context.device_arch);
  if (!gap.empty()) {
    rules.why += std::string(" [") + selection_name(context.selection) + " selection: " + note +
                 gap + "; the hand rules decide]";
    return rules;
  }
  const ShapeKey key = shape_key(p, context, kernels.size());
  LearnedChoice choice;
  const bool known =
      remembered(key, &choice) && still_fits(choice, kernels, p, context.device_arch);
  if (!known) {
    choice = decide(kernels, p, context, *model, rules);
    remember(key, choice);
  }
  const char* reused = known ? " (remembered for this shape)" : "";
  if (choice.keep_rules) {
    rules.why += " [learned: " + note + choice.why + reused + "]";
    return rules;
  }
  return plan_of(kernels, p, context.device_arch, kernels[choice.kernel], choice.num_splits,
                 "learned: " + note + choice.why + reused);
}

std::string explain_fwd_predictions(std::vector<ckfmha_kernel_entry> const& kernels,
                                    ckfmha_fwd_problem const& p, PlanContext const& context) {
  if (context.selection == CKFMHA_SELECTION_HEURISTIC || is_paged(p) ||
      context.forced != nullptr) {
    return {};
  }
  std::ostringstream out;
  out << "selection: " << selection_name(context.selection) << "\n";
  if (p.kv_quant != CKFMHA_KV_QUANT_NONE) {
    out << "  (fp8 K/V, with queries in dtype or fp8, is not in the model's or the tuning table's "
           "data: the rules' plan runs)\n";
    return out.str();
  }
  if (context.selection == CKFMHA_SELECTION_TUNED) {
    TunedPlan tuned;
    if (tuning_find(tuning_key(p), &tuned)) {
      out << "  tuned     " << tuned.kernel << " num_splits=" << tuned.num_splits << " ("
          << format_ms(tuned.ms) << " when timed)\n";
    } else {
      out << "  tuned     (no entry for this problem)\n";
    }
  }
  auto model = current_selection_model();
  const char* family = forward_family(model.get(), p);
  auto gap = model_gap(model.get(), family, p.mode, p.dtype, context.device_arch);
  if (!gap.empty()) {
    out << "  model     " << gap << "\n";
    return out.str();
  }
  out << "  model     " << model->describe() << "\n";
  out << "  trees     " << family << "\n";
  auto candidates = rated_candidates(kernels, p, context, *model->family(family));
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](auto const& a, auto const& b) { return a.predicted < b.predicted; });
  for (auto const& c : candidates) {
    out << "  predicted " << model->format_prediction(c.predicted) << "  " << c.kernel.name;
    if (c.num_splits > 0) out << " num_splits=" << c.num_splits;
    out << "\n";
  }
  return out.str();
}

}  // namespace ckfmha::runtime
