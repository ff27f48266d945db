// The convolution backward plans. Backward-data runs the forward kernels:
// per stride phase, a convolution of dy with the filter taps that reach the
// phase's positions of dx. Backward-weight runs one conv_bwd_weight kernel,
// its reduction over positions split across CTAs where that fills the GPU.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel/params/conv_params.h"
#include "ckfmha/kernel_entry.h"
#include "ckfmha/runtime/conv_aux_kernels.hpp"
#include "ckfmha/runtime/conv_plan.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ckfmha::runtime {

// The positions of dx with one remainder by the stride in every dim. For dx
// position phase + stride * j and filter tap r, dy position
// (phase + padding - r * dilation) / stride is read when the division is
// exact: the taps that reach the phase are every `step`-th one down from
// `first`, and in dy's coordinates they form a forward convolution of
// stride 1 (`forward`: x = dy, in_channels = K, out_channels = C, y = the
// phase of dx), whose padding may be negative.
struct ConvDataPhase {
  ckfmha_conv_problem forward{};
  int64_t dx_offset = 0;      // elements from dx to the phase's first position
  size_t filter_offset = 0;   // bytes into the workspace of its filter
  ConvPhaseFilter filter{};   // the rearrangement (pointers set at run time)
  // The same filter read in place from w, for kernels that take filter views
  // (reads_filter_view): no rearrangement runs for their phases.
  kernel::ConvFilterView view{};
  bool empty = false;         // no tap reaches it: its positions are zeros
  int32_t vector = 8;         // the channel vector dy and its filter allow (non-empty phases)
  ConvPlan plan;              // its kernel (non-empty phases)
};

struct ConvDataPlan {
  bool found = false;
  std::string why;  // when not found: which phase has no kernel and why
  std::vector<ConvDataPhase> phases;
  size_t workspace_bytes = 0;
  // Groups multiplied as one by every phase (conv_tma_pack), through
  // block-diagonal filters; 1: none.
  int32_t pack = 1;
  // The learned selection's account: one kernel chosen for every phase, or
  // why the hand rules' per-phase plans stay ("" in heuristic mode).
  std::string learned;
};

// Whether a phase's kernel reads w in place through the phase's view rather
// than a rearranged copy in the workspace: an unpacked phase on the direct
// template always, on the TMA template where w is 16-byte aligned, as tensor
// copies need, on the gathering wgmma template's 8-channel kernels where w is
// aligned and the phase's output channels (w's C) come in whole 16-byte
// vectors (w NULL: assumed aligned).
bool reads_filter_view(ConvDataPhase const& phase, const void* w);

// The phases that run a convolution (not only zeros), at least 1: the
// backward-data run launches them at once, each on its own stream.
int32_t conv_running_phases(std::vector<ConvDataPhase> const& phases);

// The phases and their forward problems, without kernels; `pack` groups
// multiplied as one (conv_tma_pack).
std::vector<ConvDataPhase> conv_data_phases(ckfmha_conv_problem const& problem,
                                            size_t* workspace_bytes, int32_t pack = 1);

// The workspace a backward-data call needs: room for the rearranged filters
// of the packed plan or the unpacked one, whichever the planner takes.
size_t conv_data_workspace_bytes(ckfmha_conv_problem const& problem);

// A kernel for every non-empty phase; dy and workspace (may be NULL: assumed
// aligned) decide the channel vector each phase allows.
ConvDataPlan plan_conv_bwd_data(std::vector<ckfmha_kernel_entry> const& kernels,
                                ckfmha_conv_problem const& problem,
                                ConvPlanContext const& context, const void* dy,
                                const void* workspace);

std::string explain_conv_bwd_data(std::vector<ckfmha_kernel_entry> const& kernels,
                                  ckfmha_conv_problem const& problem,
                                  ConvPlanContext const& context);

// The widest channel vector backward-weight may load: it divides both
// channel counts, the x and dy strides, and aligns both pointers (NULL:
// assumed aligned).
int32_t conv_weight_vector_allowed(ckfmha_conv_problem const& problem, const void* x,
                                   const void* dy);

// fp32 partial sums of dw: groups x K x taps x C.
size_t conv_weight_workspace_bytes(ckfmha_conv_problem const& problem);

// Checks the backward-data phases' reductions (taps x K) fit the kernels'
// 32-bit index; empty when they do.
std::string check_conv_bwd_data(ckfmha_conv_problem const& problem);

}  // namespace ckfmha::runtime
