// The extern "C" surface of grouped convolution: argument checks, then the
// plan and its launches (one for the forward; the backward plans' stages in
// order on the caller's stream).
#include "ckfmha/ckfmha.h"

#include "ckfmha/kernel/params/conv_params.h"

#include "ckfmha/runtime/capi_conv_support.hpp"
#include "ckfmha/runtime/capi_support.hpp"
#include "ckfmha/runtime/conv_aux_kernels.hpp"
#include "ckfmha/runtime/conv_bwd_plan.hpp"
#include "ckfmha/runtime/conv_fwd_plan.hpp"
#include "ckfmha/runtime/conv_plan.hpp"
#include "ckfmha/runtime/device.hpp"
#include "ckfmha/runtime/device_errors.hpp"
#include "ckfmha/runtime/fwd_plan.hpp"
#include "ckfmha/runtime/problem.hpp"
#include "ckfmha/runtime/registry.hpp"
#include "ckfmha/runtime/status.hpp"

#include <cstdint>
#include <string>

using namespace ckfmha::runtime;

namespace {

// The channel vector a single-kernel direction's tensors allow (backward-data
// works it out per phase).
int32_t direction_vector(ckfmha_conv_problem const& p, ckfmha_conv_direction direction,
                         const void* a, const void* b) {
  return direction == CKFMHA_CONV_BWD_WEIGHT ? conv_weight_vector_allowed(p, a, b)
                                             : conv_vector_allowed(p, a, b);
}

// The first phase a kernel runs, or null when no tap reaches any position.
ConvDataPhase const* first_running_phase(ConvDataPlan const& plan) {
  for (auto const& ph : plan.phases) {
    if (!ph.empty) return &ph;
  }
  return nullptr;
}

void dense_strides(int64_t (&stride)[4], int32_t dims, int32_t const (&extent)[3],
                   int64_t channels) {
  int64_t step = channels;
  for (int i = dims - 1; i >= 0; --i) {
    stride[1 + i] = step;
    step *= extent[i];
  }
  stride[0] = step;
}

// The first `dims` entries of `given`, or `fallback` in every dim when NULL;
// unused dims get the fallback too.
void copy_dims(int32_t (&out)[3], const int32_t* given, int32_t dims, int32_t fallback) {
  for (int i = 0; i < 3; ++i) out[i] = given != nullptr && i < dims ? given[i] : fallback;
}

}  // namespace

extern "C" {

int ckfmha_conv_problem_init(ckfmha_conv_problem* problem, ckfmha_dtype dtype,
                             int32_t spatial_dims, int32_t batch, int32_t groups,
                             int32_t in_channels, int32_t out_channels, const int32_t* input,
                             const int32_t* filter, const int32_t* stride,
                             const int32_t* padding, const int32_t* dilation) {
  if (problem == nullptr) return fail(CKFMHA_ERROR_INVALID_ARGUMENT, "problem is NULL");
  if (spatial_dims != 2 && spatial_dims != 3) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT,
                "spatial_dims " + std::to_string(spatial_dims) +
                    " is not supported; supported: 2 (NHWGC) and 3 (NDHWGC)");
  }
  if (input == nullptr || filter == nullptr) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT,
                "input and filter are required: spatial_dims sizes each");
  }
  ckfmha_conv_problem p{};
  p.dtype = dtype;
  p.spatial_dims = spatial_dims;
  p.batch = batch;
  p.groups = groups;
  p.in_channels = in_channels;
  p.out_channels = out_channels;
  copy_dims(p.input, input, spatial_dims, 1);
  copy_dims(p.filter, filter, spatial_dims, 1);
  copy_dims(p.stride, stride, spatial_dims, 1);
  copy_dims(p.padding, padding, spatial_dims, 0);
  copy_dims(p.dilation, dilation, spatial_dims, 1);
  for (int i = 0; i < spatial_dims; ++i) {
    const int64_t span = int64_t(p.dilation[i]) * (p.filter[i] - 1) + 1;
    const int64_t padded = int64_t(p.input[i]) + 2 * int64_t(p.padding[i]);
    // Left for the check below to explain when the filter does not fit.
    p.output[i] = p.stride[i] > 0 && padded >= span ? int32_t((padded - span) / p.stride[i] + 1)
                                                     : 0;
  }
  for (int i = spatial_dims; i < 3; ++i) p.output[i] = 1;
  dense_strides(p.x_stride, spatial_dims, p.input, int64_t(groups) * in_channels);
  dense_strides(p.y_stride, spatial_dims, p.output, int64_t(groups) * out_channels);
  *problem = p;
  return checked_problem(problem) == CKFMHA_SUCCESS ? succeed() : CKFMHA_ERROR_INVALID_ARGUMENT;
}

