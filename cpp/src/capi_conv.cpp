// The extern "C" surface of grouped convolution: argument checks, then the
// plan and its one launch.
#include "ckfmha/ckfmha.h"

#include "ckfmha/runtime/capi_support.hpp"
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

int checked_problem(ckfmha_conv_problem const* problem) {
  return checked(problem, check_conv_problem);
}

// The arch plans are made for and its SM count (planning_sm_count).
int conv_context(int arch, ConvPlanContext* context) {
  if (int s = resolve_arch(arch, &context->device_arch)) return s;
  return planning_sm_count(context->device_arch, &context->sm_count);
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
  // An empty output selects no kernel: an empty name.
  if (conv_output_rows(*problem) == 0) return copy_text_out("", name_buf, buf_len, nullptr);
  ConvPlanContext context;
  if (int s = conv_context(arch, &context)) return s;
  context.vector = conv_vector_allowed(*problem, nullptr, nullptr);
  ConvPlan plan = plan_conv(*Registry::instance().entries(), *problem, direction, context);
  if (!plan.found) return fail(CKFMHA_ERROR_UNSUPPORTED, plan.why);
  return copy_text_out(plan.kernel.name, name_buf, buf_len, nullptr);
}

int ckfmha_conv_explain(const ckfmha_conv_problem* problem, ckfmha_conv_direction direction,
                        int arch, char* buf, size_t buf_len, size_t* needed) {
  if (int s = checked_problem(problem)) return s;
  if (conv_output_rows(*problem) == 0) {
    return copy_text_out(describe(*problem) + "\nno kernel runs: the batch is empty\n", buf,
                         buf_len, needed);
  }
  ConvPlanContext context;
  if (int s = conv_context(arch, &context)) return s;
  context.vector = conv_vector_allowed(*problem, nullptr, nullptr);
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
  for (auto [ptr, name] : {std::pair{static_cast<const void*>(args->x), "x"},
                           std::pair{static_cast<const void*>(args->w), "w"},
                           std::pair{static_cast<const void*>(args->y), "y"}}) {
    if (!aligned_to(ptr, 2)) {
      return fail(CKFMHA_ERROR_INVALID_ARGUMENT,
                  std::string("args.") + name + " is not aligned to its 2-byte elements");
    }
  }
  ckfmha_kernel_entry forced{};
  ConvPlanContext context;
  if (kernel_name != nullptr) {
    if (int s = find_forced_of_family(kernel_name, CKFMHA_FAMILY_CONV_FWD, "ckfmha_conv_fwd_run",
                                      &forced)) {
      return s;
    }
    context.forced = &forced;
  }
  if (int s = conv_context(-1, &context)) return s;
  context.vector = conv_vector_allowed(*problem, args->x, args->w);
  ConvPlan plan =
      plan_conv(*Registry::instance().entries(), *problem, CKFMHA_CONV_FWD, context);
  if (!plan.found) return fail(CKFMHA_ERROR_UNSUPPORTED, plan.why);
  ckfmha_launch_context launch_context{};
  if (int s = begin_launch(&launch_context)) return s;
  return from_launch_result(plan.kernel.launch(problem, args, &launch_context, stream),
                            plan.kernel.name);
}

}  // extern "C"
