#include "ckfmha/runtime/tuning_table.hpp"

#include "ckfmha/runtime/problem.hpp"
#include "ckfmha/runtime/selection_model.hpp"
#include "ckfmha/runtime/status.hpp"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <sys/stat.h>

#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

namespace ckfmha::runtime {

namespace {

std::mutex table_mutex;
std::map<std::string, TunedPlan> table;

// Group mode: the packed token counts, which with the longest lengths tell
// varlen batches apart (0 0 in batch mode and for the backward).
std::string group_tokens(ckfmha_fwd_problem const& p) {
  if (p.mode != CKFMHA_MODE_GROUP) return "0 0";
  return std::to_string(p.total_q) + " " + std::to_string(p.total_k);
}
std::string group_tokens(ckfmha_bwd_problem const&) { return "0 0"; }

template <class Problem>
std::string key_of(const char* kind, Problem const& p) {
  std::ostringstream key;
  key << kind << ' ' << dtype_name(p.dtype) << ' ' << mode_name(p.mode) << ' ' << p.batch << ' '
      << p.nhead_q << ' ' << p.nhead_k << ' ' << p.seqlen_q << ' ' << p.seqlen_k << ' '
      << p.hdim_q << ' ' << p.hdim_v << ' ' << int(p.mask) << ' ' << p.window_left << ' '
      << p.window_right << ' ' << group_tokens(p);
  return key.str();
}

constexpr int kKeyFields = 15;

// What a table must match to be used: this library (its version, and the
// size and modification time of its file, which a rebuild or reinstall
// changes along with the kernels' speed), this driver, this GPU.
struct Provenance {
  std::string library, build, driver, device;
};

std::string library_build() {
  Dl_info info{};
  struct stat file {};
  if (dladdr(reinterpret_cast<void*>(&tuning_clear), &info) == 0 || info.dli_fname == nullptr ||
      stat(info.dli_fname, &file) != 0) {
    return "unknown";
  }
  return std::to_string(file.st_size) + "-" + std::to_string(file.st_mtime);
}

Provenance current_provenance() {
  Provenance now;
  now.build = library_build();
  now.library = std::to_string(CKFMHA_VERSION_MAJOR) + "." +
                std::to_string(CKFMHA_VERSION_MINOR) + "." + std::to_string(CKFMHA_VERSION_PATCH);
  int driver = 0, device = 0;
  cudaDeviceProp prop{};
  now.driver = cudaDriverGetVersion(&driver) == cudaSuccess ? std::to_string(driver) : "none";
  now.device = cudaGetDevice(&device) == cudaSuccess &&
                       cudaGetDeviceProperties(&prop, device) == cudaSuccess
                   ? std::string(prop.name)
                   : "none";
  cudaGetLastError();  // no device is an answer here, not an error to leave behind
  return now;
}

}  // namespace

std::string tuning_key(ckfmha_fwd_problem const& p) { return key_of("fwd", p); }
std::string tuning_key(ckfmha_bwd_problem const& p) { return key_of("bwd", p); }

void tuning_add(std::string const& key, TunedPlan const& plan) {
  {
    std::lock_guard<std::mutex> lock(table_mutex);
    table[key] = plan;
  }
  bump_selection_generation();
}

bool tuning_find(std::string const& key, TunedPlan* plan) {
  std::lock_guard<std::mutex> lock(table_mutex);
  auto it = table.find(key);
  if (it == table.end()) return false;
  *plan = it->second;
  return true;
}

void tuning_clear() {
  {
    std::lock_guard<std::mutex> lock(table_mutex);
    table.clear();
  }
  bump_selection_generation();
}

int tuning_save(const char* path, int* entries) {
  std::ofstream out(path);
  if (!out) return fail(CKFMHA_ERROR_INVALID_ARGUMENT, std::string("cannot write ") + path);
  Provenance now = current_provenance();
  out << "ckfmha-tuning 1\n"
      << "# key: kind dtype mode batch nhead_q nhead_k seqlen_q seqlen_k hdim_q hdim_v mask "
         "window_left window_right; then kernel num_splits ms\n"
      << "library " << now.library << "\nbuild " << now.build << "\ndriver " << now.driver
      << "\ndevice " << now.device << "\n";
  std::lock_guard<std::mutex> lock(table_mutex);
  for (auto const& [key, plan] : table) {
    out << "entry " << key << ' ' << plan.kernel << ' ' << plan.num_splits << ' ' << plan.ms
        << "\n";
  }
  if (entries) *entries = int(table.size());
  if (!out) return fail(CKFMHA_ERROR_INVALID_ARGUMENT, std::string("error writing ") + path);
  return succeed();
}

int tuning_load(const char* path, int* entries) {
  std::ifstream in(path);
  if (!in) return fail(CKFMHA_ERROR_NOT_FOUND, std::string("cannot read tuning table ") + path);
  Provenance now = current_provenance();
  std::string line;
  int number = 0;
  auto bad = [&](std::string const& what) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT,
                std::string(path) + " line " + std::to_string(number) + ": " + what);
  };
  if (!std::getline(in, line) || (++number, line != "ckfmha-tuning 1")) {
    return bad("not a ckfmha tuning table (expected 'ckfmha-tuning 1')");
  }
  std::map<std::string, TunedPlan> found;
  int provenance_lines = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string word;
    fields >> word;
    std::string value;
    std::getline(fields >> std::ws, value);
    auto stale = [&](const char* what, std::string const& here) {
      return bad(std::string("written for ") + what + " " + value + ", this is " + here +
                 " (a stale table: run python -m ckfmha tune again)");
    };
    if (word == "library" && value != now.library) return stale("library", now.library);
    if (word == "build" && value != now.build) return stale("library build", now.build);
    if (word == "driver" && value != now.driver) return stale("CUDA driver", now.driver);
    if (word == "device" && value != now.device) return stale("device", now.device);
    if (word == "library" || word == "build" || word == "driver" || word == "device") {
      ++provenance_lines;
    }
    if (word != "entry") continue;
    std::istringstream parts(value);
    std::string key, part;
    for (int i = 0; i < kKeyFields && parts >> part; ++i) key += (i ? " " : "") + part;
    TunedPlan plan;
    if (!(parts >> plan.kernel >> plan.num_splits >> plan.ms) || plan.num_splits < 0) {
      return bad("expected 'entry <" + std::to_string(kKeyFields) +
                 " key fields> <kernel> <num_splits> <ms>'");
    }
    found[key] = plan;
  }
  if (provenance_lines != 4) {
    return bad("the table does not name its library, build, driver and device (each once)");
  }
  {
    std::lock_guard<std::mutex> lock(table_mutex);
    for (auto const& [key, plan] : found) table[key] = plan;
  }
  bump_selection_generation();
  if (entries) *entries = int(found.size());
  return succeed();
}

}  // namespace ckfmha::runtime
