// Grouped convolution problems: checks, the channel vector the tensors allow,
// kernel selection with reasons and the (single-stage) plan.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel_entry.h"

#include <cstdint>
#include <string>
#include <vector>

namespace ckfmha::runtime {

// Empty when `problem` is well formed (independent of any kernel), else what
// is wrong and what is allowed.
std::string check_conv_problem(ckfmha_conv_problem const& problem);

// Output positions times batch: the rows of the implicit GEMM, 0 when nothing runs.
int64_t conv_output_rows(ckfmha_conv_problem const& problem);

// Filter taps: the product of the filter's sizes over the spatial dims.
int64_t conv_filter_taps(ckfmha_conv_problem const& problem);

std::string describe(ckfmha_conv_problem const& problem);
const char* conv_direction_name(ckfmha_conv_direction direction);
// Empty for a known direction, else what is supported.
std::string check_conv_direction(ckfmha_conv_direction direction);

// The widest channel vector (8, 4, 2 or 1 elements) the problem's channel
// count and x strides allow, and the pointers when given (NULL: assumed
// aligned, as select and explain do). Python's first-use key applies the same
// rule (ckfmha.first_use.conv_vector).
int32_t conv_vector_allowed(ckfmha_conv_problem const& problem, const void* x, const void* w);

// The widest of 8, 4, 2 elements that divides `channels` and each of the
// `count` strides and aligns both pointers (NULL: aligned); else 1. The rule
// behind every pass's channel vector.
int32_t widest_conv_vector(int64_t channels, int64_t const* strides, int count, const void* a,
                           const void* b);

struct ConvPlan {
  bool found = false;
  ckfmha_kernel_entry kernel{};
  std::string why;  // found: why this kernel; else what is missing and what exists
  // Backward-weight: CTAs sharing each output tile's reduction; the TMA
  // forward: a cluster's CTAs sharing each tile's k-tiles (its launcher
  // decides alike, kernel::conv_fwd_tma_splits).
  int32_t splits = 1;
};

struct ConvPlanContext {
  int device_arch = 0;
  int sm_count = 0;
  int32_t vector = 8;                          // conv_vector_allowed
  ckfmha_kernel_entry const* forced = nullptr;  // a kernel the caller named
  bool can_split = true;  // backward-weight: a workspace for partial sums exists
  // Whether an automatic plan may follow the learned selection when the
  // process's mode asks for it (backward-data decides for all its phases at
  // once and plans each phase without it).
  bool learned = true;
  // Convolutions that run at once on the device (backward-data's phases, on
  // side streams): the TMA forward splits its tiles' k-tiles as if it had
  // sm_count / concurrent SMs, as its launcher does (ckfmha_launch_context::
  // conv_concurrent).
  int32_t concurrent = 1;
};

// The CTAs a block of dw that the direct backward-weight kernel `k` sums
// among themselves before storing dw (a cluster, or 1), where its vector path
// takes the problem on `sm_count` SMs and stores dw itself
// (kernel::conv_vector_weight_layout); 0 where it adds into the zeroed fp32
// workspace, as every split plan does. x and dy decide the vector path (null
// pointers: as if aligned).
int32_t conv_weight_direct_cluster(ckfmha_kernel_entry const& k, ckfmha_conv_problem const& p,
                                   const void* x, const void* dy, int sm_count);

// How the direct backward-weight kernel `k`'s vector path splits the problem
// on `sm_count` SMs (kernel::conv_vector_weight_layout: the run length along
// w, the channels a CTA sums, the CTAs a block of dw), for explain; empty
// where its geometry leaves the problem to the lane path.
std::string conv_weight_vector_shape(ckfmha_kernel_entry const& k, ckfmha_conv_problem const& p,
                                     int sm_count);

// The CTAs of the cluster an sm_90 backward-weight kernel `k`'s `splits`
// sum their partial tiles in before storing dw, or 0 where they add into the
// zeroed fp32 workspace: the gathering wgmma kernel's up to
// kernel::kConvMaxClusterSplits (kernel::conv_weight_cluster_sum), the TMA
// kernel's where its tiles' clusters are all resident at once on `sm_count`
// SMs and the sums fit its stages; every other implicit GEMM adds into the
// workspace. The launch may use fewer splits where a tile's positions are
// few.
int32_t conv_weight_gemm_cluster(ckfmha_kernel_entry const& k, ckfmha_conv_problem const& p,
                                 int32_t splits, int sm_count);

// Whether kernel `k` can run `direction` of `p` in `context` (explain's
// "fits").
bool conv_kernel_fits(ckfmha_kernel_entry const& k, ckfmha_conv_problem const& p,
                      ckfmha_conv_direction direction, ConvPlanContext const& context);

// The learned selection's account of a pass: each candidate's prediction,
// least first, and which one it runs; "" when the hand rules decide (the
// mode, or conv_model_gap's reason, which it then names).
std::string explain_conv_predictions(std::vector<ckfmha_kernel_entry> const& kernels,
                                     ckfmha_conv_problem const& p,
                                     ckfmha_conv_direction direction,
                                     ConvPlanContext const& context);

ConvPlan plan_conv(std::vector<ckfmha_kernel_entry> const& kernels,
                   ckfmha_conv_problem const& problem, ckfmha_conv_direction direction,
                   ConvPlanContext const& context);

std::string explain_conv(std::vector<ckfmha_kernel_entry> const& kernels,
                         ckfmha_conv_problem const& problem, ckfmha_conv_direction direction,
                         ConvPlanContext const& context);

}  // namespace ckfmha::runtime
