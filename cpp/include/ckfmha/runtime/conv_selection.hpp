// The learned conv selection: the plans it weighs for a pass (kernels, and
// backward-weight's split counts), their features, and the choice a conv cost
// model (selection_model.hpp, conv schema) makes among them.
// ckfmha/conv_selection.py computes the same candidates and features for the
// oracle and for training; the tests compare the two.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel_entry.h"

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ckfmha::runtime {

struct ConvPlanContext;
struct SelectionModel;

inline constexpr const char* kConvFeatureNames[] = {
    "spatial_dims", "log_batch", "log_groups", "log_in_channels", "log_out_channels",
    "taps",         "max_stride", "max_dilation", "phases",       "log_gemm_m",
    "log_gemm_n",   "log_gemm_k", "log_flop",     "wgmma",        "direct",
    "tile_m",       "tile_n",     "tile_k",       "warps",        "stages",
    "splits",       "log_ctas",   "waves",        "fill",         "log_k_steps"};
inline constexpr int kNumConvFeatures =
    int(sizeof(kConvFeatureNames) / sizeof(kConvFeatureNames[0]));

using ConvFeatures = std::array<double, kNumConvFeatures>;

// One candidate plan's features (ckfmha.conv_selection.conv_features).
// `splits`: backward-weight's split count or CTAs per block of groups;
// ignored for the other passes.
ConvFeatures conv_candidate_features(ckfmha_conv_problem const& p,
                                     ckfmha_conv_direction direction,
                                     ckfmha_kernel_entry const& kernel, int64_t splits,
                                     int sm_count);

// Backward-weight: the split counts (implicit GEMM: 1, 2, 4, .. 128 while a
// split keeps two k-tiles) or CTAs per block of 32 groups (direct: 1, 2, 4, 8,
// 16 per SM, at most one per output tile) the selection weighs for `kernel`.
std::vector<int32_t> conv_split_choices(ckfmha_conv_problem const& p,
                                        ckfmha_kernel_entry const& kernel, int sm_count);

struct ConvCandidate {
  ckfmha_kernel_entry const* kernel = nullptr;
  int32_t splits = 1;
  double predicted = 0;  // the model's time as a multiple of the hand rules' plan's
};

// The tree set that ranks a pass's plans: "conv_fwd", "conv_bwd_data" or
// "conv_bwd_weight".
const char* conv_model_family(ckfmha_conv_direction direction);

// Why the learned selection cannot rank this pass's plans (no conv model, no
// trees for the pass, another arch), or "".
std::string conv_model_gap(SelectionModel const* model, ckfmha_conv_direction direction,
                           int arch);

// The plans the learned selection weighs, each with its prediction: the
// kernels that fit (every phase of backward-data), the implicit-GEMM ones at
// the widest channel vector among them and the direct ones, SASS for the exact
// arch when there is any, at conv_split_choices for backward-weight.
// `fits_pass(kernel)` says whether a kernel can run the pass.
template <typename Fits>
std::vector<ConvCandidate> conv_candidates(std::vector<ckfmha_kernel_entry> const& kernels,
                                           ckfmha_conv_problem const& p,
                                           ckfmha_conv_direction direction, int device_arch,
                                           int sm_count, Fits const& fits_pass);

// Predictions for `candidates` from `model`'s trees for the pass.
void predict_conv_candidates(SelectionModel const& model, ckfmha_conv_problem const& p,
                             ckfmha_conv_direction direction, int sm_count,
                             std::vector<ConvCandidate>* candidates);

// The candidate the learned selection runs instead of the hand rules' plan:
// the least predicted, when it is predicted faster than the rules' plan by
// more than the pass's margin; else null.
ConvCandidate const* learned_conv_choice(SelectionModel const& model,
                                         ckfmha_conv_direction direction,
                                         std::vector<ConvCandidate> const& candidates);

// Whether a conv kernel is the forward fed by the copy engine
// (conv/fwd_tma_kernel.cuh). The cost model has no timings of it, so the
// learned selection leaves its plans to the hand rules.
inline bool is_conv_tma(ckfmha_kernel_entry const& k) {
  return std::string_view(k.pipeline ? k.pipeline : "") == "sm90_tma_wgmma";
}

// Whether a conv kernel is the gathering template on wgmma (cp.async gathers
// feeding sm_90a's tensor cores; conv/fwd_sm90_kernel.cuh and the weight
// gradient's twin).
inline bool is_conv_gather_wgmma(ckfmha_kernel_entry const& k) {
  return std::string_view(k.pipeline ? k.pipeline : "") == "sm90_cpasync_wgmma";
}

// ---- template definition ----

template <typename Fits>
std::vector<ConvCandidate> conv_candidates(std::vector<ckfmha_kernel_entry> const& kernels,
                                           ckfmha_conv_problem const& p,
                                           ckfmha_conv_direction direction, int device_arch,
                                           int sm_count, Fits const& fits_pass) {
  std::vector<ckfmha_kernel_entry const*> fitting;
  bool exact = false;
  int32_t widest = 0;
  for (auto const& k : kernels) {
    if (is_conv_tma(k)) continue;
    if (!fits_pass(k)) continue;
    fitting.push_back(&k);
    exact = exact || k.arch == device_arch;
  }
  std::vector<ckfmha_kernel_entry const*> chosen;
  for (auto const* k : fitting) {
    if (exact && k->arch != device_arch) continue;
    if (k->conv_max_channels == 0 && k->conv_vector > widest) widest = k->conv_vector;
  }
  std::vector<ConvCandidate> out;
  for (auto const* k : fitting) {
    if (exact && k->arch != device_arch) continue;
    if (k->conv_max_channels == 0 && k->conv_vector != widest) continue;
    if (direction != CKFMHA_CONV_BWD_WEIGHT) {
      out.push_back({k, 1, 0});
      continue;
    }
    for (int32_t s : conv_split_choices(p, *k, sm_count)) out.push_back({k, s, 0});
  }
  return out;
}

}  // namespace ckfmha::runtime
