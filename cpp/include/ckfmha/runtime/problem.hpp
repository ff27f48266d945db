// Checks that a forward problem is well formed, independent of any kernel.
#pragma once

#include "ckfmha/ckfmha.h"

#include <initializer_list>
#include <string>

namespace ckfmha::runtime {

// Empty when valid, else a message naming the bad field and what is allowed.
std::string check_fwd_problem(ckfmha_fwd_problem const& problem);

const char* dtype_name(ckfmha_dtype dtype);
const char* kv_quant_name(ckfmha_kv_quant quant);
// A host dequantisation scale of an fp8 tensor and the problem field holding it.
struct NamedScale {
  const char* name;
  float value;
};
// Why host dequantisation scales of fp8 tensors (K/V of a forward or an
// append, fp8 queries) are unusable, or "".
std::string check_fp8_scale_values(std::initializer_list<NamedScale> scales);
// Why `quant` (the value of the problem field `field`) is no ckfmha_kv_quant, or "".
std::string check_quant_kind(const char* field, ckfmha_kv_quant quant);
// Bytes per q/k/v/o element (2 for fp16/bf16, 4 for fp32).
int element_bytes(ckfmha_dtype dtype);
const char* mask_name(ckfmha_mask mask);
const char* mask_kind_name(ckfmha_mask_kind kind);
const char* bias_name(ckfmha_bias bias);
const char* mode_name(ckfmha_mode mode);
const char* page_layout_name(ckfmha_page_layout layout);
// Why a paged cache's page_layout cannot be used with `dtype` (an unknown
// value, or vectorized pages of fp32); empty when it can. The forward and
// append problems both check their layouts with it.
std::string check_page_layout(ckfmha_page_layout layout, ckfmha_dtype dtype);
const char* family_name(ckfmha_family family);

// One-line human description used in error messages and explanations.
std::string describe(ckfmha_fwd_problem const& problem);

// The forward problem a backward problem differentiates (its shared fields,
// store_lse set): the backward reuses the forward's checks on them.
ckfmha_fwd_problem forward_of(ckfmha_bwd_problem const& problem);
// Empty when valid, else a message naming the bad field and what is allowed.
std::string check_bwd_problem(ckfmha_bwd_problem const& problem);
std::string describe(ckfmha_bwd_problem const& problem);

}  // namespace ckfmha::runtime
