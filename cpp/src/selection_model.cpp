#include "ckfmha/runtime/selection_model.hpp"

#include "ckfmha/runtime/conv_selection.hpp"

#include <atomic>
#include <dlfcn.h>
#include <fstream>
#include <cstdio>
#include <mutex>
#include <set>
#include <sstream>
#include <utility>

namespace ckfmha::runtime {

std::vector<double> CostModel::predict_logs(std::vector<Features> const& xs) const {
  return predict_logs(xs.empty() ? nullptr : xs[0].data(), xs.size(), kNumFeatures);
}

std::vector<double> CostModel::predict_logs(double const* xs, size_t count, size_t width) const {
  std::vector<double> sums(count, 0.0);
  for (auto const& tree : trees) {
    TreeNode const* nodes = tree.data();
    for (size_t c = 0; c < count; ++c) {
      double const* x = xs + c * width;
      TreeNode const* n = nodes;
      while (n->feature >= 0) n = nodes + (x[n->feature] <= n->threshold ? n->left : n->right);
      sums[c] += n->value;
    }
  }
  return sums;
}

namespace {

std::vector<const char*> family_names(ModelSchema schema) {
  if (schema == ModelSchema::conv) return {"conv_fwd", "conv_bwd_data", "conv_bwd_weight"};
  return {"fwd", "decode", "varlen", "bwd"};
}

// The feature names a schema's trees index.
struct FeatureList {
  const char* const* names;
  int count;
};

FeatureList feature_list(ModelSchema schema) {
  if (schema == ModelSchema::conv) return {kConvFeatureNames, kNumConvFeatures};
  return {kFeatureNames, kNumFeatures};
}

}  // namespace

std::string SelectionModel::describe() const {
  std::ostringstream out;
  out << "cost model for sm_" << arch << " trained on " << device << " (" << num_sms
      << " SMs), predicting " << (relative ? "time relative to the hand rules' plan" : "ms")
      << ":";
  const char* sep = " ";
  for (const char* name : family_names(schema)) {
    auto const& trees = *family(name);
    out << sep << name << " " << trees.trees.size() << " trees, margin " << trees.margin;
    sep = "; ";
  }
  return out.str();
}

std::string SelectionModel::format_prediction(double predicted) const {
  if (!relative) return format_ms(predicted);
  char text[48];
  std::snprintf(text, sizeof(text), "%.6gx the rules' plan", predicted);
  return text;
}

CostModel const* SelectionModel::family(std::string const& name) const {
  if (schema == ModelSchema::conv) {
    if (name == "conv_fwd") return &conv_fwd;
    if (name == "conv_bwd_data") return &conv_bwd_data;
    if (name == "conv_bwd_weight") return &conv_bwd_weight;
    return nullptr;
  }
  if (name == "fwd") return &fwd;
  if (name == "decode") return &decode;
  if (name == "varlen") return &varlen;
  if (name == "bwd") return &bwd;
  return nullptr;
}

CostModel* SelectionModel::family(std::string const& name) {
  return const_cast<CostModel*>(std::as_const(*this).family(name));
}

const char* forward_family(SelectionModel const* model, ckfmha_fwd_problem const& p) {
  if (p.mode == CKFMHA_MODE_GROUP) return "varlen";
  return model != nullptr && p.seqlen_q == 1 && !model->decode.empty() ? "decode" : "fwd";
}

std::string model_gap(SelectionModel const* model, const char* family, ckfmha_mode mode,
                      ckfmha_dtype dtype, int arch) {
  if (model == nullptr) return "no cost model is loaded (ckfmha_selection_model_load)";
  if (model->arch != arch) {
    return "the cost model is for sm_" + std::to_string(model->arch) + ", not sm_" +
           std::to_string(arch);
  }
  auto const* trees = model->family(family);
  if (trees == nullptr || trees->empty()) {
    return std::string("the cost model has no ") + family + " trees";
  }
  if (mode != CKFMHA_MODE_BATCH && std::string(family) != "varlen") {
    return std::string("the cost model's ") + family + " trees cover batch mode only";
  }
  if (dtype != CKFMHA_DTYPE_FP16 && dtype != CKFMHA_DTYPE_BF16) {
    return "the cost model covers fp16/bf16 only";
  }
  return {};
}

std::string format_ms(double ms) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g ms", ms);
  return text;
}

