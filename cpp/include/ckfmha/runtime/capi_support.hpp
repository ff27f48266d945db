// Pieces every C API translation unit shares: text copied out to a caller's
// buffer, the arch a call plans for, the NULL and alignment checks of argument
// pointers, and the contiguous strides of a layout.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/runtime/device.hpp"
#include "ckfmha/runtime/fwd_plan.hpp"
#include "ckfmha/runtime/problem.hpp"
#include "ckfmha/runtime/registry.hpp"
#include "ckfmha/runtime/status.hpp"

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>

namespace ckfmha::runtime {

// Copies `text` and its terminator into buf; `needed` (if given) gets the
// size either way, so callers can ask first with a NULL buffer.
inline int copy_text_out(std::string const& text, char* buf, size_t buf_len, size_t* needed) {
  if (needed) *needed = text.size() + 1;
  if (buf == nullptr || buf_len < text.size() + 1) {
    return fail(CKFMHA_ERROR_BUFFER_TOO_SMALL, "buffer of " + std::to_string(buf_len) +
                                                   " bytes is too small; " +
                                                   std::to_string(text.size() + 1) + " needed");
  }
  std::memcpy(buf, text.c_str(), text.size() + 1);
  return succeed();
}

// `arch` itself, or the current device's when it is negative.
inline int resolve_arch(int arch, int* resolved) {
  if (arch >= 0) {
    *resolved = arch;
    return CKFMHA_SUCCESS;
  }
  return current_device_arch(resolved);
}

// The SM count plans for `device_arch` are made with: the current device's
// when it has that arch (then *live_device is set, if given), else the arch's
// reference part (documented in ckfmha.h). Fails only when the device's count
// cannot be read.
inline int planning_sm_count(int device_arch, int* sms, bool* live_device = nullptr) {
  *sms = reference_sm_count(device_arch);
  int count = 0, arch_now = 0;
  if (device_count(&count) == CKFMHA_SUCCESS && count > 0 &&
      current_device_arch(&arch_now) == CKFMHA_SUCCESS && arch_now == device_arch) {
    if (live_device != nullptr) *live_device = true;
    return current_device_sm_count(sms);
  }
  return CKFMHA_SUCCESS;
}

// The registered kernel `kernel_name` for a run function of one family
// (`runner`, e.g. "ckfmha_conv_fwd_run"): NOT_FOUND when no kernel has the
// name, INVALID_ARGUMENT when it belongs to another family.
inline int find_forced_of_family(const char* kernel_name, ckfmha_family family,
                                 const char* runner, ckfmha_kernel_entry* forced) {
  if (!Registry::instance().find(kernel_name, forced)) {
    return fail(CKFMHA_ERROR_NOT_FOUND, std::string("no registered kernel named ") + kernel_name);
  }
  if (forced->family != family) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT,
                std::string("kernel ") + kernel_name + " is a " + family_name(forced->family) +
                    " kernel; " + runner + " runs " + family_name(family) + " kernels");
  }
  return CKFMHA_SUCCESS;
}

// A pointer the problem's features make necessary, and what to say when NULL.
struct RequiredPointer {
  bool needed;
  const void* ptr;
  const char* message;
};

// Fails with the first needed pointer that is NULL, so a kernel never
// dereferences one.
inline int require_pointers(std::initializer_list<RequiredPointer> pointers) {
  for (RequiredPointer const& pointer : pointers) {
    if (pointer.needed && pointer.ptr == nullptr) {
      return fail(CKFMHA_ERROR_INVALID_ARGUMENT, pointer.message);
    }
  }
  return CKFMHA_SUCCESS;
}

// A problem's own checks (check_fwd_problem, check_bwd_problem,
// check_appendkv_problem) as a status; a NULL problem fails too.
template <class Problem>
int checked(Problem const* problem, std::string (*check)(Problem const&)) {
  if (problem == nullptr) return fail(CKFMHA_ERROR_INVALID_ARGUMENT, "problem is NULL");
  std::string error = check(*problem);
  return error.empty() ? CKFMHA_SUCCESS : fail(CKFMHA_ERROR_INVALID_ARGUMENT, error);
}

// Fails with `what` unless `ok`.
inline int require(bool ok, const char* what) {
  return ok ? CKFMHA_SUCCESS : fail(CKFMHA_ERROR_INVALID_ARGUMENT, what);
}

inline bool aligned_to(const void* ptr, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

// Device dequantisation scales of fp8 K/V (a forward) or fp8 caches (an append):
// given only with fp8, both or neither, fp32-aligned, and required for per-head
// scales. `not_fp8` says what the problem has instead; `per_head_field` names
// the problem's per-head switch.
inline int check_fp8_scale_pointers(bool fp8, bool per_head, const float* k_scale,
                                    const float* v_scale, const char* not_fp8,
                                    const char* per_head_field) {
  const bool given = k_scale != nullptr || v_scale != nullptr;
  if (!fp8) {
    return given ? fail(CKFMHA_ERROR_INVALID_ARGUMENT,
                        std::string("args.k_scale/v_scale are set, but ") + not_fp8 +
                            ": scales apply to fp8 K/V only")
                 : CKFMHA_SUCCESS;
  }
  if (given && (k_scale == nullptr || v_scale == nullptr)) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT,
                "args.k_scale and args.v_scale come together: give both device scales or "
                "neither (then problem.k_scale and problem.v_scale are used)");
  }
  if (!given && per_head) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT,
                std::string(per_head_field) +
                    " needs args.k_scale and args.v_scale, device arrays of nhead_k fp32 scales");
  }
  if (!aligned_to(k_scale, 4) || !aligned_to(v_scale, 4)) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT, "args.k_scale/v_scale must be fp32-aligned");
  }
  return CKFMHA_SUCCESS;
}

// The device dequantisation scale of fp8 queries: given only with them and
// fp32-aligned. Unlike K/V's it may be left NULL with per-head scales: the
// problem's scalar then stands for every head.
inline int check_fp8_query_scale_pointer(bool fp8_queries, const float* q_scale) {
  if (q_scale == nullptr) return CKFMHA_SUCCESS;
  if (!fp8_queries) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT,
                "args.q_scale is set, but the queries are not quantised (q_quant none): the "
                "scale applies to fp8 queries only");
  }
  return require(aligned_to(q_scale, 4), "args.q_scale must be fp32-aligned");
}

// (batch, head, seq) strides of a contiguous tensor in `layout`.
inline void fill_layout_strides(ckfmha_layout layout, int64_t (&stride)[3], int64_t heads,
                                int64_t seqlen, int64_t hdim) {
  const bool bhsd = layout == CKFMHA_LAYOUT_BHSD;
  stride[0] = heads * seqlen * hdim;
  stride[1] = bhsd ? seqlen * hdim : hdim;
  stride[2] = bhsd ? hdim : heads * hdim;
}

}  // namespace ckfmha::runtime
