#include "ckfmha/runtime/registry.hpp"

#include "ckfmha/runtime/appendkv_plan.hpp"
#include "ckfmha/runtime/problem.hpp"
#include "ckfmha/runtime/status.hpp"

#include <dlfcn.h>

#include <cstring>
#include <sstream>

extern "C" const ckfmha_kernel_table* ckfmha_builtin_kernel_table(void);

namespace ckfmha::runtime {

namespace {

std::string json_string(const char* text) {
  std::string out = "\"";
  for (const char* c = text; *c; ++c) {
    switch (*c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      default: out += *c;
    }
  }
  return out + "\"";
}

}  // namespace

Registry& Registry::instance() {
  static Registry registry;
  return registry;
}

Registry::Registry() : entries_(std::make_shared<const std::vector<ckfmha_kernel_entry>>()) {
  if (const ckfmha_kernel_table* table = ckfmha_builtin_kernel_table()) add_table(*table);
}

int Registry::add_table(ckfmha_kernel_table const& table) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto next = std::make_shared<std::vector<ckfmha_kernel_entry>>(*entries_);
  int added = 0;
  for (int i = 0; i < table.count; ++i) {
    ckfmha_kernel_entry const& entry = table.entries[i];
    bool known = false;
    for (auto const& existing : *next) {
      if (std::strcmp(existing.name, entry.name) == 0) {
        known = true;
        break;
      }
    }
    if (!known) {
      next->push_back(entry);
      ++added;
    }
  }
  if (added > 0) entries_ = std::move(next);
  return added;
}

Registry::Snapshot Registry::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_;
}

bool Registry::find(std::string const& name, ckfmha_kernel_entry* out) const {
  for (auto const& entry : *entries()) {
    if (name == entry.name) {
      *out = entry;
      return true;
    }
  }
  return false;
}

std::string Registry::to_json() const {
  std::ostringstream out;
  out << "[";
  bool first = true;
  const Snapshot snapshot = entries();
  for (auto const& e : *snapshot) {
    out << (first ? "" : ",") << "\n  {\"name\": " << json_string(e.name)
        << ", \"family\": " << json_string(family_name(e.family))
        << ", \"dtype\": " << json_string(dtype_name(e.dtype))
        << ", \"mode\": " << json_string(mode_name(e.mode)) << ", \"hdim_q\": " << e.hdim_q
        << ", \"hdim_v\": " << e.hdim_v << ", \"mask\": " << json_string(mask_kind_name(e.mask))
        << ", \"bias\": " << json_string(bias_name(e.bias))
        << ", \"lse\": " << (e.has_lse ? "true" : "false")
        << ", \"dropout\": " << (e.has_dropout ? "true" : "false")
        << ", \"softcap\": " << (e.has_softcap ? "true" : "false")
        << ", \"sink\": " << (e.has_sink ? "true" : "false")
        << ", \"v_col_major\": " << (e.v_col_major ? "true" : "false")
        << ", \"dbias\": " << (e.has_dbias ? "true" : "false")
        << ", \"rope\": " << json_string(rope_name(e.rope))
        << ", \"paged_kv\": " << (e.paged_kv ? "true" : "false")
        << ", \"page_layout\": " << json_string(page_layout_name(e.page_layout))
        << ", \"kv_quant\": " << json_string(kv_quant_name(e.kv_quant))
        << ", \"q_quant\": " << json_string(kv_quant_name(e.q_quant))
        << ", \"arch\": " << e.arch
        << ", \"arch_name\": " << json_string(e.arch_name)
        << ", \"pipeline\": " << json_string(e.pipeline) << ", \"tile_m\": " << e.tile_m
        << ", \"tile_n\": " << e.tile_n << ", \"tile_k\": " << e.tile_k
        << ", \"warps\": " << e.warps << ", \"stages\": " << e.stages
        << ", \"bias_rows_only\": " << (e.bias_rows_only ? "true" : "false")
        << ", \"conv_spatial_dims\": " << e.conv_spatial_dims
        << ", \"conv_vector\": " << e.conv_vector
        << ", \"conv_max_channels\": " << e.conv_max_channels << "}";
    first = false;
  }
  out << (first ? "]" : "\n]");
  return out.str();
}

int load_module(char const* path, int* added) {
  if (path == nullptr) return fail(CKFMHA_ERROR_INVALID_ARGUMENT, "module path is NULL");
  // Modules stay loaded for the life of the process: the registry keeps
  // pointers to their names and launchers.
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return fail(CKFMHA_ERROR_NOT_FOUND, std::string("cannot load kernel module ") + path + ": " +
                                            (why ? why : "unknown dlopen error"));
  }
  auto table_fn = reinterpret_cast<ckfmha_table_fn>(dlsym(handle, CKFMHA_MODULE_TABLE_SYMBOL));
  if (table_fn == nullptr) {
    return fail(CKFMHA_ERROR_NOT_FOUND, std::string(path) + " is not a ckfmha kernel module: no " +
                                            CKFMHA_MODULE_TABLE_SYMBOL + " symbol");
  }
  const ckfmha_kernel_table* table = table_fn();
  if (table == nullptr || table->abi_version != CKFMHA_KERNEL_ABI_VERSION) {
    std::ostringstream msg;
    msg << path << " was built for kernel ABI "
        << (table ? table->abi_version : -1) << "; this library reads ABI "
        << CKFMHA_KERNEL_ABI_VERSION << " (rebuild the JIT cache)";
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT, msg.str());
  }
  int n = Registry::instance().add_table(*table);
  if (added) *added = n;
  return succeed();
}

}  // namespace ckfmha::runtime