int ckfmha_conv_problem_validate(const ckfmha_conv_problem* problem) {
  int s = checked_problem(problem);
  return s == CKFMHA_SUCCESS ? succeed() : s;
}

int ckfmha_conv_select(const ckfmha_conv_problem* problem, ckfmha_conv_direction direction,
                       int arch, char* name_buf, size_t buf_len) {
  if (int s = checked_problem(problem)) return s;
  if (int s = checked_direction(direction)) return s;
  // An empty output selects no kernel: an empty name.
  if (conv_output_rows(*problem) == 0) return copy_text_out("", name_buf, buf_len, nullptr);
  ConvPlanContext context;
  if (int s = conv_context(arch, &context)) return s;
  if (direction == CKFMHA_CONV_FWD) {
    ConvFwdPlan plan = plan_conv_fwd(*Registry::instance().entries(), *problem, context, nullptr,
                                     nullptr, nullptr, true);
    if (!plan.plan.found) return fail(CKFMHA_ERROR_UNSUPPORTED, plan.plan.why);
    return copy_text_out(plan.plan.kernel.name, name_buf, buf_len, nullptr);
  }
  if (direction == CKFMHA_CONV_BWD_DATA) {
    // The kernel of the first phase that runs one (every phase when forced).
    ConvDataPlan plan = plan_conv_bwd_data(*Registry::instance().entries(), *problem, context,
                                           nullptr, nullptr);
    if (!plan.found) return fail(CKFMHA_ERROR_UNSUPPORTED, plan.why);
    ConvDataPhase const* phase = first_running_phase(plan);
    return copy_text_out(phase ? phase->plan.kernel.name : "", name_buf, buf_len, nullptr);
  }
  context.vector = direction_vector(*problem, direction, nullptr, nullptr);
  ConvPlan plan = plan_conv(*Registry::instance().entries(), *problem, direction, context);
  if (!plan.found) return fail(CKFMHA_ERROR_UNSUPPORTED, plan.why);
  return copy_text_out(plan.kernel.name, name_buf, buf_len, nullptr);
}

int ckfmha_conv_explain(const ckfmha_conv_problem* problem, ckfmha_conv_direction direction,
                        int arch, char* buf, size_t buf_len, size_t* needed) {
  if (int s = checked_problem(problem)) return s;
  if (int s = checked_direction(direction)) return s;
  if (conv_output_rows(*problem) == 0) {
    return copy_text_out(describe(*problem) + "\nno kernel runs: the batch is empty" +
                             (direction == CKFMHA_CONV_BWD_WEIGHT ? " (dw is zeroed)\n" : "\n"),
                         buf, buf_len, needed);
  }
  ConvPlanContext context;
  if (int s = conv_context(arch, &context)) return s;
  if (direction == CKFMHA_CONV_FWD) {
    return copy_text_out(explain_conv_fwd(*Registry::instance().entries(), *problem, context),
                         buf, buf_len, needed);
  }
  if (direction == CKFMHA_CONV_BWD_DATA) {
    return copy_text_out(
        explain_conv_bwd_data(*Registry::instance().entries(), *problem, context), buf, buf_len,
        needed);
  }
  context.vector = direction_vector(*problem, direction, nullptr, nullptr);
  return copy_text_out(
      explain_conv(*Registry::instance().entries(), *problem, direction, context), buf, buf_len,
      needed);
}

