#include "ckfmha/runtime/bwd_plan.hpp"

#include "ckfmha/runtime/dispatcher.hpp"
#include "ckfmha/runtime/problem.hpp"

#include <cstdint>
#include <set>
#include <sstream>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace ckfmha::runtime {

namespace {

bool is_bwd_family(ckfmha_family family) {
  return family == CKFMHA_FAMILY_BWD_DOT_DO_O || family == CKFMHA_FAMILY_BWD_DQ_DK_DV ||
         family == CKFMHA_FAMILY_BWD_CONVERT_DQ;
}

bool wants_dropout(ckfmha_bwd_problem const& p) { return p.dropout_p > 0.f; }

// The tensors each stage reads or writes with 16-byte vectors.
std::string check_stage_strides(ckfmha_family family, ckfmha_bwd_problem const& p) {
  using Stride = std::pair<const char*, int64_t const(*)[3]>;
  std::vector<Stride> tensors;
  switch (family) {
    case CKFMHA_FAMILY_BWD_DOT_DO_O: tensors = {{"o", &p.o_stride}, {"do", &p.do_stride}}; break;
    case CKFMHA_FAMILY_BWD_CONVERT_DQ: tensors = {{"dq", &p.dq_stride}}; break;
    default:
      tensors = {{"q", &p.q_stride},   {"k", &p.k_stride},   {"v", &p.v_stride},
                 {"do", &p.do_stride}, {"dk", &p.dk_stride}, {"dv", &p.dv_stride}};
  }
  for (auto [name, stride] : tensors) {
    if (auto error = check_vector_strides(name, *stride, vector_elems(p.dtype)); !error.empty()) {
      return error;
    }
  }
  return {};
}

// The sm90 main stage has no per-CTA dQ slices: it only adds with atomics.
bool deterministic_main_stage(ckfmha_kernel_entry const& k) {
  return std::string_view(k.pipeline ? k.pipeline : "") != "sm90_tma_wgmma";
}

const char* stage_head_dim_name(ckfmha_family family) {
  return family == CKFMHA_FAMILY_BWD_DOT_DO_O ? "hdim_v" : "hdim_q";
}

}  // namespace

std::string reject_reason_bwd(ckfmha_kernel_entry const& k, ckfmha_bwd_problem const& p,
                              int device_arch) {
  std::ostringstream why;
  bool rowwise = k.family == CKFMHA_FAMILY_BWD_DOT_DO_O || k.family == CKFMHA_FAMILY_BWD_CONVERT_DQ;
  int rowwise_hdim = k.family == CKFMHA_FAMILY_BWD_DOT_DO_O ? p.hdim_v : p.hdim_q;
  if (!is_bwd_family(k.family)) {
    why << "family " << family_name(k.family) << ", problem needs a backward stage";
  } else if (!arch_runs_on(k, device_arch)) {
    why << "built for " << k.arch_name << ", which does not run on " << arch_label(device_arch);
  } else if (k.dtype != p.dtype) {
    why << "dtype " << dtype_name(k.dtype) << ", problem is " << dtype_name(p.dtype);
  } else if (k.mode != p.mode) {
    why << "mode " << mode_name(k.mode) << ", problem is " << mode_name(p.mode);
  } else if (rowwise && k.hdim_q != rowwise_hdim) {
    why << "head dim " << k.hdim_q << ", problem has " << stage_head_dim_name(k.family) << " "
        << rowwise_hdim;
  } else if (rowwise) {
    return check_stage_strides(k.family, p);
  } else if (k.hdim_q != p.hdim_q || k.hdim_v != p.hdim_v) {
    why << "head dims " << k.hdim_q << "x" << k.hdim_v << ", problem has " << p.hdim_q << "x"
        << p.hdim_v;
  } else if (!mask_fits(k.mask, p.mask)) {
    why << "mask " << mask_kind_name(k.mask) << ", problem needs " << mask_name(p.mask);
  } else if (k.bias != p.bias) {
    why << "bias " << bias_name(k.bias) << ", problem has " << bias_name(p.bias);
  } else if (k.bias_rows_only && p.bias_stride[2] != 0) {
    why << "takes an elementwise bias broadcast over the query rows only ([b, 1 or h, 1, sk]: "
           "one value a key), problem's bias has a row per query";
  } else if (bool(k.has_dropout) != wants_dropout(p)) {
    why << (k.has_dropout ? "applies dropout, problem has none" : "no dropout, problem has p > 0");
  } else if (bool(k.has_softcap) != (p.softcap > 0.f)) {
    why << (k.has_softcap ? "soft-caps logits, problem has softcap 0"
                          : "no logit soft-cap, problem has softcap > 0");
  } else if (bool(k.has_dbias) != bool(p.store_dbias)) {
    why << (k.has_dbias ? "writes dbias, problem does not ask for it"
                        : "does not write dbias, problem asks for it");
  } else if (auto packed = packed_token_counts_problem(k, p.mode, p.total_q, p.total_k);
             !packed.empty()) {
    why << packed;
  } else if (p.deterministic && !deterministic_main_stage(k)) {
    why << k.pipeline << " adds dQ with fp32 atomics (fast mode only); deterministic mode "
        << "runs on sm80_cpasync_mma";
  } else {
    return check_stage_strides(k.family, p);
  }
  return why.str();
}

