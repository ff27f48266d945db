// The forward plan: one kernel over the problem, or, for groups of 8-32 input
// channels, the packed plan: `pack` consecutive groups multiplied as one
// (kernel::conv_tma_pack) through a block-diagonal filter written into the
// workspace first, so that the TMA template takes them.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel_entry.h"
#include "ckfmha/runtime/conv_plan.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ckfmha::runtime {

struct ConvFwdPlan {
  ConvPlan plan;                  // the kernel, over `problem`
  ckfmha_conv_problem problem{};  // the caller's problem, or its packed form
  int32_t pack = 1;               // groups multiplied as one; 1: the caller's filter
  // Packed (pack > 1): the plan of the groups one at a time, as a call
  // without a workspace runs them (explain names it).
  ConvPlan unpacked;
};

// `pack` consecutive groups as one: groups / pack groups of pack x C input and
// pack x K output channels. x and y keep their strides: a position's channels
// of consecutive groups are one run.
ckfmha_conv_problem conv_packed_problem(ckfmha_conv_problem const& problem, int32_t pack);

// The packed filter's bytes where the problem's groups pack and `device_arch`
// has the TMA template (sm_90 on), which the packed plan needs; else 0.
size_t conv_fwd_workspace_bytes(ckfmha_conv_problem const& problem, int device_arch);

// The forward plan for `context` (its vector is worked out here from x, w and
// the workspace; NULL pointers: assumed aligned). The packed plan is taken
// only when the caller gives a workspace (`has_workspace`), where it runs on
// the TMA template, and where the unpacked plan has no kernel (a TMA kernel
// forced by name) or, from kernel::kTmaPackMinPositions output positions, is
// not on the TMA template already.
ConvFwdPlan plan_conv_fwd(std::vector<ckfmha_kernel_entry> const& kernels,
                          ckfmha_conv_problem const& problem, ConvPlanContext const& context,
                          const void* x, const void* w, const void* workspace,
                          bool has_workspace);

// explain_conv for the forward, as planned with a workspace: the packed
// problem's account where the groups are packed.
std::string explain_conv_fwd(std::vector<ckfmha_kernel_entry> const& kernels,
                             ckfmha_conv_problem const& problem, ConvPlanContext const& context);

}  // namespace ckfmha::runtime
