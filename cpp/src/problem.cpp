#include "ckfmha/runtime/problem.hpp"

#include "ckfmha/runtime/dispatcher.hpp"
#include "ckfmha/runtime/fwd_plan.hpp"

#include <cmath>
#include <limits>
#include <sstream>
#include <utility>

namespace ckfmha::runtime {

const char* dtype_name(ckfmha_dtype dtype) {
  switch (dtype) {
    case CKFMHA_DTYPE_FP16: return "fp16";
    case CKFMHA_DTYPE_BF16: return "bf16";
    case CKFMHA_DTYPE_FP32: return "fp32";
  }
  return "unknown";
}

int element_bytes(ckfmha_dtype dtype) { return dtype == CKFMHA_DTYPE_FP32 ? 4 : 2; }

const char* mask_name(ckfmha_mask mask) {
  switch (mask) {
    case CKFMHA_MASK_NONE: return "none";
    case CKFMHA_MASK_CAUSAL_TOP_LEFT: return "causal_top_left";
    case CKFMHA_MASK_CAUSAL_BOTTOM_RIGHT: return "causal_bottom_right";
    case CKFMHA_MASK_WINDOW_TOP_LEFT: return "window_top_left";
    case CKFMHA_MASK_WINDOW_BOTTOM_RIGHT: return "window_bottom_right";
  }
  return "unknown";
}

const char* mask_kind_name(ckfmha_mask_kind kind) {
  switch (kind) {
    case CKFMHA_MASK_KIND_NONE: return "none";
    case CKFMHA_MASK_KIND_CAUSAL: return "causal";
    case CKFMHA_MASK_KIND_WINDOW: return "window";
  }
  return "unknown";
}

const char* bias_name(ckfmha_bias bias) {
  switch (bias) {
    case CKFMHA_BIAS_NONE: return "none";
    case CKFMHA_BIAS_ELEMENTWISE: return "elementwise";
    case CKFMHA_BIAS_ALIBI: return "alibi";
  }
  return "unknown";
}

const char* mode_name(ckfmha_mode mode) {
  switch (mode) {
    case CKFMHA_MODE_BATCH: return "batch";
    case CKFMHA_MODE_GROUP: return "group";
  }
  return "unknown";
}

const char* page_layout_name(ckfmha_page_layout layout) {
  switch (layout) {
    case CKFMHA_PAGE_LAYOUT_LINEAR: return "linear";
    case CKFMHA_PAGE_LAYOUT_VECTORIZED: return "vectorized";
  }
  return "unknown";
}

const char* kv_quant_name(ckfmha_kv_quant quant) {
  switch (quant) {
    case CKFMHA_KV_QUANT_NONE: return "none";
    case CKFMHA_KV_QUANT_FP8_E4M3: return "fp8_e4m3";
  }
  return "unknown";
}

const char* family_name(ckfmha_family family) {
  switch (family) {
    case CKFMHA_FAMILY_FWD: return "fwd";
    case CKFMHA_FAMILY_FWD_SPLITKV: return "fwd_splitkv";
    case CKFMHA_FAMILY_FWD_SPLITKV_COMBINE: return "fwd_splitkv_combine";
    case CKFMHA_FAMILY_FWD_PAGEDKV: return "fwd_pagedkv";
    case CKFMHA_FAMILY_FWD_APPENDKV: return "fwd_appendkv";
    case CKFMHA_FAMILY_BATCH_PREFILL: return "batch_prefill";
    case CKFMHA_FAMILY_BWD_DOT_DO_O: return "bwd_dot_do_o";
    case CKFMHA_FAMILY_BWD_DQ_DK_DV: return "bwd_dq_dk_dv";
    case CKFMHA_FAMILY_BWD_CONVERT_DQ: return "bwd_convert_dq";
    case CKFMHA_FAMILY_CONV_FWD: return "conv_fwd";
    case CKFMHA_FAMILY_CONV_BWD_WEIGHT: return "conv_bwd_weight";
  }
  return "unknown";
}

std::string check_page_layout(ckfmha_page_layout layout, ckfmha_dtype dtype) {
  if (layout != CKFMHA_PAGE_LAYOUT_LINEAR && layout != CKFMHA_PAGE_LAYOUT_VECTORIZED) {
    return "page_layout " + std::to_string(int(layout)) +
           " is not one of linear (0), vectorized (1)";
  }
  if (layout == CKFMHA_PAGE_LAYOUT_VECTORIZED && dtype == CKFMHA_DTYPE_FP32) {
    return "page_layout vectorized is for fp16/bf16 caches (K in chunks of 8 channels, one "
           "16-byte vector per key); store an fp32 cache linear";
  }
  return {};
}

namespace {

// Grid y and z carry heads and batch.
constexpr int32_t kMaxGridYZ = 65535;

std::string check_strides(const char* tensor, int64_t const (&stride)[3]) {
  static const char* kAxis[3] = {"batch", "head", "seq"};
  for (int i = 0; i < 3; ++i) {
    if (stride[i] < 0) {
      std::ostringstream msg;
      msg << tensor << " " << kAxis[i] << " stride is " << stride[i]
          << "; strides must be non-negative element counts (the head-dim stride is 1)";
      return msg.str();
    }
  }
  return {};
}

// The page-table fields of a paged problem; contiguous problems ignore them.
std::string check_paged_kv(ckfmha_fwd_problem const& p) {
  std::ostringstream msg;
  if (p.kv_storage < CKFMHA_KV_CONTIGUOUS || p.kv_storage > CKFMHA_KV_PAGED_INDPTR) {
    msg << "kv_storage " << int(p.kv_storage)
        << " is not one of contiguous (0), paged_table (1), paged_indptr (2)";
    return msg.str();
  }
  if (p.kv_storage == CKFMHA_KV_CONTIGUOUS) return {};
  if (std::string why = check_page_layout(p.page_layout, p.dtype); !why.empty()) return why;
  if (p.page_size < 1 || (p.page_size & (p.page_size - 1)) != 0) {
    msg << "page_size is " << p.page_size
        << "; paged K/V takes a power of two >= 1 (tokens per page: 1, 16, 64, ...)";
    return msg.str();
  }
  if (p.kv_storage == CKFMHA_KV_PAGED_TABLE &&
      (p.max_pages_per_seq < 1 || p.block_table_stride < p.max_pages_per_seq)) {
    msg << "block table of " << p.max_pages_per_seq << " pages per sequence with row stride "
        << p.block_table_stride
        << ": max_pages_per_seq must be >= 1 and block_table_stride >= max_pages_per_seq";
    return msg.str();
  }
  if (p.num_pages < 1) {
    msg << "num_pages is " << p.num_pages
        << "; a paged problem names the number of pages in its caches (>= 1), against which "
           "kernels check every page id";
    return msg.str();
  }
  if (p.kv_storage == CKFMHA_KV_PAGED_INDPTR && p.num_kv_indices < 0) {
    msg << "num_kv_indices is " << p.num_kv_indices
        << "; kv_storage paged_indptr needs the entry count of kv_indices (>= 0)";
    return msg.str();
  }
  if (p.v_col_major) {
    return "v_col_major does not apply to a paged K/V cache: page_layout says how pages hold "
           "their keys (linear, or vectorized for V's keys contiguous per channel)";
  }
  return {};
}

}  // namespace

std::string check_fp8_scale_values(std::initializer_list<NamedScale> scales) {
  for (NamedScale const& scale : scales) {
    if (!(scale.value > 0.f) || !std::isfinite(scale.value)) {
      std::ostringstream msg;
      msg << scale.name << " is " << scale.value
          << "; an fp8 tensor stands for scale * code, so a scale must be positive and finite "
             "(it is used where args give no device scales)";
      return msg.str();
    }
  }
  return {};
}

std::string check_quant_kind(const char* field, ckfmha_kv_quant quant) {
  if (quant == CKFMHA_KV_QUANT_NONE || quant == CKFMHA_KV_QUANT_FP8_E4M3) return {};
  return std::string(field) + " " + std::to_string(int(quant)) +
         " is not one of none (0), fp8_e4m3 (1)";
}

namespace {

// fp8 K/V: the quantisation kind and the host scales. Device scales are
// checked where the arguments are (capi_fwd.cpp).
std::string check_kv_quant(ckfmha_fwd_problem const& p) {
  if (std::string why = check_quant_kind("kv_quant", p.kv_quant); !why.empty()) return why;
  if (p.kv_quant == CKFMHA_KV_QUANT_NONE) {
    if (p.kv_scale_per_head) {
      return "kv_scale_per_head is set, but K/V are not quantised (kv_quant none): scales "
             "apply to fp8 K/V only";
    }
    return {};
  }
  if (p.dtype == CKFMHA_DTYPE_FP32) {
    return "fp8 K/V (kv_quant fp8_e4m3) takes fp16 or bf16 queries and outputs, not fp32: "
           "the e4m3 values are widened to the query dtype for the tensor-core products";
  }
  if (p.page_layout == CKFMHA_PAGE_LAYOUT_VECTORIZED && p.kv_storage != CKFMHA_KV_CONTIGUOUS) {
    return "fp8 K/V is read from linear pages only: vectorized pages group K in 16-byte "
           "chunks of 8 two-byte channels";
  }
  if (p.v_col_major) {
    return "fp8 K/V takes V row-major (head dim contiguous) only";
  }
  return check_fp8_scale_values({{"k_scale", p.k_scale}, {"v_scale", p.v_scale}});
}

// The features of the problem the Hopper fp8 forward does not compute, by name.
std::string features_beside_fp8_queries(ckfmha_fwd_problem const& p) {
  std::string named;
  for (auto [name, on] : {std::pair<const char*, bool>{"bias", p.bias == CKFMHA_BIAS_ELEMENTWISE},
                          {"ALiBi", p.bias == CKFMHA_BIAS_ALIBI},
                          {"dropout", p.dropout_p > 0.f || p.store_dropout_randval},
                          {"soft-cap", p.softcap > 0.f},
                          {"sink", bool(p.has_sink)}}) {
    if (on) named += (named.empty() ? "" : ", ") + std::string(name);
  }
  return named;
}

// fp8 queries: the quantisation kind, what the Hopper fp8 forward (its only
// kernels) reads and the host scale. Device scales are checked where the
// arguments are (capi_fwd.cpp).
std::string check_q_quant(ckfmha_fwd_problem const& p) {
  if (std::string why = check_quant_kind("q_quant", p.q_quant); !why.empty()) return why;
  if (p.q_quant == CKFMHA_KV_QUANT_NONE) return {};
  if (p.kv_quant != p.q_quant) {
    return "fp8 queries (q_quant fp8_e4m3) need fp8 K/V (kv_quant fp8_e4m3): both products, "
           "Q K^T and P V, run in e4m3 on the tensor cores";
  }
  if (p.kv_storage != CKFMHA_KV_CONTIGUOUS) {
    return "fp8 queries take contiguous K/V only: the Hopper fp8 forward loads K/V tiles with "
           "TMA; a paged fp8 cache is read by the split-KV kernels, with queries in dtype";
  }
  if (std::string features = features_beside_fp8_queries(p); !features.empty()) {
    return "fp8 queries run the Hopper fp8 forward, which computes masks, LSE and GQA only; "
           "this problem has " + features;
  }
  if (p.hdim_q != p.hdim_v) {
    std::ostringstream msg;
    msg << "fp8 queries need hdim_q == hdim_v (the Hopper fp8 forward's 64, 128 or 256); this "
           "problem has "
        << p.hdim_q << "x" << p.hdim_v;
    return msg.str();
  }
  // One e4m3 element is one byte, so 16 elements make the 16 bytes TMA strides step in.
  constexpr int64_t kTmaStrideElems = 16;
  for (auto [name, stride] : {std::pair<const char*, int64_t const(*)[3]>{"q", &p.q_stride},
                              {"k", &p.k_stride},
                              {"v", &p.v_stride}}) {
    if (auto error = check_vector_strides(name, *stride, kTmaStrideElems); !error.empty()) {
      return "fp8 queries: " + error + "; TMA reads q, k and v with 16-byte strides";
    }
  }
  return check_fp8_scale_values({{"q_scale", p.q_scale}});
}

// Per-block scales: a mode of the fp8 forward's scales. The arrays
// themselves are checked where the arguments are (capi_fwd.cpp).
std::string check_fp8_block_scales(ckfmha_fwd_problem const& p) {
  if (p.fp8_block_scales != 0 && p.fp8_block_scales != 1) {
    return "fp8_block_scales " + std::to_string(p.fp8_block_scales) + " is not 0 or 1";
  }
  if (!p.fp8_block_scales) return {};
  if (p.q_quant != CKFMHA_KV_QUANT_FP8_E4M3) {
    return "per-block scales (fp8_block_scales) need fp8 queries (q_quant fp8_e4m3): the "
           "split-KV kernels that read fp8 K/V with queries in dtype take per-tensor or "
           "per-head scales";
  }
  if (p.kv_scale_per_head) {
    return "per-block scales exclude kv_scale_per_head: block scales are already per head";
  }
  return {};
}

}  // namespace

std::string check_fwd_problem(ckfmha_fwd_problem const& p) {
  std::ostringstream msg;
  if (p.dtype != CKFMHA_DTYPE_FP16 && p.dtype != CKFMHA_DTYPE_BF16 && p.dtype != CKFMHA_DTYPE_FP32) {
    msg << "dtype " << int(p.dtype) << " is not one of fp16 (0), bf16 (1), fp32 (2)";
    return msg.str();
  }
  if (p.mode != CKFMHA_MODE_BATCH && p.mode != CKFMHA_MODE_GROUP) {
    msg << "mode " << int(p.mode) << " is not one of batch (0), group (1)";
    return msg.str();
  }
  if (p.mask < CKFMHA_MASK_NONE || p.mask > CKFMHA_MASK_WINDOW_BOTTOM_RIGHT) {
    msg << "mask " << int(p.mask)
        << " is not one of none (0), causal_top_left (1), causal_bottom_right (2), "
           "window_top_left (3), window_bottom_right (4)";
    return msg.str();
  }
  if (p.window_left < -1 || p.window_right < -1) {
    msg << "window (" << p.window_left << ", " << p.window_right
        << ") is invalid: each bound is a key count >= 0, or -1 for unbounded";
    return msg.str();
  }
  if (p.bias < CKFMHA_BIAS_NONE || p.bias > CKFMHA_BIAS_ALIBI) {
    msg << "bias " << int(p.bias) << " is not one of none (0), elementwise (1), alibi (2)";
    return msg.str();
  }
  if (!(p.softcap >= 0.f) || !std::isfinite(p.softcap)) {
    msg << "softcap is " << p.softcap << "; it must be finite and >= 0 (0 disables it)";
    return msg.str();
  }
  if (!(p.dropout_p >= 0.f && p.dropout_p < 1.f)) {
    msg << "dropout_p is " << p.dropout_p << "; it must be in [0, 1)";
    return msg.str();
  }
  if (p.skip_min_seqlen_q < 0) {
    msg << "skip_min_seqlen_q is " << p.skip_min_seqlen_q << "; it must be >= 0";
    return msg.str();
  }
  if (p.num_splits < 0 || p.num_splits > kMaxSplits) {
    msg << "num_splits is " << p.num_splits
        << "; it must be 0 (automatic), 1 (one stage) or 2.." << kMaxSplits << " (split-KV)";
    return msg.str();
  }
  if (p.skip_min_seqlen_q > 0 && p.mode != CKFMHA_MODE_GROUP) {
    msg << "skip_min_seqlen_q applies to group (varlen) mode only";
    return msg.str();
  }
  struct Extent {
    const char* name;
    int32_t value;
    int32_t least;
  };
  // A zero batch or length is an empty problem (see "Empty problems" in ckfmha.h); heads and
  // head dims shape every row, so they are never 0.
  for (auto [name, value, least] :
       {Extent{"batch", p.batch, 0}, Extent{"nhead_q", p.nhead_q, 1},
        Extent{"nhead_k", p.nhead_k, 1}, Extent{"seqlen_q", p.seqlen_q, 0},
        Extent{"seqlen_k", p.seqlen_k, 0}, Extent{"hdim_q", p.hdim_q, 1},
        Extent{"hdim_v", p.hdim_v, 1}}) {
    if (value < least) {
      msg << name << " is " << value << "; it must be at least " << least;
      return msg.str();
    }
  }
  if (p.nhead_q % p.nhead_k != 0) {
    msg << "nhead_q (" << p.nhead_q << ") must be a multiple of nhead_k (" << p.nhead_k
        << ") so query heads share K/V heads evenly (GQA/MQA)";
    return msg.str();
  }
  if (p.batch > kMaxGridYZ || p.nhead_q > kMaxGridYZ) {
    msg << "batch (" << p.batch << ") and nhead_q (" << p.nhead_q << ") must each be at most "
        << kMaxGridYZ;
    return msg.str();
  }
  // The kernels track each row's largest raw score, which is its largest
  // logit only for a positive scale: a negative one would overflow exp2.
  if (!std::isfinite(p.scale) || !(p.scale > 0.f)) {
    msg << "scale is " << p.scale << "; it must be positive and finite";
    return msg.str();
  }
  for (auto [name, stride] : {std::pair<const char*, int64_t const(*)[3]>{"q", &p.q_stride},
                              {"k", &p.k_stride},
                              {"v", &p.v_stride},
                              {"o", &p.o_stride}}) {
    if (auto error = check_strides(name, *stride); !error.empty()) return error;
  }
  if (p.total_q < 0 || p.total_k < 0) {
    msg << "total_q (" << p.total_q << ") and total_k (" << p.total_k
        << ") must be >= 0: group mode's packed token counts, against which kernels check "
           "every cu_seqlens range";
    return msg.str();
  }
  if (p.lse_stride[0] < 0 || p.lse_stride[1] < 0 || p.bias_stride[0] < 0 ||
      p.bias_stride[1] < 0 || p.bias_stride[2] < 0 || p.alibi_stride < 0) {
    return "lse, bias and alibi strides must be non-negative element counts";
  }
  if (std::string why = check_paged_kv(p); !why.empty()) return why;
  if (std::string why = check_kv_quant(p); !why.empty()) return why;
  if (std::string why = check_q_quant(p); !why.empty()) return why;
  return check_fp8_block_scales(p);
}

ckfmha_fwd_problem forward_of(ckfmha_bwd_problem const& b) {
  ckfmha_fwd_problem f{};
  f.dtype = b.dtype;
  f.mode = b.mode;
  f.batch = b.batch;
  f.nhead_q = b.nhead_q;
  f.nhead_k = b.nhead_k;
  f.seqlen_q = b.seqlen_q;
  f.seqlen_k = b.seqlen_k;
  f.hdim_q = b.hdim_q;
  f.hdim_v = b.hdim_v;
  f.mask = b.mask;
  f.window_left = b.window_left;
  f.window_right = b.window_right;
  f.scale = b.scale;
  f.softcap = b.softcap;
  f.bias = b.bias;
  f.has_sink = b.has_sink;
  f.dropout_p = b.dropout_p;
  f.dropout_seed = b.dropout_seed;
  f.dropout_offset = b.dropout_offset;
  f.store_lse = 1;
  for (int i = 0; i < 3; ++i) {
    f.q_stride[i] = b.q_stride[i];
    f.k_stride[i] = b.k_stride[i];
    f.v_stride[i] = b.v_stride[i];
    f.o_stride[i] = b.o_stride[i];
    f.bias_stride[i] = b.bias_stride[i];
  }
  f.lse_stride[0] = b.lse_stride[0];
  f.lse_stride[1] = b.lse_stride[1];
  f.alibi_stride = b.alibi_stride;
  f.total_q = b.total_q;
  f.total_k = b.total_k;
  return f;
}

std::string check_bwd_problem(ckfmha_bwd_problem const& p) {
  if (std::string error = check_fwd_problem(forward_of(p)); !error.empty()) return error;
  for (auto [name, stride] : {std::pair<const char*, int64_t const(*)[3]>{"do", &p.do_stride},
                              {"dq", &p.dq_stride},
                              {"dk", &p.dk_stride},
                              {"dv", &p.dv_stride},
                              {"dbias", &p.dbias_stride}}) {
    if (auto error = check_strides(name, *stride); !error.empty()) return error;
  }
  if (p.store_dbias && p.bias != CKFMHA_BIAS_ELEMENTWISE) {
    return "store_dbias needs an elementwise bias (bias = CKFMHA_BIAS_ELEMENTWISE); ALiBi has "
           "no gradient";
  }
  if (p.store_dbias) {
    static const char* kAxis[3] = {"batch", "head", "seq"};
    const int32_t extent[3] = {p.batch, p.nhead_q, p.seqlen_q};
    for (int i = 0; i < 3; ++i) {
      if (p.dbias_stride[i] == 0 && extent[i] > 1) {
        std::ostringstream msg;
        msg << "dbias " << kAxis[i] << " stride is 0 over " << extent[i]
            << " entries; dbias is written once per (batch, query head, query, key), so it "
               "needs the full [batch, nhead_q, seqlen_q, seqlen_k] shape. For a bias broadcast "
               "over batch or heads, sum the full-size dbias over those axes";
        return msg.str();
      }
    }
  }
  if (p.deterministic != 0 && p.deterministic != 1) {
    return "deterministic must be 0 (fast, fp32 atomics) or 1 (bit-identical across runs)";
  }
  return {};
}

std::string describe(ckfmha_bwd_problem const& p) {
  std::string forward = describe(forward_of(p));
  // "fwd ... lse=1" -> "bwd ...": the backward always reads the LSE.
  std::string text = "bwd" + forward.substr(3);
  auto lse = text.find(" lse=1");
  if (lse != std::string::npos) text.erase(lse, 6);
  if (p.store_dbias) text += " dbias";
  if (p.deterministic) text += " deterministic";
  return text;
}

std::string describe(ckfmha_fwd_problem const& p) {
  std::ostringstream out;
  out << "fwd " << dtype_name(p.dtype) << " " << mode_name(p.mode) << " batch=" << p.batch
      << " nhead_q=" << p.nhead_q << " nhead_k=" << p.nhead_k << " seqlen_q=" << p.seqlen_q
      << " seqlen_k=" << p.seqlen_k << " hdim=" << p.hdim_q << "x" << p.hdim_v
      << " mask=" << mask_name(p.mask);
  if (p.mask == CKFMHA_MASK_WINDOW_TOP_LEFT || p.mask == CKFMHA_MASK_WINDOW_BOTTOM_RIGHT) {
    out << "(" << p.window_left << "," << p.window_right << ")";
  }
  out << " bias=" << bias_name(p.bias) << " lse=" << (p.store_lse ? 1 : 0);
  if (p.dropout_p > 0.f || p.store_dropout_randval) out << " dropout=" << p.dropout_p;
  if (p.softcap > 0.f) out << " softcap=" << p.softcap;
  if (p.has_sink) out << " sink";
  if (p.v_col_major) out << " v_col_major";
  if (p.q_quant == CKFMHA_KV_QUANT_FP8_E4M3) out << " q=fp8_e4m3";
  if (p.fp8_block_scales) out << " fp8_block_scales";
  if (p.kv_quant == CKFMHA_KV_QUANT_FP8_E4M3) {
    out << " kv=fp8_e4m3" << (p.kv_scale_per_head ? "(per-head scales)" : "");
  }
  if (p.num_splits > 0) out << " num_splits=" << p.num_splits;
  if (p.kv_storage != CKFMHA_KV_CONTIGUOUS) {
    out << " paged_kv("
        << (p.kv_storage == CKFMHA_KV_PAGED_TABLE ? "block_table" : "kv_indptr")
        << ", page_size=" << p.page_size
        << (p.page_layout == CKFMHA_PAGE_LAYOUT_VECTORIZED ? ", vectorized" : "") << ")";
  }
  return out.str();
}

}  // namespace ckfmha::runtime
