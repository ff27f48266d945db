// Kernel selection for forward problems: hard rules reject kernels that
// cannot run the problem, then a preference order picks among the rest.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel_entry.h"

#include <string>
#include <vector>

namespace ckfmha::runtime {

// Can SASS built for `kernel_arch` (e.g. 80, 90 with the "a" suffix in
// arch_name) run on a device of `device_arch`?
bool arch_runs_on(ckfmha_kernel_entry const& kernel, int device_arch);

// Empty when `kernel` can run `problem` on `device_arch`, else why not.
std::string reject_reason(ckfmha_kernel_entry const& kernel, ckfmha_fwd_problem const& problem,
                          int device_arch);

struct Selection {
  bool found = false;
  ckfmha_kernel_entry kernel{};
  std::string why_none;  // when !found: what is missing and what is available
};

Selection select_fwd(std::vector<ckfmha_kernel_entry> const& kernels,
                     ckfmha_fwd_problem const& problem, int device_arch);

std::string explain_fwd(std::vector<ckfmha_kernel_entry> const& kernels,
                        ckfmha_fwd_problem const& problem, int device_arch);

}  // namespace ckfmha::runtime
