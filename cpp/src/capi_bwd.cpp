// The extern "C" surface of the backward plan (dot_do_o, dq_dk_dv,
// convert_dq): argument checks, then the three launches.
#include "ckfmha/ckfmha.h"

#include "ckfmha/kernel/params/bwd_workspace.h"
#include "ckfmha/runtime/bwd_plan.hpp"
#include "ckfmha/runtime/capi_support.hpp"
#include "ckfmha/runtime/device.hpp"
#include "ckfmha/runtime/device_errors.hpp"
#include "ckfmha/runtime/empty_problems.hpp"
#include "ckfmha/runtime/fwd_plan.hpp"
#include "ckfmha/runtime/problem.hpp"
#include "ckfmha/runtime/registry.hpp"
#include "ckfmha/runtime/selection_mode.hpp"
#include "ckfmha/runtime/status.hpp"

#include <cstdint>
#include <string>
#include <utility>

using namespace ckfmha::runtime;

namespace {

int checked_bwd_problem(ckfmha_bwd_problem const* problem) {
  return checked(problem, check_bwd_problem);
}

// `queries` and `keys`: whether any sequence has them; tensors of a side with none (group mode
// with a zero bound) are never read or written.
int check_bwd_pointers(ckfmha_bwd_problem const& p, ckfmha_bwd_args const& a, bool queries,
                       bool keys) {
  return require_pointers({
      RequiredPointer{queries, a.q, "q is NULL"},
      RequiredPointer{keys, a.k, "k is NULL"},
      RequiredPointer{keys, a.v, "v is NULL"},
      RequiredPointer{queries, a.o, "o is NULL"},
      RequiredPointer{queries, a.lse, "lse is NULL: the backward reads the forward's LSE"},
      RequiredPointer{queries, a.do_, "do_ (dO) is NULL"},
      RequiredPointer{queries, a.dq, "dq is NULL"},
      RequiredPointer{keys, a.dk, "dk is NULL"},
      RequiredPointer{keys, a.dv, "dv is NULL"},
      RequiredPointer{true, a.workspace,
                      "workspace is NULL: allocate ckfmha_bwd_workspace_size() bytes of device "
                      "memory"},
      RequiredPointer{p.bias == CKFMHA_BIAS_ELEMENTWISE, a.bias,
                      "elementwise bias needs args.bias"},
      RequiredPointer{bool(p.store_dbias), a.dbias, "store_dbias is set but args.dbias is NULL"},
      RequiredPointer{p.bias == CKFMHA_BIAS_ALIBI, a.alibi_slopes, "ALiBi needs args.alibi_slopes"},
      RequiredPointer{bool(p.has_sink), a.sink,
                      "has_sink is set but args.sink is NULL: the backward reads the forward's "
                      "sink logits, fp32 [nhead_q]"},
      RequiredPointer{p.mode == CKFMHA_MODE_GROUP, a.cu_seqlens_q,
                      "group mode needs args.cu_seqlens_q (batch + 1 int32 offsets)"},
      RequiredPointer{p.mode == CKFMHA_MODE_GROUP, a.cu_seqlens_k,
                      "group mode needs args.cu_seqlens_k (batch + 1 int32 offsets)"},
  });
}

// The plan's workspace; none for a problem no kernel runs.
size_t workspace_bytes(ckfmha_bwd_problem const& p) {
  if (bwd_run_work(p) != RunWork::kKernels) return 0;
  return size_t(ckfmha::kernel::bwd_workspace_layout(bwd_launch_problem(p)).bytes);
}

}  // namespace

namespace {

// The thread's selection mode and the SM count its cost features use: the
// current device's when it has `device_arch`, else the arch's reference part.
BwdSelection bwd_selection(int device_arch) {
  BwdSelection selection;
  selection.mode = current_selection();
  if (selection.mode == CKFMHA_SELECTION_HEURISTIC) return selection;
  // A count the device does not give leaves the reference part's: the cost
  // features only rank plans.
  planning_sm_count(device_arch, &selection.num_sms);
  return selection;
}

}  // namespace

