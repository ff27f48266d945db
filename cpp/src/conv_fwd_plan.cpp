// The forward plan and its packed form (conv_fwd_plan.hpp).
#include "ckfmha/runtime/conv_fwd_plan.hpp"

#include "ckfmha/kernel/params/conv_params.h"
#include "ckfmha/runtime/conv_selection.hpp"

#include <sstream>
#include <string>
#include <utility>

namespace ckfmha::runtime {

ckfmha_conv_problem conv_packed_problem(ckfmha_conv_problem const& p, int32_t pack) {
  ckfmha_conv_problem packed = p;
  packed.groups = p.groups / pack;
  packed.in_channels = p.in_channels * pack;
  packed.out_channels = p.out_channels * pack;
  return packed;
}

size_t conv_fwd_workspace_bytes(ckfmha_conv_problem const& p, int device_arch) {
  const int32_t pack = kernel::conv_tma_pack(p.groups, p.in_channels);
  if (pack == 1 || device_arch < 90) return 0;
  // groups / pack filters of pack x K rows of taps x pack x C elements.
  return size_t(p.groups) * p.out_channels * size_t(conv_filter_taps(p)) * p.in_channels *
         size_t(pack) * 2;
}

ConvFwdPlan plan_conv_fwd(std::vector<ckfmha_kernel_entry> const& kernels,
                          ckfmha_conv_problem const& p, ConvPlanContext const& context,
                          const void* x, const void* w, const void* workspace,
                          bool has_workspace) {
  ConvFwdPlan out;
  out.problem = p;
  ConvPlanContext unpacked = context;
  unpacked.vector = conv_vector_allowed(p, x, w);
  out.plan = plan_conv(kernels, p, CKFMHA_CONV_FWD, unpacked);
  const int32_t pack = kernel::conv_tma_pack(p.groups, p.in_channels);
  if (pack == 1 || !has_workspace) return out;
  // Packing adds a launch and (pack - 1) / pack products of zeros: worth it
  // where the tiles keep the tensor cores busy and the gathering kernels
  // would have run the groups (kernel::conv_tma_pack).
  const bool worth_packing =
      !out.plan.found || (conv_output_rows(p) >= kernel::kTmaPackMinPositions &&
                          !is_conv_tma(out.plan.kernel));
  if (!worth_packing) return out;
  const ckfmha_conv_problem packed = conv_packed_problem(p, pack);
  ConvPlanContext packed_context = context;
  packed_context.vector = conv_vector_allowed(packed, x, workspace);
  ConvPlan plan = plan_conv(kernels, packed, CKFMHA_CONV_FWD, packed_context);
  if (!plan.found || !is_conv_tma(plan.kernel)) return out;
  out.unpacked = std::move(out.plan);
  out.plan = std::move(plan);
  out.problem = packed;
  out.pack = pack;
  return out;
}

std::string explain_conv_fwd(std::vector<ckfmha_kernel_entry> const& kernels,
                             ckfmha_conv_problem const& p, ConvPlanContext const& context) {
  const ConvFwdPlan fwd = plan_conv_fwd(kernels, p, context, nullptr, nullptr, nullptr, true);
  ConvPlanContext as_run = context;
  as_run.vector = conv_vector_allowed(fwd.problem, nullptr, nullptr);
  std::string text = explain_conv(kernels, fwd.problem, CKFMHA_CONV_FWD, as_run);
  if (fwd.pack == 1) return text;
  ConvPlan const& bare = fwd.unpacked;
  std::ostringstream out;
  out << "problem: " << conv_direction_name(CKFMHA_CONV_FWD) << " " << describe(p) << " on sm_"
      << context.device_arch << "\n"
      << "groups multiplied " << fwd.pack << " at a time as one of " << fwd.pack * p.in_channels
      << " input and " << fwd.pack * p.out_channels
      << " output channels through block-diagonal filters (zeros between the groups) written "
         "into the workspace, so that the TMA template takes whole 64-channel chunks; without "
         "a workspace they run unpacked, "
      << (bare.found ? std::string("on ") + bare.kernel.name : "on no kernel: " + bare.why)
      << ". The account below is the packed problem's: 1 in " << fwd.pack
      << " of its products are the groups' own, the others the zeros between them\n";
  // The packed plan has two stages: the filter, then the kernel.
  const std::string one_stage = "plan: one stage, ";
  if (size_t at = text.find(one_stage); at != std::string::npos) {
    text.replace(at, one_stage.size(),
                 "plan: the packed filters written into the workspace, then ");
  }
  return out.str() + text;
}

}  // namespace ckfmha::runtime