int ckfmha_conv_fwd_run(const ckfmha_conv_problem* problem, const ckfmha_conv_fwd_args* args,
                        const char* kernel_name, ckfmha_stream_t stream) {
  if (int s = checked_problem(problem)) return s;
  if (args == nullptr) return fail(CKFMHA_ERROR_INVALID_ARGUMENT, "args is NULL");
  if (conv_output_rows(*problem) == 0) return succeed();
  if (int s = require_pointers({
          RequiredPointer{true, args->x, "args.x is NULL"},
          RequiredPointer{true, args->w, "args.w is NULL"},
          RequiredPointer{true, args->y, "args.y is NULL"},
      })) {
    return s;
  }
  if (int s = check_element_aligned({{args->x, "x"}, {args->w, "w"}, {args->y, "y"}})) return s;
  ckfmha_kernel_entry forced{};
  ConvPlanContext context;
  if (int s = forced_kernel(kernel_name, CKFMHA_FAMILY_CONV_FWD, "ckfmha_conv_fwd_run", &forced,
                            &context)) {
    return s;
  }
  if (int s = conv_context(-1, &context)) return s;
  const size_t needed = conv_fwd_workspace_bytes(*problem, context.device_arch);
  if (int s = check_workspace(args->workspace, args->workspace_bytes, needed, false)) return s;
  const bool has_workspace = needed > 0 && args->workspace != nullptr;
  ConvFwdPlan plan = plan_conv_fwd(*Registry::instance().entries(), *problem, context, args->x,
                                   args->w, args->workspace, has_workspace);
  if (!plan.plan.found) return fail(CKFMHA_ERROR_UNSUPPORTED, plan.plan.why);
  ckfmha_launch_context launch_context{};
  if (int s = begin_launch(&launch_context)) return s;
  ckfmha_conv_fwd_args run{args->x, args->w, args->y, nullptr, 0};
  if (plan.pack > 1) {
    ConvPackedFilter filter{};
    filter.w = args->w;
    filter.dst = args->workspace;
    filter.groups = problem->groups;
    filter.in_channels = problem->in_channels;
    filter.out_channels = problem->out_channels;
    filter.taps = conv_filter_taps(*problem);
    filter.pack = plan.pack;
    if (int r = launch_conv_packed_filter(filter, stream)) {
      return from_launch_result(r, "conv packed filter");
    }
    run.w = args->workspace;
  }
  return from_launch_result(plan.plan.kernel.launch(&plan.problem, &run, &launch_context, stream),
                            plan.plan.kernel.name);
}

int ckfmha_conv_workspace_size(const ckfmha_conv_problem* problem,
                               ckfmha_conv_direction direction, int arch, size_t* bytes) {
  if (int s = checked_problem(problem)) return s;
  if (int s = checked_direction(direction)) return s;
  if (bytes == nullptr) return fail(CKFMHA_ERROR_INVALID_ARGUMENT, "bytes is NULL");
  *bytes = 0;
  // The backward passes' sizes do not depend on the arch; the forward packs
  // only where the TMA template runs.
  if (direction == CKFMHA_CONV_FWD) {
    int device_arch = 0;
    if (int s = resolve_arch(arch, &device_arch)) return s;
    *bytes = conv_fwd_workspace_bytes(*problem, device_arch);
  }
  if (direction == CKFMHA_CONV_BWD_DATA) *bytes = conv_data_workspace_bytes(*problem);
  if (direction == CKFMHA_CONV_BWD_WEIGHT) *bytes = conv_weight_workspace_bytes(*problem);
  return succeed();
}

}  // extern "C"
