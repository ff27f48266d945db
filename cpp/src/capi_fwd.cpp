// The extern "C" surface of the forward (one stage, split-KV and paged plans):
// argument checks, then the plan and its launches.
#include "ckfmha/ckfmha.h"

#include "ckfmha/runtime/capi_support.hpp"
#include "ckfmha/runtime/device.hpp"
#include "ckfmha/runtime/device_errors.hpp"
#include "ckfmha/runtime/empty_problems.hpp"
#include "ckfmha/runtime/fwd_plan.hpp"
#include "ckfmha/runtime/problem.hpp"
#include "ckfmha/runtime/registry.hpp"
#include "ckfmha/runtime/selection_mode.hpp"
#include "ckfmha/runtime/selection_model.hpp"
#include "ckfmha/runtime/status.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

using namespace ckfmha::runtime;

namespace {

int checked_problem(ckfmha_fwd_problem const* problem) {
  return checked(problem, check_fwd_problem);
}

// Pointers each enabled feature needs, so a kernel never dereferences NULL.
int check_feature_pointers(ckfmha_fwd_problem const& p, ckfmha_fwd_args const& a) {
  return require_pointers({
      RequiredPointer{bool(p.store_lse), a.lse, "store_lse is set but lse is NULL"},
      RequiredPointer{p.bias == CKFMHA_BIAS_ELEMENTWISE, a.bias,
                      "elementwise bias needs args.bias"},
      RequiredPointer{p.bias == CKFMHA_BIAS_ALIBI, a.alibi_slopes, "ALiBi needs args.alibi_slopes"},
      RequiredPointer{bool(p.has_sink), a.sink, "has_sink is set but args.sink is NULL"},
      RequiredPointer{p.mode == CKFMHA_MODE_GROUP, a.cu_seqlens_q,
                      "group mode needs args.cu_seqlens_q (batch + 1 int32 offsets)"},
      RequiredPointer{p.mode == CKFMHA_MODE_GROUP && p.kv_storage == CKFMHA_KV_CONTIGUOUS,
                      a.cu_seqlens_k,
                      "group mode needs args.cu_seqlens_k (batch + 1 int32 offsets)"},
      RequiredPointer{bool(p.store_dropout_randval), a.dropout_randval,
                      "store_dropout_randval is set but args.dropout_randval is NULL"},
      RequiredPointer{p.kv_storage == CKFMHA_KV_PAGED_TABLE, a.block_table,
                      "kv_storage paged_table needs args.block_table ([batch, block_table_stride] "
                      "int32 page ids)"},
      RequiredPointer{p.kv_storage == CKFMHA_KV_PAGED_TABLE, a.seqlens_k,
                      "kv_storage paged_table needs args.seqlens_k ([batch] int32 key counts)"},
      RequiredPointer{p.kv_storage == CKFMHA_KV_PAGED_INDPTR, a.kv_indices,
                      "kv_storage paged_indptr needs args.kv_indices (int32 page ids)"},
      RequiredPointer{p.kv_storage == CKFMHA_KV_PAGED_INDPTR, a.kv_indptr,
                      "kv_storage paged_indptr needs args.kv_indptr (batch + 1 int32 offsets)"},
  });
}

// The arch plans are made for and its SM count: the current device's when it
// has that arch, else the arch's reference part (documented in ckfmha.h).
int plan_context(int arch, PlanContext* context) {
  if (int s = resolve_arch(arch, &context->device_arch)) return s;
  context->selection = current_selection();
  context->selection_generation = selection_generation();
  return planning_sm_count(context->device_arch, &context->num_sms, &context->live_device);
}

// A kernel forced by name (NULL: none) joins the plan context.
int find_forced(const char* kernel_name, ckfmha_kernel_entry* forced, PlanContext* context) {
  if (kernel_name == nullptr) return CKFMHA_SUCCESS;
  if (!Registry::instance().find(kernel_name, forced)) {
    return fail(CKFMHA_ERROR_NOT_FOUND, std::string("no registered kernel named ") + kernel_name);
  }
  context->forced = forced;
  return CKFMHA_SUCCESS;
}

// A split-KV plan's workspace must exist, be large enough and hold float4s
// (a one-split plan needs none).
int check_workspace(FwdPlan const& plan, ckfmha_fwd_args const& args) {
  if (!plan.combined()) return CKFMHA_SUCCESS;
  std::string need = std::to_string(plan.workspace_bytes) + " bytes (num_splits=" +
                     std::to_string(plan.num_splits) + "; ckfmha_fwd_workspace_size says how many)";
  if (args.workspace == nullptr) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT,
                "the split-KV plan needs args.workspace of " + need);
  }
  if (args.workspace_bytes < plan.workspace_bytes) {
    return fail(CKFMHA_ERROR_BUFFER_TOO_SMALL,
                "args.workspace_bytes is " + std::to_string(args.workspace_bytes) +
                    "; the split-KV plan needs " + need);
  }
  if (reinterpret_cast<uintptr_t>(args.workspace) % 16 != 0) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT, "args.workspace must be 16-byte aligned");
  }
  return CKFMHA_SUCCESS;
}

