// Backward plans: the three stages (bwd_dot_do_o, bwd_dq_dk_dv,
// bwd_convert_dq) a backward problem runs, each with its reasons.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel_entry.h"

#include <string>
#include <vector>

namespace ckfmha::runtime {

// Empty when `kernel` (of any backward family) can run its stage of
// `problem` on `device_arch`, else why not.
std::string reject_reason_bwd(ckfmha_kernel_entry const& kernel,
                              ckfmha_bwd_problem const& problem, int device_arch);

struct BwdPlan {
  bool found = false;
  ckfmha_kernel_entry dot_do_o{};
  ckfmha_kernel_entry dq_dk_dv{};
  ckfmha_kernel_entry convert_dq{};
  std::string why_none;
};

// `forced` (may be null) names the bwd_dq_dk_dv kernel to use; the row-wise
// stages are always chosen to match.
BwdPlan select_bwd(std::vector<ckfmha_kernel_entry> const& kernels,
                   ckfmha_bwd_problem const& problem, int device_arch,
                   ckfmha_kernel_entry const* forced = nullptr);

std::string explain_bwd(std::vector<ckfmha_kernel_entry> const& kernels,
                        ckfmha_bwd_problem const& problem, int device_arch);

}  // namespace ckfmha::runtime
