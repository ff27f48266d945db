#include "ckfmha/runtime/dispatcher.hpp"

#include "ckfmha/runtime/problem.hpp"

#include <cstdint>
#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace ckfmha::runtime {

namespace {

// Every kernel moves 16-byte vectors: each row, head and batch start must
// sit on a multiple of 16 bytes, i.e. 8 fp16/bf16 or 4 fp32 elements.
constexpr int64_t kVectorBytes = 16;

int64_t vector_elems(ckfmha_dtype dtype) { return kVectorBytes / element_bytes(dtype); }

std::string arch_label(int arch) { return "sm_" + std::to_string(arch); }

std::string check_vector_strides(const char* tensor, int64_t const (&stride)[3],
                                 int64_t vector) {
  static const char* kAxis[3] = {"batch", "head", "seq"};
  for (int i = 0; i < 3; ++i) {
    if (stride[i] % vector != 0) {
      std::ostringstream msg;
      msg << tensor << " " << kAxis[i] << " stride " << stride[i] << " is not a multiple of "
          << vector << " elements (16-byte vector loads)";
      return msg.str();
    }
  }
  return {};
}

bool is_window(ckfmha_mask mask) {
  return mask == CKFMHA_MASK_WINDOW_TOP_LEFT || mask == CKFMHA_MASK_WINDOW_BOTTOM_RIGHT;
}

bool is_causal(ckfmha_mask mask) {
  return mask == CKFMHA_MASK_CAUSAL_TOP_LEFT || mask == CKFMHA_MASK_CAUSAL_BOTTOM_RIGHT;
}

// A window kernel computes any mask with bounds (causal is left -1, right 0);
// a causal kernel only causal ones; a no-mask kernel only unmasked problems.
bool mask_fits(ckfmha_mask_kind kind, ckfmha_mask mask) {
  switch (kind) {
    case CKFMHA_MASK_KIND_NONE: return mask == CKFMHA_MASK_NONE;
    case CKFMHA_MASK_KIND_CAUSAL: return is_causal(mask);
    case CKFMHA_MASK_KIND_WINDOW: return mask != CKFMHA_MASK_NONE;
  }
  return false;
}

ckfmha_mask_kind preferred_mask_kind(ckfmha_mask mask) {
  if (mask == CKFMHA_MASK_NONE) return CKFMHA_MASK_KIND_NONE;
  return is_window(mask) ? CKFMHA_MASK_KIND_WINDOW : CKFMHA_MASK_KIND_CAUSAL;
}

// Higher is faster where both fit; an unknown pipeline ranks lowest.
int pipeline_rank(const char* pipeline) {
  std::string_view name = pipeline ? pipeline : "";
  if (name == "sm90_tma_wgmma") return 2;
  if (name == "sm80_cpasync_mma") return 1;
  return 0;
}

// Kernels whose TMA descriptors span the packed tokens of a group-mode
// problem: they need the token counts, within 32-bit TMA coordinates.
std::string packed_token_counts_problem(ckfmha_kernel_entry const& k,
                                        ckfmha_fwd_problem const& p) {
  std::string_view name = k.pipeline ? k.pipeline : "";
  if (p.mode != CKFMHA_MODE_GROUP || name != "sm90_tma_wgmma") return {};
  constexpr int64_t kMaxTmaRows = INT32_MAX;
  if (p.total_q <= 0 || p.total_k <= 0) {
    return "group mode on sm90_tma_wgmma needs total_q and total_k (its TMA descriptors "
           "span the packed tokens); the problem leaves them 0";
  }
  if (p.total_q > kMaxTmaRows || p.total_k > kMaxTmaRows) {
    return "total_q/total_k exceed 2^31 - 1, the TMA descriptors' coordinate range";
  }
  return {};
}

bool wants_dropout(ckfmha_fwd_problem const& p) {
  return p.dropout_p > 0.f || p.store_dropout_randval;
}

// Paged kernels read K/V through page tables, the others contiguous tensors.
std::string kv_storage_mismatch(ckfmha_kernel_entry const& k, ckfmha_fwd_problem const& p) {
  const bool paged_kernel = is_paged_family(k.family);
  if (paged_kernel != is_paged(p)) {
    return paged_kernel ? "reads a paged K/V cache, problem has contiguous K/V"
                        : "reads contiguous K/V, problem has a paged K/V cache (fwd_pagedkv and "
                          "batch_prefill kernels read pages)";
  }
  if (paged_kernel && k.page_layout != p.page_layout) {
    return std::string("reads ") + page_layout_name(k.page_layout) + " pages, problem has " +
           page_layout_name(p.page_layout) + " pages";
  }
  return {};
}

}  // namespace

