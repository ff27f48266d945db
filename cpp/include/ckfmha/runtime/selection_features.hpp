// The features a learned cost model reads for one candidate plan: the
// problem's shape, the candidate's algorithm and the grid the two make.
// benchmarks/train_selection.py computes the same list from the oracle's
// timings; a model file names the features in this order and the loader
// refuses a file that names others, so the two cannot drift apart silently.
#pragma once

#include "ckfmha/kernel_entry.h"

#include <array>
#include <cstdint>

namespace ckfmha::runtime {

inline constexpr const char* kFeatureNames[] = {
    "log_batch", "nhead_q",   "group",      "log_seqlen_q", "log_seqlen_k",
    "hdim_q",    "hdim_v",    "causal",     "sm90",         "split",
    "num_splits", "tile_m",   "tile_n",     "warps",        "stages",
    "log_ctas",  "waves",     "log_key_tiles", "pad",       "log_work",
    "fill"};
inline constexpr int kNumFeatures = int(sizeof(kFeatureNames) / sizeof(kFeatureNames[0]));

using Features = std::array<double, kNumFeatures>;

// What the features need of a forward or backward problem.
struct CostShape {
  int64_t batch = 1;
  int64_t nhead_q = 1;
  int64_t nhead_k = 1;
  int64_t seqlen_q = 1;
  int64_t seqlen_k = 1;
  int64_t hdim_q = 0;
  int64_t hdim_v = 0;
  bool masked = false;  // any mask: about half the (query, key) pairs are computed
  // Group mode: the mean sequence lengths (total tokens / batch); seqlen_q/k are
  // the longest, which size the grid. Batch mode: equal to seqlen_q/k.
  double mean_seqlen_q = 1;
  double mean_seqlen_k = 1;
};

CostShape cost_shape(ckfmha_fwd_problem const& problem);
CostShape cost_shape(ckfmha_bwd_problem const& problem);

// num_splits: the split count of a fwd_splitkv candidate (>= 1); ignored for
// one-stage and backward kernels.
Features candidate_features(CostShape const& shape, ckfmha_kernel_entry const& kernel,
                            int num_splits, int num_sms);

}  // namespace ckfmha::runtime
