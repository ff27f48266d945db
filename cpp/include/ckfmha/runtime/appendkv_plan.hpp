// Append-to-KV-cache problems: checks, kernel selection with reasons, and the
// (single-stage) plan.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel_entry.h"

#include <string>
#include <vector>

namespace ckfmha::runtime {

// Empty when `problem` is well formed (independent of any kernel), else what
// is wrong and what is allowed.
std::string check_appendkv_problem(ckfmha_appendkv_problem const& problem);

// Empty when every host-visible sequence length fits: 0 <= length,
// length + seqlen_new <= capacity, and with RoPE every rotated position is
// below rope_max_pos. Else names the first sequence that does not.
std::string check_appendkv_lengths(ckfmha_appendkv_problem const& problem,
                                   int32_t const* cache_seqlens_host);

// Tokens a sequence's cache holds: max_seqlen_cache, or pages x page size.
int64_t appendkv_capacity(ckfmha_appendkv_problem const& problem);

const char* rope_name(ckfmha_rope rope);
std::string describe(ckfmha_appendkv_problem const& problem);

// Empty when `kernel` can run `problem` on `device_arch`, else why not.
std::string reject_reason_appendkv(ckfmha_kernel_entry const& kernel,
                                   ckfmha_appendkv_problem const& problem, int device_arch);

struct AppendKvPlan {
  bool found = false;
  ckfmha_kernel_entry kernel{};
  std::string why;  // found: why this kernel; else what is missing and what exists
};

// `forced` (may be null) is a kernel the caller named.
AppendKvPlan plan_appendkv(std::vector<ckfmha_kernel_entry> const& kernels,
                           ckfmha_appendkv_problem const& problem, int device_arch,
                           ckfmha_kernel_entry const* forced = nullptr);

std::string explain_appendkv(std::vector<ckfmha_kernel_entry> const& kernels,
                             ckfmha_appendkv_problem const& problem, int device_arch);

}  // namespace ckfmha::runtime
