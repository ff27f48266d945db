// Every kernel this process can launch: the table compiled into the library
// plus tables of modules loaded at run time (the JIT cache).
#pragma once

#include "ckfmha/kernel_entry.h"

#include <memory>
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

  // The entries as registered so far: an immutable snapshot shared by every
  // caller, so taking it costs a reference count and never holds the lock
  // while launching. Registering a module publishes a new snapshot; calls
  // that took the old one finish with it. (A copy per call cost each launch
  // a large allocation and a memcpy of the whole table: ~1500 entries in a
  // default install, on every plan.)
  using Snapshot = std::shared_ptr<const std::vector<ckfmha_kernel_entry>>;
  Snapshot entries() const;
  bool find(std::string const& name, ckfmha_kernel_entry* out) const;

  std::string to_json() const;

 private:
  Registry();
  mutable std::mutex mutex_;
  Snapshot entries_;
};

// dlopens a module and registers its table; sets *added. Returns a status.
int load_module(char const* path, int* added);

}  // namespace ckfmha::runtime