namespace {

// Preference among fitting kernels of one stage: SASS for this exact arch,
// then the faster pipeline, then the narrowest mask kind, then table order.
std::tuple<int, int, int> bwd_score(ckfmha_kernel_entry const& k, ckfmha_bwd_problem const& p,
                                    int device_arch) {
  return {k.arch == device_arch, pipeline_rank(k.pipeline),
          k.family != CKFMHA_FAMILY_BWD_DQ_DK_DV || k.mask == preferred_mask_kind(p.mask)};
}

bool pick_stage(std::vector<ckfmha_kernel_entry> const& kernels, ckfmha_family family,
                ckfmha_bwd_problem const& p, int device_arch, ckfmha_kernel_entry* out) {
  bool found = false;
  std::tuple<int, int, int> best{};
  for (auto const& k : kernels) {
    if (k.family != family || !reject_reason_bwd(k, p, device_arch).empty()) continue;
    auto score = bwd_score(k, p, device_arch);
    if (!found || score > best) {
      found = true;
      *out = k;
      best = score;
    }
  }
  return found;
}

std::string why_no_stage(std::vector<ckfmha_kernel_entry> const& kernels, ckfmha_family family,
                         ckfmha_bwd_problem const& p, int device_arch) {
  std::ostringstream msg;
  msg << "no compiled " << family_name(family) << " kernel fits " << describe(p) << " on "
      << arch_label(device_arch) << ". ";
  std::set<std::string> available;
  for (auto const& k : kernels) {
    if (k.family != family || !arch_runs_on(k, device_arch)) continue;
    std::ostringstream item;
    item << dtype_name(k.dtype) << " " << mode_name(k.mode) << " d" << k.hdim_q;
    if (family == CKFMHA_FAMILY_BWD_DQ_DK_DV) {
      item << "x" << k.hdim_v << " " << mask_kind_name(k.mask);
    }
    available.insert(item.str());
  }
  if (available.empty()) {
    msg << "No " << family_name(family) << " kernels for " << arch_label(device_arch)
        << " are registered (set CKFMHA_ARCHS at build time, or build them with ckfmha.jit).";
  } else {
    msg << "Available on " << arch_label(device_arch) << ":";
    bool first = true;
    for (auto const& item : available) {
      msg << (first ? " " : ", ") << item;
      first = false;
    }
    msg << ".";
  }
  msg << " ckfmha_bwd_explain lists each kernel's reason.";
  return msg.str();
}

}  // namespace

BwdPlan select_bwd(std::vector<ckfmha_kernel_entry> const& kernels, ckfmha_bwd_problem const& p,
                   int device_arch, ckfmha_kernel_entry const* forced,
                   BwdSelection const& selection) {
  BwdPlan plan;
  if (forced != nullptr) {
    plan.dq_dk_dv = *forced;
  } else if (!pick_stage(kernels, CKFMHA_FAMILY_BWD_DQ_DK_DV, p, device_arch, &plan.dq_dk_dv)) {
    plan.why_none = why_no_stage(kernels, CKFMHA_FAMILY_BWD_DQ_DK_DV, p, device_arch);
    return plan;
  } else if (selection.mode != CKFMHA_SELECTION_HEURISTIC) {
    plan.dq_dk_dv =
        select_main_stage(kernels, p, device_arch, selection, plan.dq_dk_dv, &plan.why);
  }
  if (!pick_stage(kernels, CKFMHA_FAMILY_BWD_DOT_DO_O, p, device_arch, &plan.dot_do_o)) {
    plan.why_none = why_no_stage(kernels, CKFMHA_FAMILY_BWD_DOT_DO_O, p, device_arch);
    return plan;
  }
  if (!pick_stage(kernels, CKFMHA_FAMILY_BWD_CONVERT_DQ, p, device_arch, &plan.convert_dq)) {
    plan.why_none = why_no_stage(kernels, CKFMHA_FAMILY_BWD_CONVERT_DQ, p, device_arch);
    return plan;
  }
  plan.found = true;
  return plan;
}

std::string explain_bwd(std::vector<ckfmha_kernel_entry> const& kernels,
                        ckfmha_bwd_problem const& p, int device_arch,
                        BwdSelection const& selection) {
  std::ostringstream out;
  out << "problem: " << describe(p) << " on " << arch_label(device_arch) << "\n";
  BwdPlan plan = select_bwd(kernels, p, device_arch, nullptr, selection);
  struct Stage {
    ckfmha_family family;
    ckfmha_kernel_entry const* chosen;
  };
  for (auto [family, chosen] : {Stage{CKFMHA_FAMILY_BWD_DOT_DO_O, &plan.dot_do_o},
                                Stage{CKFMHA_FAMILY_BWD_DQ_DK_DV, &plan.dq_dk_dv},
                                Stage{CKFMHA_FAMILY_BWD_CONVERT_DQ, &plan.convert_dq}}) {
    out << "stage " << family_name(family) << ":\n";
    int listed = 0;
    for (auto const& k : kernels) {
      if (k.family != family) continue;
      ++listed;
      std::string why = reject_reason_bwd(k, p, device_arch);
      if (why.empty()) {
        bool selected = plan.found && std::string(chosen->name) == k.name;
        out << (selected ? "  selected  " : "  fits      ") << k.name << "\n";
      } else {
        out << "  rejected  " << k.name << ": " << why << "\n";
      }
    }
    if (listed == 0) out << "  (no kernels of this family are registered)\n";
    if (family == CKFMHA_FAMILY_BWD_DOT_DO_O && p.has_sink) {
      out << "  + dsink: a second kernel of this stage reduces it from D and the LSE, one CTA "
             "per query head\n";
    }
  }
  out << explain_bwd_predictions(kernels, p, device_arch, selection);
  if (!plan.why.empty()) out << "main stage: " << plan.why << "\n";
  if (!plan.found) out << "no plan: " << plan.why_none << "\n";
  return out.str();
}

}  // namespace ckfmha::runtime