extern "C" {

int ckfmha_bwd_problem_init(ckfmha_bwd_problem* problem, ckfmha_dtype dtype, ckfmha_layout layout,
                            int32_t batch, int32_t nhead_q, int32_t nhead_k, int32_t seqlen_q,
                            int32_t seqlen_k, int32_t hdim_q, int32_t hdim_v) {
  if (int s = require(problem != nullptr, "problem is NULL")) return s;
  ckfmha_fwd_problem forward{};
  if (int s = ckfmha_fwd_problem_init(&forward, dtype, layout, batch, nhead_q, nhead_k, seqlen_q,
                                      seqlen_k, hdim_q, hdim_v)) {
    return s;
  }
  *problem = ckfmha_bwd_problem{};
  problem->dtype = forward.dtype;
  problem->mode = forward.mode;
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
  problem->scale = forward.scale;
  problem->bias = CKFMHA_BIAS_NONE;
  for (int i = 0; i < 3; ++i) {
    problem->q_stride[i] = forward.q_stride[i];
    problem->k_stride[i] = forward.k_stride[i];
    problem->v_stride[i] = forward.v_stride[i];
    problem->o_stride[i] = forward.o_stride[i];
  }
  fill_layout_strides(layout, problem->do_stride, nhead_q, seqlen_q, hdim_v);
  fill_layout_strides(layout, problem->dq_stride, nhead_q, seqlen_q, hdim_q);
  fill_layout_strides(layout, problem->dk_stride, nhead_k, seqlen_k, hdim_q);
  fill_layout_strides(layout, problem->dv_stride, nhead_k, seqlen_k, hdim_v);
  problem->lse_stride[0] = forward.lse_stride[0];
  problem->lse_stride[1] = forward.lse_stride[1];
  problem->dbias_stride[2] = seqlen_k;
  problem->dbias_stride[1] = int64_t(seqlen_q) * seqlen_k;
  problem->dbias_stride[0] = int64_t(nhead_q) * seqlen_q * seqlen_k;
  return checked_bwd_problem(problem) == CKFMHA_SUCCESS ? succeed()
                                                         : CKFMHA_ERROR_INVALID_ARGUMENT;
}

int ckfmha_bwd_problem_validate(const ckfmha_bwd_problem* problem) {
  int s = checked_bwd_problem(problem);
  return s == CKFMHA_SUCCESS ? succeed() : s;
}

int ckfmha_bwd_workspace_size(const ckfmha_bwd_problem* problem, size_t* bytes) {
  if (int s = checked_bwd_problem(problem)) return s;
  if (int s = require(bytes != nullptr, "bytes is NULL")) return s;
  *bytes = workspace_bytes(*problem);
  return succeed();
}

int ckfmha_bwd_select(const ckfmha_bwd_problem* problem, int arch, char* names_buf,
                      size_t buf_len) {
  if (int s = checked_bwd_problem(problem)) return s;
  // A problem no kernel runs selects none: an empty list.
  if (bwd_run_work(*problem) != RunWork::kKernels) {
    return copy_text_out("", names_buf, buf_len, nullptr);
  }
  int device_arch = 0;
  if (int s = resolve_arch(arch, &device_arch)) return s;
  BwdPlan plan = select_bwd(*Registry::instance().entries(), bwd_launch_problem(*problem),
                            device_arch, nullptr, bwd_selection(device_arch));
  if (!plan.found) return fail(CKFMHA_ERROR_UNSUPPORTED, plan.why_none);
  std::string names = std::string(plan.dot_do_o.name) + "\n" + plan.dq_dk_dv.name + "\n" +
                      plan.convert_dq.name + "\n";
  return copy_text_out(names, names_buf, buf_len, nullptr);
}

int ckfmha_bwd_explain(const ckfmha_bwd_problem* problem, int arch, char* buf, size_t buf_len,
                       size_t* needed) {
  if (int s = checked_bwd_problem(problem)) return s;
  if (bwd_run_work(*problem) != RunWork::kKernels) {
    const char* why = bwd_run_work(*problem) == RunWork::kNothing
                          ? "no kernel runs: every gradient is empty"
                          : "no kernel runs: without queries (or keys) ckfmha_bwd_run sets the "
                            "non-empty gradients (dsink too, with sinks) to 0 with memsets";
    return copy_text_out(describe(*problem) + "\n" + why + "\n", buf, buf_len, needed);
  }
  int device_arch = 0;
  if (int s = resolve_arch(arch, &device_arch)) return s;
  return copy_text_out(
      explain_bwd(*Registry::instance().entries(), bwd_launch_problem(*problem), device_arch,
                  bwd_selection(device_arch)),
      buf, buf_len, needed);
}

int ckfmha_bwd_run(const ckfmha_bwd_problem* problem, const ckfmha_bwd_args* args,
                   const char* kernel_name, ckfmha_stream_t stream) {
  if (int s = checked_bwd_problem(problem)) return s;
  if (int s = require(args != nullptr, "args is NULL")) return s;
  // dsink [nhead_q] is written whatever else is empty.
  if (int s = require_pointers({RequiredPointer{
          bool(problem->has_sink), args->dsink,
          "has_sink is set but args.dsink is NULL: the backward writes the sink gradient, "
          "fp32 [nhead_q]"}})) {
    return s;
  }
  const RunWork work = bwd_run_work(*problem);
  if (work == RunWork::kNothing) return succeed();
  if (work == RunWork::kFill) {
    if (int s = require_pointers({
            // With sinks a batch of 0 fills dsink alone: the other gradients are empty.
            RequiredPointer{problem->batch > 0 && problem->seqlen_q > 0, args->dq, "dq is NULL"},
            RequiredPointer{problem->batch > 0 && problem->seqlen_k > 0, args->dk, "dk is NULL"},
            RequiredPointer{problem->batch > 0 && problem->seqlen_k > 0, args->dv, "dv is NULL"},
        })) {
      return s;
    }
    if (int s = zero_bwd_gradients(*problem, *args, stream)) return s;
    return succeed();
  }
  const bool queries = problem->seqlen_q > 0, keys = problem->seqlen_k > 0;
  // From here on the kernels' problem: zero length bounds raised to 1, and no
  // sink without queries (dsink is then 0, set by a memset before the kernels).
  const ckfmha_bwd_problem launch = bwd_launch_problem(*problem);
  const bool dsink_is_zero = problem->has_sink && !launch.has_sink;
  problem = &launch;
  if (int s = check_bwd_pointers(*problem, *args, queries, keys)) return s;
  if (problem->has_sink && (!aligned_to(args->sink, 4) || !aligned_to(args->dsink, 4))) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT,
                "args.sink and args.dsink must be 4-byte aligned (fp32 arrays)");
  }
  size_t needed = workspace_bytes(*problem);
  if (args->workspace_bytes < needed) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT,
                "workspace of " + std::to_string(args->workspace_bytes) + " bytes is too small; " +
                    std::to_string(needed) + " needed (ckfmha_bwd_workspace_size)");
  }
  for (auto [ptr, name] : {std::pair<const void*, const char*>{args->q, "q"},
                           {args->k, "k"},
                           {args->v, "v"},
                           {args->o, "o"},
                           {args->do_, "do"},
                           {args->dq, "dq"},
                           {args->dk, "dk"},
                           {args->dv, "dv"},
                           {args->workspace, "workspace"}}) {
    if (!aligned_to(ptr, 16)) {
      return fail(CKFMHA_ERROR_UNSUPPORTED,
                  std::string(name) + " is not 16-byte aligned; the backward kernels move "
                                      "16-byte vectors");
    }
  }
  int device_arch = 0;
  if (int s = current_device_arch(&device_arch)) return s;

  const Registry::Snapshot snapshot = Registry::instance().entries();
  auto const& kernels = *snapshot;
  ckfmha_kernel_entry forced{};
  if (kernel_name != nullptr) {
    if (!Registry::instance().find(kernel_name, &forced)) {
      return fail(CKFMHA_ERROR_NOT_FOUND, std::string("no registered kernel named ") + kernel_name);
    }
    if (forced.family != CKFMHA_FAMILY_BWD_DQ_DK_DV) {
      return fail(CKFMHA_ERROR_INVALID_ARGUMENT,
                  std::string("kernel ") + kernel_name + " is a " + family_name(forced.family) +
                      " kernel; ckfmha_bwd_run forces the bwd_dq_dk_dv stage");
    }
    std::string why = reject_reason_bwd(forced, *problem, device_arch);
    if (!why.empty()) {
      return fail(CKFMHA_ERROR_UNSUPPORTED,
                  std::string("kernel ") + kernel_name + " cannot run this problem: " + why);
    }
  }
  BwdPlan const& plan = cached_select_bwd(kernels, *problem, device_arch,
                                          kernel_name ? &forced : nullptr,
                                          bwd_selection(device_arch));
  if (!plan.found) return fail(CKFMHA_ERROR_UNSUPPORTED, plan.why_none);
  ckfmha_launch_context launch_context{};
  if (int s = begin_launch(&launch_context)) return s;
  if (dsink_is_zero) {
    if (int s = zero_bwd_dsink(*problem, *args, stream)) return s;
  }
  for (ckfmha_kernel_entry const* stage : {&plan.dot_do_o, &plan.dq_dk_dv, &plan.convert_dq}) {
    if (int s = from_launch_result(stage->launch(problem, args, &launch_context, stream),
                                   stage->name)) {
      return s;
    }
  }
  return succeed();
}

}  // extern "C"