namespace {

// Reads lines and says where a problem is.
struct LineReader {
  std::istream& in;
  int number = 0;
  std::string line;

  bool next() {
    while (std::getline(in, line)) {
      ++number;
      if (!line.empty() && line[0] != '#') return true;
    }
    return false;
  }
  std::string error(std::string const& what) const {
    return "line " + std::to_string(number) + ": " + what;
  }
};

// Checks a tree's node links: every child in range and every path ending in
// a leaf (links only go forward, so no cycle).
std::string check_tree(std::vector<TreeNode> const& nodes, int features) {
  for (size_t i = 0; i < nodes.size(); ++i) {
    TreeNode const& n = nodes[i];
    if (n.feature < 0) continue;
    if (n.feature >= features) return "feature index " + std::to_string(n.feature);
    for (int32_t child : {n.left, n.right}) {
      if (child <= int32_t(i) || size_t(child) >= nodes.size()) {
        return "node " + std::to_string(i) + " links to node " + std::to_string(child);
      }
    }
  }
  return {};
}

std::string parse_trees(LineReader& reader, int count, int features, CostModel* model) {
  for (int t = 0; t < count; ++t) {
    int nodes = 0;
    if (!reader.next() || std::sscanf(reader.line.c_str(), "tree %d", &nodes) != 1 || nodes < 1) {
      return reader.error("expected 'tree <nodes>' for tree " + std::to_string(t));
    }
    std::vector<TreeNode> tree(static_cast<size_t>(nodes));
    for (auto& n : tree) {
      std::istringstream fields(reader.next() ? reader.line : std::string());
      if (!(fields >> n.feature >> n.threshold >> n.left >> n.right >> n.value)) {
        return reader.error("expected '<feature> <threshold> <left> <right> <value>'");
      }
    }
    if (auto error = check_tree(tree, features); !error.empty()) {
      return reader.error("tree " + std::to_string(t) + ": " + error);
    }
    model->trees.push_back(std::move(tree));
  }
  return {};
}

// Reads a features line into `schema`: the attention list, or (its first name
// being the conv list's) the conv list; any other list is an error.
std::string check_features(LineReader const& reader, ModelSchema* schema) {
  std::istringstream names(reader.line);
  std::string word, name;
  names >> word >> name;
  *schema = name == kConvFeatureNames[0] ? ModelSchema::conv : ModelSchema::attention;
  const FeatureList list = feature_list(*schema);
  for (int i = 0; i < list.count; ++i) {
    if (i > 0 && !(names >> name)) name.clear();
    if (name != list.names[i]) {
      return reader.error(std::string("feature ") + std::to_string(i) + " is '" + name +
                          "'; this library computes '" + list.names[i] +
                          "' there (retrain the model for this version)");
    }
  }
  if (names >> name) return reader.error("more features than this library computes: " + name);
  return {};
}

}  // namespace

