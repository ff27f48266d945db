#include "ckfmha/runtime/selection_model.hpp"

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
  std::vector<double> sums(xs.size(), 0.0);
  for (auto const& tree : trees) {
    TreeNode const* nodes = tree.data();
    for (size_t c = 0; c < xs.size(); ++c) {
      double const* x = xs[c].data();
      TreeNode const* n = nodes;
      while (n->feature >= 0) n = nodes + (x[n->feature] <= n->threshold ? n->left : n->right);
      sums[c] += n->value;
    }
  }
  return sums;
}

std::string SelectionModel::describe() const {
  std::ostringstream out;
  out << "cost model for sm_" << arch << " trained on " << device << " (" << num_sms
      << " SMs), predicting " << (relative ? "time relative to the hand rules' plan" : "ms")
      << ":";
  const char* sep = " ";
  for (const char* name : {"fwd", "decode", "varlen", "bwd"}) {
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
std::string check_tree(std::vector<TreeNode> const& nodes) {
  for (size_t i = 0; i < nodes.size(); ++i) {
    TreeNode const& n = nodes[i];
    if (n.feature < 0) continue;
    if (n.feature >= kNumFeatures) return "feature index " + std::to_string(n.feature);
    for (int32_t child : {n.left, n.right}) {
      if (child <= int32_t(i) || size_t(child) >= nodes.size()) {
        return "node " + std::to_string(i) + " links to node " + std::to_string(child);
      }
    }
  }
  return {};
}

std::string parse_trees(LineReader& reader, int count, CostModel* model) {
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
    if (auto error = check_tree(tree); !error.empty()) {
      return reader.error("tree " + std::to_string(t) + ": " + error);
    }
    model->trees.push_back(std::move(tree));
  }
  return {};
}

std::string check_features(LineReader const& reader) {
  std::istringstream names(reader.line);
  std::string word, name;
  names >> word;
  for (int i = 0; i < kNumFeatures; ++i) {
    if (!(names >> name) || name != kFeatureNames[i]) {
      return reader.error(std::string("feature ") + std::to_string(i) + " is '" + name +
                          "'; this library computes '" + kFeatureNames[i] +
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
      if (auto error = check_features(reader); !error.empty()) return error;
      have_features = true;
    } else if (key == "model") {
      std::string family;
      int count = 0;
      CostModel* target = nullptr;
      if ((fields >> family >> count) && count >= 0) {
        target = model->family(family);
      }
      if (target == nullptr) {
        return reader.error("expected 'model fwd|decode|varlen|bwd <trees> [margin]'");
      }
      if (!have_features) return reader.error("the features line must come before the trees");
      if (double margin = 0; fields >> margin) {
        target->margin = margin;
        with_margin.insert(target);
      }
      fields.clear();  // no margin on the line is not an error
      target->trees.clear();
      if (auto error = parse_trees(reader, count, target); !error.empty()) return error;
    } else if (key == "end") {
      if (model->arch <= 0) return reader.error("no 'arch' line before 'end'");
      for (CostModel* trees : {&model->fwd, &model->decode, &model->varlen, &model->bwd}) {
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
std::shared_ptr<const SelectionModel> the_model;
bool looked_for_shipped = false;
std::atomic<uint64_t> generation{1};

// The model an installed package ships beside the library
// (ckfmha/lib/libckfmha.so -> ckfmha/data/selection_sm90.model), so C callers
// that never load one still get it; null when there is none or it does not
// parse (a C caller then loads one with ckfmha_selection_model_load).
std::shared_ptr<const SelectionModel> shipped_model() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&selection_generation), &info) == 0 ||
      info.dli_fname == nullptr) {
    return nullptr;
  }
  std::string library = info.dli_fname;
  const size_t slash = library.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : library.substr(0, slash);
  std::ifstream in(dir + "/../data/selection_sm90.model");
  auto model = std::make_shared<SelectionModel>();
  if (!in || !parse_selection_model(in, model.get()).empty()) return nullptr;
  return model;
}
}  // namespace

std::shared_ptr<const SelectionModel> current_selection_model() {
  std::lock_guard<std::mutex> lock(model_mutex);
  if (the_model == nullptr && !looked_for_shipped) {
    looked_for_shipped = true;
    the_model = shipped_model();
  }
  return the_model;
}

void set_selection_model(std::shared_ptr<const SelectionModel> model) {
  {
    std::lock_guard<std::mutex> lock(model_mutex);
    the_model = std::move(model);
    looked_for_shipped = true;
  }
  bump_selection_generation();
}

uint64_t selection_generation() { return generation.load(std::memory_order_acquire); }
void bump_selection_generation() { generation.fetch_add(1, std::memory_order_acq_rel); }

}  // namespace ckfmha::runtime