// What select and explain say of a problem no kernel runs (see "Empty problems" in ckfmha.h).
std::string no_kernel_reason(ckfmha_fwd_problem const& p) {
  return fwd_run_work(p) == RunWork::kNothing
             ? "no kernel runs: every output is empty"
             : "no kernel runs: without keys, ckfmha_fwd_run sets O to 0 and the LSE to -inf "
               "(the sink with sinks) with memsets";
}

}  // namespace

extern "C" {

int ckfmha_fwd_problem_init(ckfmha_fwd_problem* problem, ckfmha_dtype dtype, ckfmha_layout layout,
                            int32_t batch, int32_t nhead_q, int32_t nhead_k, int32_t seqlen_q,
                            int32_t seqlen_k, int32_t hdim_q, int32_t hdim_v) {
  if (int s = require(problem != nullptr, "problem is NULL")) return s;
  if (layout != CKFMHA_LAYOUT_BHSD && layout != CKFMHA_LAYOUT_BSHD) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT,
                "layout " + std::to_string(int(layout)) + " is not one of BHSD (0), BSHD (1)");
  }
  *problem = ckfmha_fwd_problem{};
  problem->dtype = dtype;
  problem->mode = CKFMHA_MODE_BATCH;
  problem->batch = batch;
  problem->nhead_q = nhead_q;
  problem->nhead_k = nhead_k;
  problem->seqlen_q = seqlen_q;
  problem->seqlen_k = seqlen_k;
  problem->hdim_q = hdim_q;
  problem->hdim_v = hdim_v;
  problem->mask = CKFMHA_MASK_NONE;
  problem->window_left = -1;
  problem->window_right = -1;
  problem->bias = CKFMHA_BIAS_NONE;
  problem->lse_stride[0] = int64_t(nhead_q) * seqlen_q;
  problem->lse_stride[1] = seqlen_q;
  problem->scale = hdim_q > 0 ? 1.f / std::sqrt(float(hdim_q)) : 1.f;
  problem->k_scale = 1.f;
  problem->v_scale = 1.f;
  problem->q_quant = CKFMHA_KV_QUANT_NONE;
  problem->q_scale = 1.f;
  fill_layout_strides(layout, problem->q_stride, nhead_q, seqlen_q, hdim_q);
  fill_layout_strides(layout, problem->k_stride, nhead_k, seqlen_k, hdim_q);
  fill_layout_strides(layout, problem->v_stride, nhead_k, seqlen_k, hdim_v);
  fill_layout_strides(layout, problem->o_stride, nhead_q, seqlen_q, hdim_v);
  return checked_problem(problem) == CKFMHA_SUCCESS ? succeed() : CKFMHA_ERROR_INVALID_ARGUMENT;
}

int ckfmha_fwd_problem_validate(const ckfmha_fwd_problem* problem) {
  int s = checked_problem(problem);
  return s == CKFMHA_SUCCESS ? succeed() : s;
}

int ckfmha_fwd_select(const ckfmha_fwd_problem* problem, int arch, char* name_buf,
                      size_t buf_len) {
  if (int s = checked_problem(problem)) return s;
  // A problem no kernel runs selects none: an empty name.
  if (fwd_run_work(*problem) != RunWork::kKernels) {
    return copy_text_out("", name_buf, buf_len, nullptr);
  }
  PlanContext context;
  if (int s = plan_context(arch, &context)) return s;
  FwdPlan plan = plan_fwd(*Registry::instance().entries(), fwd_launch_problem(*problem), context);
  if (!plan.found) return fail(CKFMHA_ERROR_UNSUPPORTED, plan.why);
  return copy_text_out(plan.kernel.name, name_buf, buf_len, nullptr);
}

int ckfmha_fwd_explain(const ckfmha_fwd_problem* problem, int arch, char* buf, size_t buf_len,
                       size_t* needed) {
  if (int s = checked_problem(problem)) return s;
  if (fwd_run_work(*problem) != RunWork::kKernels) {
    return copy_text_out(describe(*problem) + "\n" + no_kernel_reason(*problem) + "\n", buf,
                         buf_len, needed);
  }
  PlanContext context;
  if (int s = plan_context(arch, &context)) return s;
  return copy_text_out(
      explain_fwd_plan(*Registry::instance().entries(), fwd_launch_problem(*problem), context), buf,
      buf_len, needed);
}