std::string parse_selection_model(std::istream& in, SelectionModel* model) {
  LineReader reader{in, 0, {}};
  if (!reader.next() || reader.line != "ckfmha-selection-model 1") {
    return reader.error("not a ckfmha cost model (expected 'ckfmha-selection-model 1')");
  }
  bool have_features = false;
  double default_margin = 0;
  std::set<CostModel const*> with_margin;
  while (reader.next()) {
    std::istringstream fields(reader.line);
    std::string key;
    fields >> key;
    if (key == "device") {
      std::getline(fields >> std::ws, model->device);
    } else if (key == "arch") {
      fields >> model->arch;
    } else if (key == "num_sms") {
      fields >> model->num_sms;
    } else if (key == "target") {
      std::string target;
      fields >> target;
      if (target != "log_ms" && target != "log_ratio_to_rules") {
        return reader.error("expected 'target log_ms|log_ratio_to_rules'");
      }
      model->relative = target == "log_ratio_to_rules";
    } else if (key == "margin") {  // the default of families without their own
      fields >> default_margin;
    } else if (key == "features") {
      if (auto error = check_features(reader, &model->schema); !error.empty()) return error;
      have_features = true;
    } else if (key == "model") {
      std::string family;
      int count = 0;
      CostModel* target = nullptr;
      if (!have_features) return reader.error("the features line must come before the trees");
      if ((fields >> family >> count) && count >= 0) {
        target = model->family(family);
      }
      if (target == nullptr) {
        return reader.error(model->schema == ModelSchema::conv
                                ? "expected 'model conv_fwd|conv_bwd_data|conv_bwd_weight "
                                  "<trees> [margin]'"
                                : "expected 'model fwd|decode|varlen|bwd <trees> [margin]'");
      }
      if (double margin = 0; fields >> margin) {
        target->margin = margin;
        with_margin.insert(target);
      }
      fields.clear();  // no margin on the line is not an error
      target->trees.clear();
      if (auto error = parse_trees(reader, count, feature_list(model->schema).count, target);
          !error.empty()) {
        return error;
      }
    } else if (key == "end") {
      if (model->arch <= 0) return reader.error("no 'arch' line before 'end'");
      for (const char* name : family_names(model->schema)) {
        CostModel* trees = model->family(name);
        if (with_margin.count(trees) == 0) trees->margin = default_margin;
      }
      return {};
    } else {
      return reader.error("unknown line '" + reader.line + "'");
    }
    if (fields.fail()) return reader.error("cannot read '" + reader.line + "'");
  }
  return reader.error("the file ends before 'end'");
}

namespace {
std::mutex model_mutex;
// Per schema: the model, and whether the package's file was looked for.
std::shared_ptr<const SelectionModel> the_models[2];
bool looked_for_shipped[2] = {false, false};
std::atomic<uint64_t> generation{1};

// The model an installed package ships beside the library
// (ckfmha/lib/libckfmha.so -> ckfmha/data/selection_sm90.model, and
// selection_conv_sm90.model), so C callers that never load one still get it;
// null when there is none or it does not parse (a C caller then loads one with
// ckfmha_selection_model_load).
std::shared_ptr<const SelectionModel> shipped_model(ModelSchema schema) {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&selection_generation), &info) == 0 ||
      info.dli_fname == nullptr) {
    return nullptr;
  }
  std::string library = info.dli_fname;
  const size_t slash = library.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : library.substr(0, slash);
  const bool conv = schema == ModelSchema::conv;
  std::ifstream in(dir + (conv ? "/../data/selection_conv_sm90.model"
                               : "/../data/selection_sm90.model"));
  auto model = std::make_shared<SelectionModel>();
  if (!in || !parse_selection_model(in, model.get()).empty() || model->schema != schema) {
    return nullptr;
  }
  return model;
}

std::shared_ptr<const SelectionModel> current_model(ModelSchema schema) {
  const int slot = int(schema);
  std::lock_guard<std::mutex> lock(model_mutex);
  if (the_models[slot] == nullptr && !looked_for_shipped[slot]) {
    looked_for_shipped[slot] = true;
    the_models[slot] = shipped_model(schema);
  }
  return the_models[slot];
}
}  // namespace

std::shared_ptr<const SelectionModel> current_selection_model() {
  return current_model(ModelSchema::attention);
}

std::shared_ptr<const SelectionModel> current_conv_selection_model() {
  return current_model(ModelSchema::conv);
}

void set_selection_model(std::shared_ptr<const SelectionModel> model) {
  {
    const int slot = int(model ? model->schema : ModelSchema::attention);
    std::lock_guard<std::mutex> lock(model_mutex);
    the_models[slot] = std::move(model);
    looked_for_shipped[slot] = true;
  }
  bump_selection_generation();
}

uint64_t selection_generation() { return generation.load(std::memory_order_acquire); }
void bump_selection_generation() { generation.fetch_add(1, std::memory_order_acq_rel); }

}  // namespace ckfmha::runtime
