#include "ckfmha/runtime/appendkv_plan.hpp"

#include "ckfmha/runtime/dispatcher.hpp"
#include "ckfmha/runtime/problem.hpp"

#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>

namespace ckfmha::runtime {

namespace {

// Grid y carries the K/V heads and the rotated query heads, grid z the batch.
constexpr int64_t kMaxGridYZ = 65535;

bool valid_dtype(ckfmha_dtype dtype) {
  return dtype == CKFMHA_DTYPE_FP16 || dtype == CKFMHA_DTYPE_BF16 || dtype == CKFMHA_DTYPE_FP32;
}

using Strides = std::pair<const char*, int64_t const (*)[3]>;

std::vector<Strides> tensor_strides(ckfmha_appendkv_problem const& p) {
  std::vector<Strides> strides = {{"k_new", &p.k_new_stride},
                                  {"v_new", &p.v_new_stride},
                                  {"k_cache", &p.k_cache_stride},
                                  {"v_cache", &p.v_cache_stride}};
  if (p.rotate_q) {
    strides.push_back({"q", &p.q_stride});
    strides.push_back({"q_out", &p.q_out_stride});
  }
  return strides;
}

std::string first_axis(ckfmha_appendkv_problem const& p) {
  return p.paged_kv ? "page" : "batch";
}

std::string cache_label(bool paged) { return paged ? "paged" : "contiguous"; }

}  // namespace

const char* rope_name(ckfmha_rope rope) {
  switch (rope) {
    case CKFMHA_ROPE_NONE: return "none";
    case CKFMHA_ROPE_INTERLEAVED: return "interleaved";
    case CKFMHA_ROPE_HALF_ROTATED: return "half_rotated";
  }
  return "unknown";
}

int64_t appendkv_capacity(ckfmha_appendkv_problem const& p) {
  return p.paged_kv ? int64_t(p.max_pages_per_seq) * p.page_size : int64_t(p.max_seqlen_cache);
}

// fp8 caches: the quantisation kind, the layouts that hold it and the host scales.
std::string check_cache_quant(ckfmha_appendkv_problem const& p) {
  if (std::string why = check_quant_kind("cache_quant", p.cache_quant); !why.empty()) return why;
  if (p.cache_quant == CKFMHA_KV_QUANT_NONE) {
    return p.scale_per_head ? "scale_per_head is set, but the caches are not fp8 (cache_quant "
                              "none): scales apply to fp8 caches only"
                            : "";
  }
  if (p.dtype == CKFMHA_DTYPE_FP32) {
    return "fp8 caches (cache_quant fp8_e4m3) take fp16 or bf16 tokens, not fp32";
  }
  if (p.paged_kv && p.page_layout == CKFMHA_PAGE_LAYOUT_VECTORIZED) {
    return "fp8 caches are written in linear layouts only: vectorized pages group K in chunks "
           "of 8 two-byte channels";
  }
  return check_fp8_scale_values({{"k_scale", p.k_scale}, {"v_scale", p.v_scale}});
}

std::string check_appendkv_problem(ckfmha_appendkv_problem const& p) {
  std::ostringstream msg;
  if (!valid_dtype(p.dtype)) {
    msg << "dtype " << int(p.dtype) << " is not one of fp16 (0), bf16 (1), fp32 (2)";
    return msg.str();
  }
  struct Positive {
    const char* name;
    int32_t value;
  };
  // batch and seqlen_new may be 0: an empty append (see "Empty problems" in ckfmha.h).
  for (auto [name, value] : {Positive{"nhead_k", p.nhead_k}, Positive{"hdim_k", p.hdim_k},
                             Positive{"hdim_v", p.hdim_v}}) {
    if (value < 1) {
      msg << name << " is " << value << "; it must be at least 1";
      return msg.str();
    }
  }
  if (p.batch < 0 || p.seqlen_new < 0) {
    msg << "batch (" << p.batch << ") and seqlen_new (" << p.seqlen_new << ") must be >= 0";
    return msg.str();
  }
  if (p.paged_kv != 0 && p.paged_kv != 1) {
    return "paged_kv must be 0 (contiguous cache) or 1 (pages and a block table)";
  }
  if (p.paged_kv) {
    for (auto [name, value] : {Positive{"page_size", p.page_size},
                               Positive{"num_pages", p.num_pages},
                               Positive{"max_pages_per_seq", p.max_pages_per_seq}}) {
      if (value < 1) {
        msg << "paged cache: " << name << " is " << value << "; it must be at least 1";
        return msg.str();
      }
    }
    if (p.block_table_stride < 0) {
      return "block_table_stride must be a non-negative element count";
    }
    if (std::string why = check_page_layout(p.page_layout, p.dtype); !why.empty()) return why;
  } else if (p.page_layout != CKFMHA_PAGE_LAYOUT_LINEAR) {
    return "page_layout applies to a paged cache (paged_kv = 1); a contiguous cache is "
           "addressed by its strides";
  } else if (p.max_seqlen_cache < 1) {
    msg << "max_seqlen_cache is " << p.max_seqlen_cache
        << "; a contiguous cache holds at least 1 token per sequence";
    return msg.str();
  }
  if (p.rope < CKFMHA_ROPE_NONE || p.rope > CKFMHA_ROPE_HALF_ROTATED) {
    msg << "rope " << int(p.rope)
        << " is not one of none (0), interleaved (1), half_rotated (2)";
    return msg.str();
  }
  if (p.rope != CKFMHA_ROPE_NONE) {
    if (p.rotary_dim < 2 || p.rotary_dim % 2 != 0 || p.rotary_dim > p.hdim_k) {
      msg << "rotary_dim is " << p.rotary_dim << "; it must be even and in 2..hdim_k ("
          << p.hdim_k << ")";
      return msg.str();
    }
    if (p.rope_dtype != CKFMHA_DTYPE_FP32 && p.rope_dtype != p.dtype) {
      msg << "rope_dtype " << int(p.rope_dtype) << ": cos/sin tables are fp32 or "
          << dtype_name(p.dtype) << " (the cache's dtype)";
      return msg.str();
    }
    if (p.rope_max_pos < 1) {
      msg << "rope_max_pos is " << p.rope_max_pos << "; cos/sin need at least one row";
      return msg.str();
    }
    if (p.cos_stride < p.rotary_dim / 2 || p.sin_stride < p.rotary_dim / 2) {
      msg << "cos/sin row strides (" << p.cos_stride << ", " << p.sin_stride
          << ") must hold rotary_dim / 2 = " << p.rotary_dim / 2 << " contiguous entries";
      return msg.str();
    }
  }
  if (std::string why = check_cache_quant(p); !why.empty()) return why;
  if (p.rotate_q != 0 && p.rotate_q != 1) return "rotate_q must be 0 or 1";
  if (p.rotate_q) {
    if (p.rope == CKFMHA_ROPE_NONE) {
      return "rotate_q needs a RoPE mode (interleaved or half_rotated); with rope none q is "
             "left as it is";
    }
    if (p.nhead_q < 1 || p.seqlen_q < 0) {
      msg << "rotate_q: nhead_q (" << p.nhead_q << ") must be at least 1 and seqlen_q ("
          << p.seqlen_q << ") at least 0";
      return msg.str();
    }
  }
  const int64_t heads = int64_t(p.nhead_k) + (p.rotate_q ? p.nhead_q : 0);
  if (p.batch > kMaxGridYZ || heads > kMaxGridYZ) {
    msg << "batch (" << p.batch << ") and nhead_k + rotated nhead_q (" << heads
        << ") must each be at most " << kMaxGridYZ;
    return msg.str();
  }
  for (auto [name, stride] : tensor_strides(p)) {
    for (int i = 0; i < 3; ++i) {
      if ((*stride)[i] < 0) {
        msg << name << " stride " << i << " is " << (*stride)[i]
            << "; strides must be non-negative element counts (the head-dim stride is 1)";
        return msg.str();
      }
    }
  }
  return {};
}

std::string check_appendkv_lengths(ckfmha_appendkv_problem const& p,
                                   int32_t const* cache_seqlens_host) {
  if (cache_seqlens_host == nullptr) return {};
  const int64_t capacity = appendkv_capacity(p);
  const int64_t rotated = p.rotate_q && p.seqlen_q > p.seqlen_new ? p.seqlen_q : p.seqlen_new;
  for (int32_t b = 0; b < p.batch; ++b) {
    const int64_t length = cache_seqlens_host[b];
    std::ostringstream msg;
    if (length < 0) {
      msg << "sequence " << b << ": cache_seqlens is " << length << "; lengths are >= 0";
      return msg.str();
    }
    if (length + p.seqlen_new > capacity) {
      msg << "sequence " << b << ": cache_seqlens " << length << " + seqlen_new "
          << p.seqlen_new << " = " << length + p.seqlen_new << " exceeds the cache capacity of "
          << capacity << " tokens ("
          << (p.paged_kv ? "max_pages_per_seq x page_size" : "max_seqlen_cache") << ")";
      return msg.str();
    }
    if (p.rope != CKFMHA_ROPE_NONE && length + rotated > p.rope_max_pos) {
      msg << "sequence " << b << ": positions up to " << length + rotated - 1
          << " need cos/sin rows, but the tables hold rope_max_pos = " << p.rope_max_pos;
      return msg.str();
    }
  }
  return {};
}

std::string describe(ckfmha_appendkv_problem const& p) {
  std::ostringstream out;
  out << "appendkv " << dtype_name(p.dtype) << " batch=" << p.batch << " nhead_k=" << p.nhead_k
      << " seqlen_new=" << p.seqlen_new << " hdim=" << p.hdim_k << "x" << p.hdim_v << " cache="
      << cache_label(p.paged_kv != 0);
  if (p.paged_kv) {
    out << "(" << (p.page_layout == CKFMHA_PAGE_LAYOUT_VECTORIZED ? "vectorized, " : "")
        << p.num_pages << " pages of " << p.page_size << ", " << p.max_pages_per_seq
        << " per sequence)";
  } else {
    out << "(" << p.max_seqlen_cache << ")";
  }
  out << " rope=" << rope_name(p.rope);
  if (p.rope != CKFMHA_ROPE_NONE) out << "(" << p.rotary_dim << ")";
  if (p.rotate_q) out << " q=" << p.nhead_q << "x" << p.seqlen_q;
  if (p.cache_quant == CKFMHA_KV_QUANT_FP8_E4M3) {
    out << " cache=fp8_e4m3" << (p.scale_per_head ? "(per-head scales)" : "");
  }
  return out.str();
}

std::string reject_reason_appendkv(ckfmha_kernel_entry const& k,
                                   ckfmha_appendkv_problem const& p, int device_arch) {
  std::ostringstream why;
  const int64_t vector = vector_elems(p.dtype);
  if (k.family != CKFMHA_FAMILY_FWD_APPENDKV) {
    why << "family " << family_name(k.family) << ", problem needs fwd_appendkv";
  } else if (!arch_runs_on(k, device_arch)) {
    why << "built for " << k.arch_name << ", which does not run on sm_" << device_arch;
  } else if (k.dtype != p.dtype) {
    why << "dtype " << dtype_name(k.dtype) << ", problem is " << dtype_name(p.dtype);
  } else if (k.hdim_q != p.hdim_k || k.hdim_v != p.hdim_v) {
    why << "head dims " << k.hdim_q << "x" << k.hdim_v << ", problem has " << p.hdim_k << "x"
        << p.hdim_v;
  } else if (k.rope != p.rope) {
    why << "rope " << rope_name(k.rope) << ", problem needs " << rope_name(p.rope);
  } else if (bool(k.paged_kv) != bool(p.paged_kv)) {
    why << "writes a " << cache_label(k.paged_kv) << " cache, problem has a "
        << cache_label(p.paged_kv);
  } else if (k.kv_quant != p.cache_quant) {
    why << (k.kv_quant == CKFMHA_KV_QUANT_NONE ? "writes caches in the tokens' dtype"
                                               : "writes fp8 caches")
        << ", problem has " << (p.cache_quant == CKFMHA_KV_QUANT_NONE ? "caches in its dtype"
                                                                       : "fp8 caches");
  } else if (p.rope == CKFMHA_ROPE_HALF_ROTATED && (p.rotary_dim / 2) % vector != 0) {
    why << "half-rotated RoPE pairs whole 16-byte vectors: rotary_dim / 2 = "
        << p.rotary_dim / 2 << " must be a multiple of " << vector << " " << dtype_name(p.dtype)
        << " elements (rotary_dim a multiple of " << 2 * vector << ")";
  } else {
    static const char* kAxis[3] = {nullptr, "head", "seq"};
    for (auto [name, stride] : tensor_strides(p)) {
      for (int i = 0; i < 3; ++i) {
        // Vectorized pages' V is written by element: its channel stride (the
        // page size when dense) may be anything.
        const bool scalar_v = p.paged_kv && p.page_layout == CKFMHA_PAGE_LAYOUT_VECTORIZED &&
                              stride == &p.v_cache_stride && i == 2;
        if (!scalar_v && (*stride)[i] % vector != 0) {
          bool cache = std::string(name).find("cache") != std::string::npos;
          why << name << " " << (i == 0 ? (cache ? first_axis(p) : "batch") : kAxis[i])
              << " stride " << (*stride)[i] << " is not a multiple of " << vector
              << " elements (16-byte vectors)";
          return why.str();
        }
      }
    }
  }
  return why.str();
}

namespace {

std::string why_none(std::vector<ckfmha_kernel_entry> const& kernels,
                     ckfmha_appendkv_problem const& p, int device_arch) {
  std::ostringstream msg;
  msg << "no compiled fwd_appendkv kernel fits " << describe(p) << " on sm_" << device_arch
      << ". ";
  // A kernel of exactly this signature that still failed says more than the
  // list of what exists (strides, rotary_dim).
  for (auto const& k : kernels) {
    if (k.family == CKFMHA_FAMILY_FWD_APPENDKV && arch_runs_on(k, device_arch) &&
        k.dtype == p.dtype && k.hdim_q == p.hdim_k && k.hdim_v == p.hdim_v && k.rope == p.rope &&
        bool(k.paged_kv) == bool(p.paged_kv)) {
      msg << "Kernel " << k.name << " computes this signature but: "
          << reject_reason_appendkv(k, p, device_arch) << ". ";
      break;
    }
  }
  std::map<std::string, std::set<std::string>> variants;
  for (auto const& k : kernels) {
    if (k.family != CKFMHA_FAMILY_FWD_APPENDKV || !arch_runs_on(k, device_arch)) continue;
    std::ostringstream shape;
    shape << dtype_name(k.dtype) << " d" << k.hdim_q << "x" << k.hdim_v;
    variants[shape.str()].insert(std::string(rope_name(k.rope)) + "/" +
                                 cache_label(k.paged_kv != 0));
  }
  if (variants.empty()) {
    msg << "No fwd_appendkv kernels for sm_" << device_arch
        << " are registered (set CKFMHA_ARCHS at build time, or build them with ckfmha.jit).";
  } else {
    msg << "Available on sm_" << device_arch << " (rope/cache):";
    for (auto const& [shape, kinds] : variants) {
      msg << " " << shape << " {";
      bool first = true;
      for (auto const& kind : kinds) {
        msg << (first ? "" : ", ") << kind;
        first = false;
      }
      msg << "};";
    }
  }
  msg << " ckfmha_appendkv_explain lists each kernel's reason.";
  return msg.str();
}

}  // namespace

AppendKvPlan plan_appendkv(std::vector<ckfmha_kernel_entry> const& kernels,
                           ckfmha_appendkv_problem const& p, int device_arch,
                           ckfmha_kernel_entry const* forced) {
  AppendKvPlan plan;
  if (forced != nullptr) {
    std::string why = reject_reason_appendkv(*forced, p, device_arch);
    if (!why.empty()) {
      plan.why = std::string("kernel ") + forced->name + " cannot run this problem: " + why;
      return plan;
    }
    plan.found = true;
    plan.kernel = *forced;
    plan.why = "kernel forced by name";
    return plan;
  }
  // Preference: SASS for this exact arch, then the smallest token tile that
  // holds all new tokens of a sequence (fewest idle threads for decode), else
  // the largest tile, then generator order.
  const int64_t rows = p.rotate_q && p.seqlen_q > p.seqlen_new ? p.seqlen_q : p.seqlen_new;
  std::tuple<int, int64_t> best{};
  for (auto const& k : kernels) {
    if (k.family != CKFMHA_FAMILY_FWD_APPENDKV ||
        !reject_reason_appendkv(k, p, device_arch).empty()) {
      continue;
    }
    const int64_t tile_fit = k.tile_m >= rows ? -int64_t(k.tile_m) : int64_t(k.tile_m) - (1 << 20);
    std::tuple<int, int64_t> score{k.arch == device_arch, tile_fit};
    if (!plan.found || score > best) {
      plan.found = true;
      plan.kernel = k;
      best = score;
    }
  }
  if (!plan.found) {
    plan.why = why_none(kernels, p, device_arch);
    return plan;
  }
  std::ostringstream why;
  why << (plan.kernel.arch == device_arch ? "SASS for this arch" : "compatible SASS") << ", "
      << plan.kernel.tile_m << " tokens per CTA for " << rows << " rows per sequence";
  plan.why = why.str();
  return plan;
}

std::string explain_appendkv(std::vector<ckfmha_kernel_entry> const& kernels,
                             ckfmha_appendkv_problem const& p, int device_arch) {
  std::ostringstream out;
  out << "problem: " << describe(p) << " on sm_" << device_arch << "\n";
  AppendKvPlan plan = plan_appendkv(kernels, p, device_arch);
  int listed = 0;
  for (auto const& k : kernels) {
    // Other families are explained with the plans that use them.
    if (k.family != CKFMHA_FAMILY_FWD_APPENDKV) continue;
    ++listed;
    std::string why = reject_reason_appendkv(k, p, device_arch);
    if (why.empty()) {
      bool selected = plan.found && std::string(plan.kernel.name) == k.name;
      out << (selected ? "  selected  " : "  fits      ") << k.name << "\n";
    } else {
      out << "  rejected  " << k.name << ": " << why << "\n";
    }
  }
  if (listed == 0) out << "  (no fwd_appendkv kernels are registered)\n";
  out << "plan: ";
  if (plan.found) {
    out << "one stage, " << plan.kernel.name << ": " << plan.why << "\n";
  } else {
    out << "none: " << plan.why << "\n";
  }
  return out.str();
}

}  // namespace ckfmha::runtime
