// The extern "C" runners of the convolution backward passes: argument checks,
// then the plan's stages in order on the caller's stream.
#include "ckfmha/ckfmha.h"

#include "ckfmha/kernel/params/conv_params.h"
#include "ckfmha/runtime/capi_conv_support.hpp"
#include "ckfmha/runtime/capi_support.hpp"
#include "ckfmha/runtime/conv_aux_kernels.hpp"
#include "ckfmha/runtime/conv_bwd_plan.hpp"
#include "ckfmha/runtime/conv_plan.hpp"
#include "ckfmha/runtime/device_errors.hpp"
#include "ckfmha/runtime/registry.hpp"
#include "ckfmha/runtime/status.hpp"
#include "ckfmha/runtime/stream_fork.hpp"

#include <cstdint>
#include <string>
#include <vector>

using namespace ckfmha::runtime;

namespace {

// Zeros at the positions of an empty phase of dx (no filter tap reaches them).
int zero_phase(ConvDataPhase const& ph, char* dx, ckfmha_stream_t stream) {
  ConvZeroFill zeros{};
  zeros.base = dx;
  const int skip = 3 - ph.forward.spatial_dims;
  zeros.extent[0] = ph.forward.batch;
  zeros.stride[0] = ph.forward.y_stride[0];
  for (int axis = 0; axis < 3; ++axis) {
    const bool real = axis >= skip;
    zeros.extent[1 + axis] = real ? ph.forward.output[axis - skip] : 1;
    zeros.stride[1 + axis] = real ? ph.forward.y_stride[1 + axis - skip] : 0;
  }
  zeros.row = int64_t(ph.forward.groups) * ph.forward.out_channels;
  return from_launch_result(launch_conv_zero_fill(zeros, stream), "conv zeros");
}

// dx of the backward-data plan: the filters of the phases whose kernels
// need them rearranged (or packed) written into the workspace first (one
// launch for all such phases; the direct, TMA and gathering wgmma kernels
// read unpacked filters from w through the phase's view), then per phase
// zeros where no tap reaches or its forward convolution. The phases write disjoint
// positions of dx, so their convolutions run concurrently, one a side
// stream: a small problem's phases each fill a fraction of the GPU (a
// stride-2 layer at batch 1 took four times one phase's time in turn).
int run_bwd_data(ConvDataPlan const& plan, ckfmha_conv_bwd_data_args const& args,
                 ckfmha_stream_t stream) {
  ckfmha_launch_context launch_context{};
  if (int s = begin_launch(&launch_context)) return s;
  std::vector<ConvPhaseFilter> filters;
  const int convolutions = conv_running_phases(plan.phases);
  for (auto const& ph : plan.phases) {
    if (ph.empty || reads_filter_view(ph, args.w)) continue;
    ConvPhaseFilter filter = ph.filter;
    filter.w = args.w;
    filter.dst = static_cast<char*>(args.workspace) + ph.filter_offset;
    filters.push_back(filter);
  }
  if (int r = launch_conv_phase_filters(filters.data(), int(filters.size()), stream)) {
    return from_launch_result(r, "conv phase filters");
  }
  StreamFork fork;
  if (convolutions > 1) {
    if (int r = fork_streams(stream, convolutions - 1, &fork)) {
      return from_launch_result(r, "conv phase streams");
    }
  }
  // Every side stream is joined again, whatever fails: a capture with an
  // unjoined stream cannot end.
  int status = 0;
  int next = 0;  // convolutions launched: the first on the caller's stream
  for (auto const& ph : plan.phases) {
    char* dx = static_cast<char*>(args.dx) + ph.dx_offset * 2;
    if (ph.empty) {
      status = zero_phase(ph, dx, stream);
    } else {
      const ckfmha_stream_t on = next == 0 ? stream : fork.side[(next - 1) % fork.count];
      ++next;
      ckfmha_launch_context phase_context = launch_context;
      phase_context.conv_concurrent = convolutions;
      const void* filter = static_cast<const char*>(args.workspace) + ph.filter_offset;
      if (reads_filter_view(ph, args.w)) {
        filter = args.w;
        phase_context.conv_filter_view = &ph.view;
      }
      ckfmha_conv_fwd_args fwd{args.dy, filter, dx, nullptr, 0};
      if (int r = ph.plan.kernel.launch(&ph.forward, &fwd, &phase_context, on)) {
        status = from_launch_result(r, ph.plan.kernel.name);
      }
    }
    if (status != 0) break;
  }
  if (convolutions > 1) {
    if (int r = join_streams(fork); r != 0 && status == 0) {
      status = from_launch_result(r, "conv phase streams");
    }
  }
  return status != 0 ? status : succeed();
}

// Zeros in a dense [groups, K, taps, C] dw: the gradient of an empty batch.
int zero_weights(ckfmha_conv_problem const& p, void* dw, ckfmha_stream_t stream) {
  ConvZeroFill zeros{};
  zeros.base = dw;
  for (int d = 0; d < 4; ++d) zeros.extent[d] = 1;
  zeros.row = int64_t(conv_weight_workspace_bytes(p) / sizeof(float));
  return from_launch_result(launch_conv_zero_fill(zeros, stream), "conv zeros");
}

}  // namespace