bool is_paged(ckfmha_fwd_problem const& p) { return p.kv_storage != CKFMHA_KV_CONTIGUOUS; }

bool is_paged_family(ckfmha_family family) {
  return family == CKFMHA_FAMILY_FWD_PAGEDKV || family == CKFMHA_FAMILY_BATCH_PREFILL;
}

ckfmha_family paged_family(ckfmha_fwd_problem const& p) {
  return p.mode == CKFMHA_MODE_GROUP ? CKFMHA_FAMILY_BATCH_PREFILL : CKFMHA_FAMILY_FWD_PAGEDKV;
}

bool arch_runs_on(ckfmha_kernel_entry const& kernel, int device_arch) {
  // Arch-specific ("a") targets run only on their exact arch; plain SASS runs
  // on later minor versions of the same major.
  std::string_view name = kernel.arch_name ? kernel.arch_name : "";
  if (!name.empty() && name.back() == 'a') return kernel.arch == device_arch;
  return kernel.arch / 10 == device_arch / 10 && kernel.arch <= device_arch;
}

bool same_shape(ckfmha_kernel_entry const& k, ckfmha_fwd_problem const& p, ckfmha_family family) {
  return k.family == family && k.dtype == p.dtype && k.mode == p.mode && k.hdim_q == p.hdim_q &&
         k.hdim_v == p.hdim_v;
}

bool mask_kind_preferred(ckfmha_mask_kind kind, ckfmha_mask mask) {
  return kind == preferred_mask_kind(mask);
}

std::string reject_reason(ckfmha_kernel_entry const& k, ckfmha_fwd_problem const& p,
                          int device_arch, ckfmha_family family) {
  std::ostringstream why;
  if (k.family != family) {
    why << "family " << family_name(k.family) << ", problem needs " << family_name(family);
  } else if (!arch_runs_on(k, device_arch)) {
    why << "built for " << k.arch_name << ", which does not run on " << arch_label(device_arch);
  } else if (auto storage = kv_storage_mismatch(k, p); !storage.empty()) {
    why << storage;
  } else if (k.dtype != p.dtype) {
    why << "dtype " << dtype_name(k.dtype) << ", problem is " << dtype_name(p.dtype);
  } else if (k.mode != p.mode) {
    why << "mode " << mode_name(k.mode) << ", problem is " << mode_name(p.mode);
  } else if (k.hdim_q != p.hdim_q || k.hdim_v != p.hdim_v) {
    why << "head dims " << k.hdim_q << "x" << k.hdim_v << ", problem has " << p.hdim_q << "x"
        << p.hdim_v;
  } else if (!mask_fits(k.mask, p.mask)) {
    why << "mask " << mask_kind_name(k.mask) << ", problem needs " << mask_name(p.mask);
  } else if (k.bias != p.bias) {
    why << "bias " << bias_name(k.bias) << ", problem has " << bias_name(p.bias);
  } else if (p.store_lse && !k.has_lse) {
    why << "does not write LSE, problem asks for it";
  } else if (bool(k.has_dropout) != wants_dropout(p)) {
    why << (k.has_dropout ? "applies dropout, problem has none" : "no dropout, problem has p > 0");
  } else if (bool(k.has_softcap) != (p.softcap > 0.f)) {
    why << (k.has_softcap ? "soft-caps logits, problem has softcap 0"
                          : "no logit soft-cap, problem has softcap > 0");
  } else if (bool(k.has_sink) != bool(p.has_sink)) {
    why << (k.has_sink ? "adds a sink, problem has none" : "no sink, problem has one");
  } else if (bool(k.v_col_major) != bool(p.v_col_major)) {
    why << (k.v_col_major ? "reads V column-major, problem has V row-major"
                          : "reads V row-major (head dim contiguous), problem has V column-major");
  } else if (auto packed = packed_token_counts_problem(k, p); !packed.empty()) {
    why << packed;
  } else {
    for (auto [name, stride] : {std::pair<const char*, int64_t const(*)[3]>{"q", &p.q_stride},
                                {"k", &p.k_stride},
                                {"v", &p.v_stride},
                                {"o", &p.o_stride}}) {
      // Column-major V kernels check per CTA whether its keys can move as
      // 16-byte vectors and otherwise load them element by element, so any
      // seqlen_k, stride and sequence offset works.
      if (p.v_col_major && stride == &p.v_stride) continue;
      // Vectorized pages under 8 keys: V is read key by key (a vector of 8
      // keys would cross pages), and its channel stride is the page size.
      if (is_paged(p) && p.page_layout == CKFMHA_PAGE_LAYOUT_VECTORIZED && p.page_size < 8 &&
          stride == &p.v_stride) {
        continue;
      }
      if (auto error = check_vector_strides(name, *stride, vector_elems(p.dtype));
          !error.empty()) {
        return error;
      }
    }
  }
  return why.str();
}

