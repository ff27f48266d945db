#include "ckfmha/runtime/fwd_plan.hpp"
#include "ckfmha/runtime/fwd_plan_parts.hpp"
#include "ckfmha/runtime/fwd_selection.hpp"

#include "ckfmha/kernel/params/splitkv_workspace.h"
#include "ckfmha/runtime/dispatcher.hpp"
#include "ckfmha/runtime/fwd_select.hpp"
#include "ckfmha/runtime/problem.hpp"
#include "ckfmha/runtime/split_choice.hpp"

#include <algorithm>
#include <cstdint>
#include <sstream>

namespace ckfmha::runtime {

namespace {

// Decode-shaped: one K/V head's packed query rows (heads sharing it times the
// query positions) fit one 64-row tile, so the split-KV kernel reads each K/V
// tile once per group where one-stage kernels read it once per query head
// into mostly padded 128-row tiles.
constexpr int64_t kDecodePackedRows = 64;

std::string combine_reject_reason(ckfmha_kernel_entry const& k, ckfmha_fwd_problem const& p,
                                  int device_arch) {
  std::ostringstream why;
  if (k.family != CKFMHA_FAMILY_FWD_SPLITKV_COMBINE) {
    why << "family " << family_name(k.family) << ", the stage needs fwd_splitkv_combine";
  } else if (!arch_runs_on(k, device_arch)) {
    why << "built for " << k.arch_name << ", which does not run on sm_" << device_arch;
  } else if (k.dtype != p.dtype) {
    why << "dtype " << dtype_name(k.dtype) << ", problem is " << dtype_name(p.dtype);
  } else if (k.mode != p.mode) {
    why << "mode " << mode_name(k.mode) << ", problem is " << mode_name(p.mode);
  } else if (k.hdim_v != p.hdim_v) {
    why << "hdim_v " << k.hdim_v << ", problem has " << p.hdim_v;
  }
  return why.str();
}

// Why no split-KV plan exists: the first reasons of the split kernels of this
// dtype, or that none is registered.
std::string why_no_split(std::vector<ckfmha_kernel_entry> const& kernels,
                         ckfmha_fwd_problem const& p, int device_arch, bool have_split) {
  std::ostringstream why;
  if (have_split) {
    why << "no fwd_splitkv_combine kernel fits (" << dtype_name(p.dtype) << " "
        << mode_name(p.mode) << " hdim_v=" << p.hdim_v << ")";
    return why.str();
  }
  why << "no fwd_splitkv kernel fits";
  // Kernels of the problem's dtype, mode and head dims first: their reasons
  // name the feature that is missing.
  int shown = 0;
  for (bool same_shape : {true, false}) {
    for (auto const& k : kernels) {
      if (k.family != CKFMHA_FAMILY_FWD_SPLITKV || !arch_runs_on(k, device_arch)) continue;
      bool matches = k.dtype == p.dtype && k.mode == p.mode && k.hdim_q == p.hdim_q &&
                     k.hdim_v == p.hdim_v;
      if (matches != same_shape || shown == 3) continue;
      why << (shown++ == 0 ? ": " : "; ") << k.name << ": "
          << reject_reason(k, p, device_arch, CKFMHA_FAMILY_FWD_SPLITKV);
    }
  }
  if (shown == 0) {
    why << ": none is registered for sm_" << device_arch
        << " (split-KV covers fp16/bf16, head dims 64 and 128, masks, soft-cap, LSE, GQA and "
           "group mode)";
  }
  return why.str();
}

// Why no paged plan exists: the first reasons of the kernels of the
// problem's paged family, or that none is registered.
std::string why_no_paged(std::vector<ckfmha_kernel_entry> const& kernels,
                         ckfmha_fwd_problem const& p, int device_arch) {
  const ckfmha_family family = paged_family(p);
  std::ostringstream why;
  why << "no " << family_name(family) << " kernel fits";
  int shown = 0;
  for (auto const& k : kernels) {
    if (k.family != family || !arch_runs_on(k, device_arch) || shown == 3) continue;
    why << (shown++ == 0 ? ": " : "; ") << k.name << ": "
        << reject_reason(k, p, device_arch, family);
  }
  if (shown == 0) {
    why << ": none is registered for sm_" << device_arch
        << " (paged K/V covers fp16/bf16, head dims 64 and 128, masks, soft-cap, LSE and GQA; "
           "fwd_pagedkv serves batch mode, batch_prefill group mode)";
  }
  return why.str();
}

// A paged K/V problem: always a split-KV plan of its paged family, whose
// combine stage is the one contiguous split plans use (num_splits=1 is one
// key split, not a one-stage plan: no one-stage kernel reads pages).
FwdPlan plan_paged(std::vector<ckfmha_kernel_entry> const& kernels, ckfmha_fwd_problem const& p,
                   PlanContext const& context) {
  const int arch = context.device_arch;
  const ckfmha_family family = paged_family(p);
  ckfmha_kernel_entry split{};
  std::string why;
  if (context.forced != nullptr) {
    split = *context.forced;
    std::string reason = reject_reason(split, p, arch, family);
    if (!reason.empty()) {
      return not_found("kernel " + std::string(split.name) + " cannot run this problem: " + reason);
    }
    why = "paged kernel forced by name";
  } else if (!find_split_kernel(kernels, p, context, &split, family)) {
    return not_found(why_no_paged(kernels, p, arch));
  } else {
    why = std::string("paged K/V cache (") +
          (p.kv_storage == CKFMHA_KV_PAGED_TABLE ? "block table" : "kv_indptr") +
          ", page_size " + std::to_string(p.page_size) + ") runs " + family_name(family);
  }
  ckfmha_kernel_entry combine{};
  if (!find_combine(kernels, p, arch, &combine)) {
    return not_found("no fwd_splitkv_combine kernel fits (" + std::string(dtype_name(p.dtype)) +
                     " " + mode_name(p.mode) + " hdim_v=" + std::to_string(p.hdim_v) +
                     ") for the paged plan");
  }
  const int splits =
      p.num_splits > 0 ? p.num_splits : heuristic_num_splits(p, split, context);
  return split_plan(split, combine, p, splits,
                    why + ", num_splits=" + std::to_string(splits) +
                        (p.num_splits > 0 ? " as asked" : " by the wave model"));
}

// Problems only split-KV kernels serve (fp8 K/V): the split count asked
// for, else the wave model's, else one split when no workspace is given.
FwdPlan plan_split_only(std::vector<ckfmha_kernel_entry> const& kernels,
                        ckfmha_fwd_problem const& p, PlanContext const& context) {
  const int arch = context.device_arch;
  // The generator builds fp8 kernels for sm_89 and later only (rules/common.py).
  constexpr int kFp8MinArch = 89;
  if (arch < kFp8MinArch) {
    return not_found("fp8 K/V needs sm_" + std::to_string(kFp8MinArch) +
                     " or later (the kernels widen e4m3 with its conversion instructions); "
                     "this is sm_" + std::to_string(arch));
  }
  ckfmha_kernel_entry split{}, combine{};
  const bool have_split = find_split_kernel(kernels, p, context, &split);
  if (!have_split || !find_combine(kernels, p, arch, &combine)) {
    return not_found(why_no_split(kernels, p, arch, have_split) +
                     " (fp8 K/V runs on split-KV kernels only)");
  }
  const char* quant = kv_quant_name(p.kv_quant);
  if (p.num_splits > 0) {
    return split_plan(split, combine, p, p.num_splits,
                      std::string(quant) + " K/V, num_splits=" + std::to_string(p.num_splits) +
                          " as asked");
  }
  const int splits = heuristic_num_splits(p, split, context);
  if (splits > 1 && !context.workspace_available) {
    return split_plan(split, combine, p, 1,
                      std::string(quant) + " K/V, one split: no workspace given (the wave "
                      "model's " + std::to_string(splits) +
                          " splits need ckfmha_fwd_workspace_size bytes)");
  }
  return split_plan(split, combine, p, splits,
                    std::string(quant) + " K/V runs split-KV kernels; num_splits=" +
                        std::to_string(splits) + " by the wave model (" +
                        resident_ctas_text(split, context) + ")");
}

// fp8 queries (with fp8 K/V): the one-stage Hopper fp8 forward, the only
// kernels that read them; no split-KV plan (its body reads queries in dtype).
FwdPlan plan_fp8_queries(std::vector<ckfmha_kernel_entry> const& kernels,
                         ckfmha_fwd_problem const& p, PlanContext const& context) {
  // The generator builds the fp8 forward for sm_90a only (rules/common.py).
  constexpr int kFp8QueryMinArch = 90;
  if (context.device_arch < kFp8QueryMinArch) {
    return not_found("fp8 queries need sm_90a: the e4m3 products run on wgmma; this is " +
                     arch_label(context.device_arch));
  }
  if (p.num_splits > 1) {
    return not_found("num_splits=" + std::to_string(p.num_splits) +
                     " asks for a split-KV plan, but fp8 queries run the one-stage forward "
                     "only (the split-KV body reads queries in dtype); set num_splits to 0 or 1");
  }
  Selection one = select_fwd(kernels, p, context.device_arch);
  if (!one.found) return not_found(one.why_none);
  return one_stage(one.kernel, "fp8 queries (Q, K and V in e4m3) run the one-stage Hopper "
                               "forward");
}

FwdPlan plan_forced(std::vector<ckfmha_kernel_entry> const& kernels, ckfmha_fwd_problem const& p,
                    PlanContext const& context) {
  ckfmha_kernel_entry const& k = *context.forced;
  const std::string name = k.name;
  if (k.family == CKFMHA_FAMILY_FWD) {
    if (p.num_splits > 1) {
      return not_found("kernel " + name + " is a one-stage fwd kernel, but num_splits=" +
                       std::to_string(p.num_splits) +
                       " asks for a split-KV plan; force a fwd_splitkv kernel or set num_splits "
                       "to 0 or 1");
    }
    std::string why = reject_reason(k, p, context.device_arch);
    if (!why.empty()) return not_found("kernel " + name + " cannot run this problem: " + why);
    return one_stage(k, "kernel forced by name");
  }
  if (k.family != CKFMHA_FAMILY_FWD_SPLITKV) {
    return not_found("kernel " + name + " is a " + family_name(k.family) +
                     " kernel; force a fwd or fwd_splitkv kernel");
  }
  std::string why = reject_reason(k, p, context.device_arch, CKFMHA_FAMILY_FWD_SPLITKV);
  if (!why.empty()) return not_found("kernel " + name + " cannot run this problem: " + why);
  ckfmha_kernel_entry combine{};
  if (!find_combine(kernels, p, context.device_arch, &combine)) {
    return not_found(why_no_split(kernels, p, context.device_arch, true));
  }
  int splits = p.num_splits > 0
                   ? p.num_splits
                   : heuristic_num_splits(p, k, context);
  return split_plan(k, combine, p, splits,
                    "split kernel forced by name, num_splits=" + std::to_string(splits) +
                        (p.num_splits > 0 ? " as asked" : " by the heuristic"));
}

}  // namespace

bool find_combine(std::vector<ckfmha_kernel_entry> const& kernels, ckfmha_fwd_problem const& p,
                  int device_arch, ckfmha_kernel_entry* out) {
  bool found = false;
  for (auto const& k : kernels) {
    if (k.family != CKFMHA_FAMILY_FWD_SPLITKV_COMBINE || k.hdim_v != p.hdim_v ||
        !combine_reject_reason(k, p, device_arch).empty()) {
      continue;
    }
    if (!found || (k.arch == device_arch && out->arch != device_arch)) *out = k;
    found = true;
  }
  return found;
}

FwdPlan one_stage(ckfmha_kernel_entry const& kernel, std::string why) {
  FwdPlan plan;
  plan.found = true;
  plan.kernel = kernel;
  plan.why = std::move(why);
  return plan;
}

FwdPlan not_found(std::string why) {
  FwdPlan plan;
  plan.why = std::move(why);
  return plan;
}

FwdPlan split_plan(ckfmha_kernel_entry const& split, ckfmha_kernel_entry const& combine,
                   ckfmha_fwd_problem const& p, int num_splits, std::string why) {
  const int64_t m_blocks = ceil_div(packed_rows(p), split.tile_m);
  if (m_blocks * num_splits > INT32_MAX) {
    std::ostringstream msg;
    msg << "a split-KV grid of " << m_blocks << " query tiles x " << num_splits
        << " splits exceeds 2^31 - 1 CTAs; ask for fewer splits";
    return not_found(msg.str());
  }
  FwdPlan plan;
  plan.found = true;
  plan.split = true;
  plan.kernel = split;
  plan.combine = combine;
  plan.num_splits = num_splits;
  plan.workspace_bytes = size_t(kernel::splitkv_workspace(p, num_splits).bytes);
  plan.why = std::move(why);
  return plan;
}

int reference_sm_count(int arch) {
  switch (arch) {
    case 86: return 84;    // RTX A6000 class
    case 89: return 128;   // RTX 4090 class
    case 90: return 132;   // H100 SXM
    default: return 108;   // A100
  }
}

FwdPlan plan_fwd(std::vector<ckfmha_kernel_entry> const& kernels, ckfmha_fwd_problem const& p,
                 PlanContext const& context) {
  if (is_paged(p)) return plan_paged(kernels, p, context);
  if (context.forced != nullptr) return plan_forced(kernels, p, context);
  FwdPlan rules = plan_fwd_rules(kernels, p, context);
  // A split count the caller fixed is theirs to keep. fp8 K/V (fp8 queries
  // come only with it) is not in the model's data: its plans follow the rules.
  if (context.selection == CKFMHA_SELECTION_HEURISTIC || p.num_splits != 0 ||
      p.kv_quant != CKFMHA_KV_QUANT_NONE) {
    return rules;
  }
  return plan_fwd_selected(kernels, p, context, std::move(rules));
}

FwdPlan plan_fwd_rules(std::vector<ckfmha_kernel_entry> const& kernels,
                       ckfmha_fwd_problem const& p, PlanContext const& context) {
  const int arch = context.device_arch;
  if (p.q_quant != CKFMHA_KV_QUANT_NONE) return plan_fp8_queries(kernels, p, context);
  // With queries in dtype no one-stage kernel reads fp8 K/V: its plans are
  // split-KV plans, one split (no combine, no workspace) where the caller or
  // the workspace says one stage.
  if (p.kv_quant != CKFMHA_KV_QUANT_NONE) return plan_split_only(kernels, p, context);
  Selection one = select_fwd(kernels, p, arch);
  if (p.num_splits == 1) {
    if (!one.found) return not_found(one.why_none);
    return one_stage(one.kernel, "num_splits=1 asks for one stage");
  }
  ckfmha_kernel_entry split{}, combine{};
  const bool have_split = find_split_kernel(kernels, p, context, &split);
  const bool have_combine = have_split && find_combine(kernels, p, arch, &combine);
  if (p.num_splits > 1) {
    if (!have_combine) {
      return not_found("num_splits=" + std::to_string(p.num_splits) +
                       " asks for a split-KV plan, but " +
                       why_no_split(kernels, p, arch, have_split));
    }
    return split_plan(split, combine, p, p.num_splits,
                      "num_splits=" + std::to_string(p.num_splits) + " as asked");
  }

  std::string stay;  // why an automatic plan stays one-stage
  const int splits =
      have_combine ? heuristic_num_splits(p, split, context) : 0;
  if (!have_combine) {
    stay = why_no_split(kernels, p, arch, have_split);
  } else if (!context.workspace_available && splits > 1) {
    stay = "no workspace given (a split-KV plan of " + std::to_string(splits) +
           " splits needs ckfmha_fwd_workspace_size bytes)";
  } else {
    const bool decode = packed_rows(p) <= kDecodePackedRows;
    const int64_t one_stage_ctas =
        one.found ? ceil_div(p.seqlen_q, one.kernel.tile_m) * p.nhead_q * p.batch : 0;
    const bool underfilled = splits > 1 && one_stage_ctas < context.num_sms;
    std::ostringstream why;
    if (decode || underfilled || !one.found) {
      if (decode) {
        why << "decode-shaped: " << packed_rows(p) << " packed query rows per K/V head (<= "
            << kDecodePackedRows << ") share one tile and one read of K/V";
      } else if (underfilled) {
        why << "the one-stage grid of " << one_stage_ctas << " CTAs leaves SMs of "
            << context.num_sms << " idle";
      } else {
        why << "no one-stage kernel fits";
      }
      why << "; num_splits=" << splits << " by the wave model ("
          << resident_ctas_text(split, context) << ", >= "
          << kMinKeyTilesPerSplit << " key tiles per split, <= " << kAutoMaxSplits << ")";
      return split_plan(split, combine, p, splits, why.str());
    }
    why << "the one-stage grid of " << one_stage_ctas << " CTAs fills " << context.num_sms
        << " SMs and " << packed_rows(p) << " packed rows per K/V head are not decode-shaped";
    stay = why.str();
  }
  if (!one.found) return not_found(one.why_none + " Split-KV: " + stay + ".");
  return one_stage(one.kernel, stay);
}

std::string explain_fwd_plan(std::vector<ckfmha_kernel_entry> const& kernels,
                             ckfmha_fwd_problem const& p, PlanContext const& context) {
  std::ostringstream out;
  if (is_paged(p)) {
    // No one-stage kernel reads pages: list the split-KV families only.
    out << "problem: " << describe(p) << " on sm_" << context.device_arch << "\n";
  } else {
    out << explain_fwd(kernels, p, context.device_arch);
  }
  FwdPlan plan = plan_fwd(kernels, p, context);
  for (auto const& k : kernels) {
    std::string why;
    if (is_paged_family(k.family)) {
      why = reject_reason(k, p, context.device_arch, is_paged(p) ? paged_family(p) : k.family);
    } else if (k.family == CKFMHA_FAMILY_FWD_SPLITKV) {
      why = reject_reason(k, p, context.device_arch, CKFMHA_FAMILY_FWD_SPLITKV);
    } else if (k.family == CKFMHA_FAMILY_FWD_SPLITKV_COMBINE) {
      why = combine_reject_reason(k, p, context.device_arch);
    } else {
      continue;
    }
    bool selected = plan.found && plan.split &&
                    (std::string(plan.kernel.name) == k.name ||
                     (plan.combined() && std::string(plan.combine.name) == k.name));
    if (why.empty()) {
      out << (selected ? "  selected  " : "  fits      ") << k.name << "\n";
    } else {
      out << "  rejected  " << k.name << ": " << why << "\n";
    }
  }
  out << explain_fwd_predictions(kernels, p, context);
  out << "plan: ";
  if (!plan.found) {
    out << "none: " << plan.why << "\n";
  } else if (plan.split && !plan.combined()) {
    out << "split-KV, " << plan.kernel.name << ", num_splits=1: one split writes O directly "
        << "(no combine, no workspace; " << context.num_sms << " SMs): " << plan.why << "\n";
  } else if (plan.split) {
    out << "split-KV, " << plan.kernel.name << " then " << plan.combine.name
        << ", num_splits=" << plan.num_splits << ", workspace " << plan.workspace_bytes
        << " bytes (" << context.num_sms << " SMs): " << plan.why << "\n";
  } else {
    out << "one-stage, " << plan.kernel.name << ": " << plan.why << "\n";
  }
  return out.str();
}

}  // namespace ckfmha::runtime
