// The learned conv selection's features, split choices and choice. Each value
// is computed as ckfmha/conv_selection.py computes it, in the same order of
// operations, so a model trained on the Python features splits the same way
// here.
#include "ckfmha/runtime/conv_selection.hpp"

#include "ckfmha/kernel/params/conv_params.h"
#include "ckfmha/runtime/selection_model.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <string_view>

namespace ckfmha::runtime {

namespace {

constexpr int64_t kDirectGroups = 32;  // groups a direct kernel's CTA computes
constexpr int32_t kSplitCounts[] = {1, 2, 4, 8, 16, 32, 64, 128};
constexpr int32_t kDirectCtasPerSm[] = {1, 2, 4, 8, 16};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t product(int32_t const (&values)[3], int dims) {
  int64_t out = 1;
  for (int i = 0; i < dims; ++i) out *= values[i];
  return out;
}

int32_t largest(int32_t const (&values)[3], int dims) {
  return *std::max_element(values, values + dims);
}

// Output tiles over the batch: the items a direct weight-gradient kernel's
// CTAs take in turn.
int64_t direct_items(ckfmha_conv_problem const& p, ckfmha_kernel_entry const& k) {
  const int dims = p.spatial_dims;
  const int64_t depth = dims == 3 ? p.output[0] : 1;
  return std::max<int64_t>(1, ceil_div(p.output[dims - 2], k.warps) *
                                  ceil_div(p.output[dims - 1], k.tile_m) * depth * p.batch);
}

}  // namespace

const char* conv_model_family(ckfmha_conv_direction direction) {
  switch (direction) {
    case CKFMHA_CONV_BWD_DATA: return "conv_bwd_data";
    case CKFMHA_CONV_BWD_WEIGHT: return "conv_bwd_weight";
    default: return "conv_fwd";
  }
}

std::vector<int32_t> conv_split_choices(ckfmha_conv_problem const& p,
                                        ckfmha_kernel_entry const& k, int sm_count) {
  std::set<int32_t> counts;
  if (k.conv_max_channels != 0) {
    const int64_t blocks = ceil_div(p.groups, kDirectGroups);
    const int64_t items = direct_items(p, k);
    for (int32_t m : kDirectCtasPerSm) {
      counts.insert(int32_t(std::min(std::max<int64_t>(ceil_div(int64_t(m) * sm_count, blocks), 1),
                                     std::min<int64_t>(items, 65535))));
    }
  } else {
    const int64_t rows = int64_t(p.batch) * product(p.output, p.spatial_dims);
    const int64_t k_tiles = std::max<int64_t>(1, ceil_div(rows, k.tile_k));
    for (int32_t s : kSplitCounts) {
      if (s == 1 || 2 * int64_t(s) <= k_tiles) counts.insert(s);
    }
  }
  return {counts.begin(), counts.end()};
}

ConvFeatures conv_candidate_features(ckfmha_conv_problem const& p,
                                     ckfmha_conv_direction direction,
                                     ckfmha_kernel_entry const& k, int64_t splits, int sm_count) {
  const int dims = p.spatial_dims;
  const int64_t groups = p.groups, c = p.in_channels, kk = p.out_channels;
  const int64_t taps = product(p.filter, dims);
  const int64_t positions = int64_t(p.batch) * product(p.output, dims);
  int64_t m = positions, n = kk, r = c * taps;
  if (direction == CKFMHA_CONV_BWD_DATA) {
    m = int64_t(p.batch) * product(p.input, dims);
    n = c;
    r = kk * taps;
  } else if (direction == CKFMHA_CONV_BWD_WEIGHT) {
    m = kk;
    n = c * taps;
    r = positions;
  }
  const bool direct = k.conv_max_channels != 0;
  // The implicit GEMM of backward-weight multiplies packed groups
  // (conv_weight_pack): pack x the channels, groups / pack of them.
  int64_t gemm_groups = groups;
  if (direction == CKFMHA_CONV_BWD_WEIGHT && !direct) {
    const int64_t pack =
        kernel::conv_weight_pack(p.groups, p.in_channels, p.out_channels, n, positions);
    m *= pack;
    n *= pack;
    gemm_groups /= pack;
  }
  const bool weight = direction == CKFMHA_CONV_BWD_WEIGHT;
  const int64_t used_splits = weight ? std::max<int64_t>(splits, 1) : 1;
  int64_t ctas = 0;
  double fill = 0, steps = 0;
  if (direct) {
    const int64_t blocks = ceil_div(groups, kDirectGroups);
    int32_t const(&space)[3] = direction == CKFMHA_CONV_BWD_DATA ? p.input : p.output;
    const int64_t width = space[dims - 1];
    const int64_t tiles = ceil_div(space[dims - 2], k.warps) * ceil_div(width, k.tile_m) *
                          (dims == 3 ? space[0] : 1) * p.batch;
    ctas = blocks * (weight ? used_splits : tiles);
    fill = double(groups) / double(blocks * kDirectGroups) * double(width) /
           double(ceil_div(width, k.tile_m) * k.tile_m);
    steps = weight ? double(r) / std::max(double(ctas) / double(blocks), 1.0) : double(r);
  } else {
    const int64_t tiles_m = ceil_div(m, k.tile_m), tiles_n = ceil_div(n, k.tile_n);
    ctas = tiles_m * tiles_n * gemm_groups * used_splits;
    fill = double(m * n) / double(tiles_m * k.tile_m * tiles_n * k.tile_n);
    steps = double(r) / double(int64_t(k.tile_k) * used_splits);
  }
  const int64_t phases = direction == CKFMHA_CONV_BWD_DATA ? product(p.stride, dims) : 1;
  const bool wgmma = is_conv_gather_wgmma(k);
  return {double(dims),
          std::log2(double(std::max<int64_t>(p.batch, 1))),
          std::log2(double(groups)),
          std::log2(double(c)),
          std::log2(double(kk)),
          double(taps),
          double(largest(p.stride, dims)),
          double(largest(p.dilation, dims)),
          double(phases),
          std::log2(double(std::max<int64_t>(m, 1))),
          std::log2(double(std::max<int64_t>(n, 1))),
          std::log2(double(std::max<int64_t>(r, 1))),
          std::log2(std::max(2.0 * double(m) * double(n) * double(r) * double(gemm_groups), 1.0)),
          wgmma ? 1.0 : 0.0,
          direct ? 1.0 : 0.0,
          double(k.tile_m),
          double(k.tile_n),
          double(k.tile_k),
          double(k.warps),
          double(k.stages),
          double(used_splits),
          std::log2(double(std::max<int64_t>(ctas, 1))),
          double(ctas) / double(std::max(sm_count, 1)),
          fill,
          std::log2(std::max(steps, 1.0))};
}

std::string conv_model_gap(SelectionModel const* model, ckfmha_conv_direction direction,
                           int arch) {
  if (model == nullptr) return "no conv cost model is loaded (ckfmha_selection_model_load)";
  if (model->arch != arch) {
    return "the conv cost model is for sm_" + std::to_string(model->arch) + ", not sm_" +
           std::to_string(arch);
  }
  auto const* trees = model->family(conv_model_family(direction));
  if (trees == nullptr || trees->empty()) {
    return std::string("the conv cost model has no ") + conv_model_family(direction) + " trees";
  }
  return {};
}

void predict_conv_candidates(SelectionModel const& model, ckfmha_conv_problem const& p,
                             ckfmha_conv_direction direction, int sm_count,
                             std::vector<ConvCandidate>* candidates) {
  std::vector<ConvFeatures> xs;
  xs.reserve(candidates->size());
  for (auto const& c : *candidates) {
    xs.push_back(conv_candidate_features(p, direction, *c.kernel, c.splits, sm_count));
  }
  auto const* trees = model.family(conv_model_family(direction));
  if (trees == nullptr || xs.empty()) return;
  const auto logs = trees->predict_logs(xs[0].data(), xs.size(), kNumConvFeatures);
  for (size_t i = 0; i < candidates->size(); ++i) (*candidates)[i].predicted = std::exp(logs[i]);
}

ConvCandidate const* learned_conv_choice(SelectionModel const& model,
                                         ckfmha_conv_direction direction,
                                         std::vector<ConvCandidate> const& candidates) {
  auto const* trees = model.family(conv_model_family(direction));
  if (trees == nullptr || candidates.empty()) return nullptr;
  auto best = std::min_element(candidates.begin(), candidates.end(),
                               [](auto const& a, auto const& b) { return a.predicted < b.predicted; });
  return best->predicted < 1.0 - trees->margin ? &*best : nullptr;
}

}  // namespace ckfmha::runtime