// Query rows a tile of `tile_m` rows computes past seqlen_q, counted only where
// they are more than an eighth of the rows it computes: below that the tile
// table's order decides, so a larger default tile (the 192-row Hopper d64
// tile, 3% padding at 2048 rows) is not passed over for a smaller one that
// pads nothing; above it (short sequences) the tile that pads least wins.
namespace {
int64_t wasted_query_rows(int64_t seqlen_q, int tile_m) {
  const int64_t computed = (seqlen_q + tile_m - 1) / tile_m * tile_m;
  const int64_t padded = computed - seqlen_q;
  return padded * 8 > computed ? padded : 0;
}
}  // namespace

Selection select_fwd(std::vector<ckfmha_kernel_entry> const& kernels,
                     ckfmha_fwd_problem const& p, int device_arch) {
  Selection best;
  // Preference among fitting kernels: SASS built for this exact arch, then the
  // faster pipeline (Hopper's TMA + wgmma over mma.sync), then the narrowest
  // mask kind (causal over window), then an exact LSE match, then the fewest
  // wasted query rows, then generator order (the tile table lists its default first).
  std::tuple<int, int, int, int, int64_t> best_score{};
  for (auto const& k : kernels) {
    if (!same_shape(k, p, CKFMHA_FAMILY_FWD) || !reject_reason(k, p, device_arch).empty()) {
      continue;
    }
    std::tuple<int, int, int, int, int64_t> score{
        k.arch == device_arch, pipeline_rank(k.pipeline), k.mask == preferred_mask_kind(p.mask),
        bool(k.has_lse) == bool(p.store_lse), -wasted_query_rows(p.seqlen_q, k.tile_m)};
    if (!best.found || score > best_score) {
      best.found = true;
      best.kernel = k;
      best_score = score;
    }
  }
  if (best.found) return best;

  // Summarise what exists for this device so the message says what is supported.
  std::map<std::string, std::set<std::pair<int, int>>> head_dims_by_dtype;
  for (auto const& k : kernels) {
    if (k.family != CKFMHA_FAMILY_FWD || !arch_runs_on(k, device_arch)) continue;
    head_dims_by_dtype[dtype_name(k.dtype)].insert({k.hdim_q, k.hdim_v});
  }
  std::ostringstream msg;
  msg << "no compiled forward kernel fits " << describe(p) << " on " << arch_label(device_arch)
      << ". ";
  // A kernel computing exactly this signature that still failed (strides,
  // LSE) says more than the list of what exists.
  for (auto const& k : kernels) {
    bool same_signature = k.family == CKFMHA_FAMILY_FWD && arch_runs_on(k, device_arch) &&
                          k.dtype == p.dtype && k.mode == p.mode && k.hdim_q == p.hdim_q &&
                          k.hdim_v == p.hdim_v && mask_fits(k.mask, p.mask) && k.bias == p.bias;
    if (same_signature) {
      msg << "Kernel " << k.name << " computes this signature but: "
          << reject_reason(k, p, device_arch) << ". ";
      break;
    }
  }
  if (head_dims_by_dtype.empty()) {
    msg << "No forward kernels for " << arch_label(device_arch)
        << " are registered (set CKFMHA_ARCHS at build time, or build them with ckfmha.jit).";
  } else {
    msg << "Available on " << arch_label(device_arch) << ":";
    for (auto const& [dtype, dims] : head_dims_by_dtype) {
      msg << " " << dtype << " head dims {";
      bool first = true;
      for (auto const& [hdim_q, hdim_v] : dims) {
        msg << (first ? "" : ", ") << hdim_q << "x" << hdim_v;
        first = false;
      }
      msg << "};";
    }
    msg << " masks, bias, dropout, soft-cap, sink, group mode and V layouts"
           " as listed by ckfmha_registry_json.";
  }
  msg << " ckfmha_fwd_explain lists each kernel's reason.";
  best.why_none = msg.str();
  return best;
}