extern "C" {

int ckfmha_conv_bwd_data_run(const ckfmha_conv_problem* problem,
                             const ckfmha_conv_bwd_data_args* args, const char* kernel_name,
                             ckfmha_stream_t stream) {
  if (int s = checked_problem(problem)) return s;
  if (args == nullptr) return fail(CKFMHA_ERROR_INVALID_ARGUMENT, "args is NULL");
  if (std::string why = check_conv_bwd_data(*problem); !why.empty()) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT, why);
  }
  if (conv_output_rows(*problem) == 0) return succeed();
  if (int s = require_pointers({
          RequiredPointer{true, args->dy, "args.dy is NULL"},
          RequiredPointer{true, args->w, "args.w is NULL"},
          RequiredPointer{true, args->dx, "args.dx is NULL"},
      })) {
    return s;
  }
  if (int s = check_element_aligned({{args->dy, "dy"}, {args->w, "w"}, {args->dx, "dx"}})) {
    return s;
  }
  const size_t needed = conv_data_workspace_bytes(*problem);
  if (int s = check_workspace(args->workspace, args->workspace_bytes, needed, true)) return s;
  ckfmha_kernel_entry forced{};
  ConvPlanContext context;
  if (int s = forced_kernel(kernel_name, CKFMHA_FAMILY_CONV_FWD, "ckfmha_conv_bwd_data_run",
                            &forced, &context)) {
    return s;
  }
  if (int s = conv_context(-1, &context)) return s;
  ConvDataPlan plan = plan_conv_bwd_data(*Registry::instance().entries(), *problem, context,
                                         args->dy, args->workspace);
  if (!plan.found) return fail(CKFMHA_ERROR_UNSUPPORTED, plan.why);
  return run_bwd_data(plan, *args, stream);
}

int ckfmha_conv_bwd_weight_run(const ckfmha_conv_problem* problem,
                               const ckfmha_conv_bwd_weight_args* args, const char* kernel_name,
                               ckfmha_stream_t stream) {
  if (int s = checked_problem(problem)) return s;
  if (args == nullptr) return fail(CKFMHA_ERROR_INVALID_ARGUMENT, "args is NULL");
  if (int s = require_pointers({
          RequiredPointer{true, args->dw, "args.dw is NULL"},
          RequiredPointer{conv_output_rows(*problem) > 0, args->x, "args.x is NULL"},
          RequiredPointer{conv_output_rows(*problem) > 0, args->dy, "args.dy is NULL"},
      })) {
    return s;
  }
  if (int s = check_element_aligned({{args->x, "x"}, {args->dy, "dy"}, {args->dw, "dw"}})) {
    return s;
  }
  if (args->splits < 0 || args->splits > 65535) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT,
                "args.splits is " + std::to_string(args->splits) +
                    "; 0 (the plan's count) or 1 to 65535 CTAs sharing the reduction");
  }
  if (args->splits > 1 && args->workspace == nullptr) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT,
                "args.splits is " + std::to_string(args->splits) +
                    ": split plans add fp32 partial sums into the workspace, and none was given");
  }
  const size_t needed = conv_weight_workspace_bytes(*problem);
  // No workspace: a plan without splits (one CTA per output tile).
  if (int s = check_workspace(args->workspace, args->workspace_bytes, needed, false)) return s;
  if (conv_output_rows(*problem) == 0) return zero_weights(*problem, args->dw, stream);
  ckfmha_kernel_entry forced{};
  ConvPlanContext context;
  if (int s = forced_kernel(kernel_name, CKFMHA_FAMILY_CONV_BWD_WEIGHT,
                            "ckfmha_conv_bwd_weight_run", &forced, &context)) {
    return s;
  }
  if (int s = conv_context(-1, &context)) return s;
  context.vector = conv_weight_vector_allowed(*problem, args->x, args->dy);
  context.can_split = args->workspace != nullptr;
  ConvPlan plan =
      plan_conv(*Registry::instance().entries(), *problem, CKFMHA_CONV_BWD_WEIGHT, context);
  if (!plan.found) return fail(CKFMHA_ERROR_UNSUPPORTED, plan.why);
  if (args->splits != 0) plan.splits = args->splits;
  ckfmha_launch_context launch_context{};
  if (int s = begin_launch(&launch_context)) return s;
  // Split plans and the direct kernel add partial sums into the workspace,
  // except where the direct kernel's vector path sums a block of dw within
  // one CTA or a cluster and stores it (its launcher reads the same layout),
  // and where an implicit GEMM's splits sum within a cluster.
  const bool direct = plan.kernel.conv_max_channels != 0;
  const bool stores =
      direct ? conv_weight_direct_cluster(plan.kernel, *problem, args->x, args->dy,
                                          context.sm_count) > 0
             : conv_weight_gemm_cluster(plan.kernel, *problem, plan.splits,
                                        context.sm_count) > 0;
  const bool summed = !stores && (plan.splits > 1 || direct);
  float* sums = summed ? static_cast<float*>(args->workspace) : nullptr;
  const int64_t count = int64_t(needed / sizeof(float));
  if (sums != nullptr) {
    if (int r = zero_fp32(sums, count, stream)) return from_launch_result(r, "conv zeros");
  }
  ckfmha::kernel::ConvBwdWeightLaunch launch{args->x, args->dy, args->dw, sums, plan.splits,
                                             stores && !direct ? 1 : 0};
  if (int r = plan.kernel.launch(problem, &launch, &launch_context, stream)) {
    return from_launch_result(r, plan.kernel.name);
  }
  if (sums == nullptr) return succeed();
  return from_launch_result(
      launch_conv_convert_weights(sums, args->dw, problem->dtype, count, stream),
      "conv weight convert");
}

}  // extern "C"
