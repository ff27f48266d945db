// A learned cost model: gradient-boosted regression trees that predict, from
// a candidate plan's features (selection_features.hpp), the log of its time
// (or of its time over the hand rules' plan's: SelectionModel::relative). One
// tree set serves batch-mode forward plans, one decode steps (a single query
// row, where split counts decide), one group-mode (varlen) forward plans and
// one the backward main stage. benchmarks/train_selection.py trains it on the
// oracle's timings and writes the text format parse_selection_model reads.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/runtime/selection_features.hpp"

#include <cstdint>
#include <istream>
#include <memory>
#include <string>
#include <vector>

namespace ckfmha::runtime {

struct TreeNode {
  int32_t feature = -1;  // < 0: a leaf
  double threshold = 0;  // x[feature] <= threshold goes left
  int32_t left = -1;
  int32_t right = -1;
  double value = 0;  // leaves: this tree's contribution
};

struct CostModel {
  std::vector<std::vector<TreeNode>> trees;  // node 0 is each tree's root
  // The hand rules' plan is kept unless these trees predict another at least
  // this fraction faster: timings within it are noise the trees cannot rank.
  double margin = 0;
  bool empty() const { return trees.empty(); }
  // The target's log (SelectionModel::relative) for each of `xs`: the sum of
  // the trees' leaves. Each tree is walked for every candidate before
  // the next tree, so its nodes stay in the L1 cache instead of the whole
  // model passing through the caches once per candidate.
  std::vector<double> predict_logs(std::vector<Features> const& xs) const;
  // The same for `count` feature rows of `width` values each (any schema).
  std::vector<double> predict_logs(double const* xs, size_t count, size_t width) const;
};

// Which plans a model's trees rank, each with its own feature list: attention
// (selection_features.hpp) or convolution (conv_selection.hpp). A file names
// its list; the loader tells the two apart by it.
enum class ModelSchema { attention, conv };

struct SelectionModel {
  std::string device;  // the GPU it was trained on
  int arch = 0;        // 10*major+minor; the model serves this arch only
  int num_sms = 0;
  // What the trees predict: the log of a plan's milliseconds, or (relative)
  // the log of its time over the hand rules' plan's time for the same problem.
  // Only the ranking within a problem matters, and a relative target keeps the
  // trees off the problem's scale.
  bool relative = false;
  ModelSchema schema = ModelSchema::attention;
  CostModel fwd;
  CostModel decode;
  CostModel varlen;
  CostModel bwd;
  CostModel conv_fwd;         // convolution forward
  CostModel conv_bwd_data;    // backward-data, one kernel for every stride phase
  CostModel conv_bwd_weight;  // backward-weight, with the split count
  std::string describe() const;
  // A prediction (exp of the trees' sum) as explain prints it: milliseconds,
  // or a multiple of the hand rules' plan's time.
  std::string format_prediction(double predicted) const;
  // The trees of `family` ("fwd", "decode", "varlen" or "bwd"; "conv_fwd",
  // "conv_bwd_data" or "conv_bwd_weight" in a conv model), or null for
  // another name.
  CostModel const* family(std::string const& name) const;
  CostModel* family(std::string const& name);
};

// The tree set that ranks a forward problem's plans: "varlen" in group mode,
// "decode" for a single query row when the model has decode trees, else "fwd".
const char* forward_family(SelectionModel const* model, ckfmha_fwd_problem const& p);

// Why `model` (may be null) cannot rank the plans of a `mode`/`dtype` problem
// on `arch` with its `family` ("fwd", "decode", "varlen" or "bwd") trees, or "".
std::string model_gap(SelectionModel const* model, const char* family, ckfmha_mode mode,
                      ckfmha_dtype dtype, int arch);

// A predicted or measured time as explain prints it.
std::string format_ms(double ms);

// Parses a model file; returns "" or what is wrong, with the line number.
std::string parse_selection_model(std::istream& in, SelectionModel* model);

// The process's attention model (ckfmha_selection_model_load), or null.
std::shared_ptr<const SelectionModel> current_selection_model();
// The process's convolution model, or null; loaded like the attention one, or
// from the package's ../data/selection_conv_sm90.model when first needed.
std::shared_ptr<const SelectionModel> current_conv_selection_model();
// Installs `model` as the attention or the convolution model, by its schema.
void set_selection_model(std::shared_ptr<const SelectionModel> model);

// Bumped whenever the model or the tuning table changes, so remembered plans
// made under the old ones are not reused.
uint64_t selection_generation();
void bump_selection_generation();

}  // namespace ckfmha::runtime