int ckfmha_fwd_workspace_size(const ckfmha_fwd_problem* problem, int arch,
                              const char* kernel_name, size_t* bytes) {
  if (int s = checked_problem(problem)) return s;
  if (int s = require(bytes != nullptr, "bytes is NULL")) return s;
  if (fwd_run_work(*problem) != RunWork::kKernels) {
    *bytes = 0;
    return succeed();
  }
  PlanContext context;
  if (int s = plan_context(arch, &context)) return s;
  ckfmha_kernel_entry forced{};
  if (int s = find_forced(kernel_name, &forced, &context)) return s;
  FwdPlan const& plan =
      cached_plan_fwd(*Registry::instance().entries(), fwd_launch_problem(*problem), context);
  if (!plan.found) return fail(CKFMHA_ERROR_UNSUPPORTED, plan.why);
  *bytes = plan.workspace_bytes;
  return succeed();
}

int ckfmha_fwd_run(const ckfmha_fwd_problem* problem, const ckfmha_fwd_args* args,
                   const char* kernel_name, ckfmha_stream_t stream) {
  if (int s = checked_problem(problem)) return s;
  if (int s = require(args != nullptr, "args is NULL")) return s;
  const RunWork work = fwd_run_work(*problem);
  if (work == RunWork::kNothing) return succeed();
  if (work == RunWork::kFill) {
    if (int s = require_pointers({
            RequiredPointer{true, args->o, "o must be a device pointer"},
            RequiredPointer{bool(problem->store_lse), args->lse,
                            "store_lse is set but lse is NULL"},
            RequiredPointer{bool(problem->has_sink), args->sink,
                            "has_sink is set but args.sink is NULL"},
        })) {
      return s;
    }
    if (int s = fill_fwd_without_keys(*problem, *args, stream)) return s;
    return succeed();
  }
  // Without keys (every sequence's key range empty) k and v are never read.
  const bool reads_keys = problem->seqlen_k > 0;
  // From here on the kernels' problem: zero length bounds raised to 1.
  const ckfmha_fwd_problem launch = fwd_launch_problem(*problem);
  problem = &launch;
  if (args->q == nullptr || args->o == nullptr ||
      (reads_keys && (args->k == nullptr || args->v == nullptr))) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT, "q, k, v and o must all be device pointers");
  }
  if (int s = check_feature_pointers(*problem, *args)) return s;
  if (int s = check_fp8_scale_pointers(
          problem->kv_quant != CKFMHA_KV_QUANT_NONE, problem->kv_scale_per_head != 0,
          args->k_scale, args->v_scale, "K/V are not quantised (kv_quant none)",
          "kv_scale_per_head")) {
    return s;
  }
  if (int s = check_fp8_query_scale_pointer(problem->q_quant != CKFMHA_KV_QUANT_NONE,
                                            args->q_scale)) {
    return s;
  }
  if (problem->fp8_block_scales &&
      (args->q_scale == nullptr || args->k_scale == nullptr || args->v_scale == nullptr)) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT,
                "per-block scales (fp8_block_scales) need args.q_scale, args.k_scale and "
                "args.v_scale, device arrays of one fp32 scale per 128-token block of each "
                "head");
  }
  PlanContext context;
  if (int s = plan_context(-1, &context)) return s;
  context.workspace_available = args->workspace != nullptr;
  ckfmha_kernel_entry forced{};
  if (int s = find_forced(kernel_name, &forced, &context)) return s;
  // A copy: the cache's entry may be replaced by a plan made while launching.
  const FwdPlan plan = cached_plan_fwd(*Registry::instance().entries(), *problem, context);
  if (!plan.found) return fail(CKFMHA_ERROR_UNSUPPORTED, plan.why);
  if (int s = check_workspace(plan, *args)) return s;
  // Column-major V kernels fall back to element loads when V's base is not
  // 16-byte aligned (a view starting at any key): V needs only aligned elements.
  const uintptr_t v_alignment = problem->v_col_major ? 2 : 16;
  for (auto [ptr, bytes] : {std::pair<const void*, uintptr_t>{args->q, 16},
                            {args->k, 16},
                            {args->v, v_alignment},
                            {args->o, 16}}) {
    if (!aligned_to(ptr, bytes)) {
      return fail(CKFMHA_ERROR_UNSUPPORTED,
                  "q, k, o and row-major v must be 16-byte aligned (the kernels load 16-byte "
                  "vectors); column-major v must be aligned to its elements");
    }
  }
  ckfmha_launch_context launch_context{};
  if (int s = begin_launch(&launch_context)) return s;
  if (!plan.split) {
    return from_launch_result(plan.kernel.launch(problem, args, &launch_context, stream),
                              plan.kernel.name);
  }
  // Both stages read the resolved split count from the problem.
  ckfmha_fwd_problem staged = *problem;
  staged.num_splits = plan.num_splits;
  if (int s = from_launch_result(plan.kernel.launch(&staged, args, &launch_context, stream), plan.kernel.name)) {
    return s;
  }
  if (!plan.combined()) return CKFMHA_SUCCESS;  // the one split wrote O and LSE
  return from_launch_result(plan.combine.launch(&staged, args, &launch_context, stream), plan.combine.name);
}

}  // extern "C"
