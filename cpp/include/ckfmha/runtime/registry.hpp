// Every kernel this process can launch: the table compiled into the library
// plus tables of modules loaded at run time (the JIT cache).
#pragma once

#include "ckfmha/kernel_entry.h"

#include <mutex>
#include <string>
#include <vector>

namespace ckfmha::runtime {

class Registry {
 public:
  // The process-wide registry, filled with the built-in table on first use.
  static Registry& instance();

  // Copies the entries of `table` whose names are new; returns how many.
  int add_table(ckfmha_kernel_table const& table);

  // Snapshot, so callers never hold the lock while launching.
  std::vector<ckfmha_kernel_entry> entries() const;
  bool find(std::string const& name, ckfmha_kernel_entry* out) const;

  std::string to_json() const;

 private:
  Registry();
  mutable std::mutex mutex_;
  std::vector<ckfmha_kernel_entry> entries_;
};

// dlopens a module and registers its table; sets *added. Returns a status.
int load_module(char const* path, int* added);

}  // namespace ckfmha::runtime