std::string explain_fwd(std::vector<ckfmha_kernel_entry> const& kernels,
                        ckfmha_fwd_problem const& p, int device_arch) {
  std::ostringstream out;
  out << "problem: " << describe(p) << " on " << arch_label(device_arch) << "\n";
  Selection chosen = select_fwd(kernels, p, device_arch);
  for (auto const& k : kernels) {
    // Other families are explained with the plans that use them.
    if (k.family != CKFMHA_FAMILY_FWD) continue;
    std::string why = reject_reason(k, p, device_arch);
    if (why.empty()) {
      bool selected = chosen.found && std::string(chosen.kernel.name) == k.name;
      out << (selected ? "  selected  " : "  fits      ") << k.name << "\n";
    } else {
      out << "  rejected  " << k.name << ": " << why << "\n";
    }
  }
  if (!chosen.found) out << "no kernel fits: " << chosen.why_none << "\n";
  return out.str();
}

// ---- backward

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
  } else if (bool(k.has_dropout) != wants_dropout(p)) {
    why << (k.has_dropout ? "applies dropout, problem has none" : "no dropout, problem has p > 0");
  } else if (bool(k.has_softcap) != (p.softcap > 0.f)) {
    why << (k.has_softcap ? "soft-caps logits, problem has softcap 0"
                          : "no logit soft-cap, problem has softcap > 0");
  } else if (bool(k.has_dbias) != bool(p.store_dbias)) {
    why << (k.has_dbias ? "writes dbias, problem does not ask for it"
                        : "does not write dbias, problem asks for it");
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
                   int device_arch, ckfmha_kernel_entry const* forced) {
  BwdPlan plan;
  if (forced != nullptr) {
    plan.dq_dk_dv = *forced;
  } else if (!pick_stage(kernels, CKFMHA_FAMILY_BWD_DQ_DK_DV, p, device_arch, &plan.dq_dk_dv)) {
    plan.why_none = why_no_stage(kernels, CKFMHA_FAMILY_BWD_DQ_DK_DV, p, device_arch);
    return plan;
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
                        ckfmha_bwd_problem const& p, int device_arch) {
  std::ostringstream out;
  out << "problem: " << describe(p) << " on " << arch_label(device_arch) << "\n";
  BwdPlan plan = select_bwd(kernels, p, device_arch);
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
  }
  if (!plan.found) out << "no plan: " << plan.why_none << "\n";
  return out.str();
}

}  // namespace ckfmha::runtime
