// What the convolution C API's translation units share: the problem and
// direction checks, the plan context, pointer and workspace checks, and a
// kernel named by the caller.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/runtime/capi_support.hpp"
#include "ckfmha/runtime/conv_plan.hpp"
#include "ckfmha/runtime/status.hpp"

#include <cstddef>
#include <initializer_list>
#include <string>
#include <utility>

namespace ckfmha::runtime {

inline int checked_problem(ckfmha_conv_problem const* problem) {
  return checked(problem, check_conv_problem);
}

// The arch plans are made for and its SM count (planning_sm_count).
inline int conv_context(int arch, ConvPlanContext* context) {
  if (int s = resolve_arch(arch, &context->device_arch)) return s;
  return planning_sm_count(context->device_arch, &context->sm_count);
}

inline int checked_direction(ckfmha_conv_direction direction) {
  std::string why = check_conv_direction(direction);
  return why.empty() ? CKFMHA_SUCCESS : fail(CKFMHA_ERROR_INVALID_ARGUMENT, why);
}

// Every pointer aligned to its 2-byte elements, or which one is not.
inline int check_element_aligned(
    std::initializer_list<std::pair<const void*, const char*>> pointers) {
  for (auto [ptr, name] : pointers) {
    if (!aligned_to(ptr, 2)) {
      return fail(CKFMHA_ERROR_INVALID_ARGUMENT,
                  std::string("args.") + name + " is not aligned to its 2-byte elements");
    }
  }
  return CKFMHA_SUCCESS;
}

// A workspace of `needed` bytes, 16-byte aligned; NULL passes when not required.
inline int check_workspace(void* workspace, size_t given, size_t needed, bool required) {
  if (needed == 0 || (!required && workspace == nullptr)) return CKFMHA_SUCCESS;
  if (workspace == nullptr || given < needed) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT,
                "args.workspace holds " + std::to_string(workspace ? given : 0) + " bytes; " +
                    std::to_string(needed) + " needed (ckfmha_conv_workspace_size)");
  }
  if (!aligned_to(workspace, 16)) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT, "args.workspace is not 16-byte aligned");
  }
  return CKFMHA_SUCCESS;
}

// A kernel the caller named, of `family`, for `runner`'s context.
inline int forced_kernel(const char* kernel_name, ckfmha_family family, const char* runner,
                  ckfmha_kernel_entry* forced, ConvPlanContext* context) {
  if (kernel_name == nullptr) return CKFMHA_SUCCESS;
  if (int s = find_forced_of_family(kernel_name, family, runner, forced)) return s;
  context->forced = forced;
  return CKFMHA_SUCCESS;
}

}  // namespace ckfmha::runtime
