#include "ckfmha/runtime/fwd_select.hpp"

#include "ckfmha/runtime/dispatcher.hpp"
#include "ckfmha/runtime/problem.hpp"

#include <cstdint>
#include <map>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>
#include <vector>

namespace ckfmha::runtime {

namespace {

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

bool same_shape(ckfmha_kernel_entry const& k, ckfmha_fwd_problem const& p, ckfmha_family family) {
  return k.family == family && k.dtype == p.dtype && k.mode == p.mode && k.hdim_q == p.hdim_q &&
         k.hdim_v == p.hdim_v;
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
  } else if (k.q_quant != p.q_quant) {
    why << (k.q_quant == CKFMHA_KV_QUANT_NONE ? "reads Q in " + std::string(dtype_name(k.dtype))
                                              : "reads fp8 Q (the fp8 forward)")
        << ", problem has " << (p.q_quant == CKFMHA_KV_QUANT_NONE ? "Q in its dtype" : "fp8 Q");
  } else if (k.kv_quant != p.kv_quant) {
    why << (k.kv_quant == CKFMHA_KV_QUANT_NONE ? "reads K/V in " + std::string(dtype_name(k.dtype))
                                               : "reads fp8 K/V")
        << ", problem has " << (p.kv_quant == CKFMHA_KV_QUANT_NONE ? "K/V in its dtype" : "fp8 K/V");
  } else if (k.mode != p.mode) {
    why << "mode " << mode_name(k.mode) << ", problem is " << mode_name(p.mode);
  } else if (k.hdim_q != p.hdim_q || k.hdim_v != p.hdim_v) {
    why << "head dims " << k.hdim_q << "x" << k.hdim_v << ", problem has " << p.hdim_q << "x"
        << p.hdim_v;
  } else if (!mask_fits(k.mask, p.mask)) {
    why << "mask " << mask_kind_name(k.mask) << ", problem needs " << mask_name(p.mask);
  } else if (k.bias != p.bias) {
    why << "bias " << bias_name(k.bias) << ", problem has " << bias_name(p.bias);
  } else if (k.bias_rows_only && p.bias_stride[2] != 0) {
    why << "takes an elementwise bias broadcast over the query rows only ([b, 1 or h, 1, sk]: "
           "three consumer warpgroups hold no bias tile), problem's bias has a row per query";
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
  } else if (auto packed = packed_token_counts_problem(k, p.mode, p.total_q, p.total_k); !packed.empty()) {
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
      // fp8 rows are bytes: 16 of them make a vector.
      const bool fp8_operand = name[0] == 'q' ? p.q_quant != CKFMHA_KV_QUANT_NONE
                               : name[0] == 'o' ? false
                                                : p.kv_quant != CKFMHA_KV_QUANT_NONE;
      const int64_t vector = fp8_operand ? 16 : vector_elems(p.dtype);
      if (auto error = check_vector_strides(name, *stride, vector);
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
  // wasted query rows, then a kernel for row-broadcast biases only (a companion
  // tile, which fits only such biases), then generator order (the tile table
  // lists its default first).
  std::tuple<int, int, int, int, int64_t, int> best_score{};
  for (auto const& k : kernels) {
    if (!same_shape(k, p, CKFMHA_FAMILY_FWD) || !reject_reason(k, p, device_arch).empty()) {
      continue;
    }
    std::tuple<int, int, int, int, int64_t, int> score{
        k.arch == device_arch,  pipeline_rank(k.pipeline),
        k.mask == preferred_mask_kind(p.mask), bool(k.has_lse) == bool(p.store_lse),
        -wasted_query_rows(p.seqlen_q, k.tile_m), k.bias_rows_only != 0};
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

}  // namespace ckfmha::runtime
