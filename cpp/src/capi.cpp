// The extern "C" surface: argument checks, then calls into the runtime.
// Every entry point returns a ckfmha_status and leaves a message on failure.
#include "ckfmha/ckfmha.h"

#include "ckfmha/kernel/bwd_workspace.h"
#include "ckfmha/runtime/capi_support.hpp"
#include "ckfmha/runtime/device.hpp"
#include "ckfmha/runtime/dispatcher.hpp"
#include "ckfmha/runtime/fwd_plan.hpp"
#include "ckfmha/runtime/problem.hpp"
#include "ckfmha/runtime/registry.hpp"
#include "ckfmha/runtime/status.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <utility>

using namespace ckfmha::runtime;

namespace {

int require(bool ok, const char* what) {
  return ok ? CKFMHA_SUCCESS : fail(CKFMHA_ERROR_INVALID_ARGUMENT, what);
}

int checked_problem(ckfmha_fwd_problem const* problem) {
  if (problem == nullptr) return fail(CKFMHA_ERROR_INVALID_ARGUMENT, "problem is NULL");
  std::string error = check_fwd_problem(*problem);
  return error.empty() ? CKFMHA_SUCCESS : fail(CKFMHA_ERROR_INVALID_ARGUMENT, error);
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
  int count = 0, device_arch_now = 0;
  context->num_sms = reference_sm_count(context->device_arch);
  if (device_count(&count) == CKFMHA_SUCCESS && count > 0 &&
      current_device_arch(&device_arch_now) == CKFMHA_SUCCESS &&
      device_arch_now == context->device_arch) {
    if (int s = current_device_sm_count(&context->num_sms)) return s;
  }
  return CKFMHA_SUCCESS;
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

bool aligned_to(const void* ptr, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

int checked_bwd_problem(ckfmha_bwd_problem const* problem) {
  if (problem == nullptr) return fail(CKFMHA_ERROR_INVALID_ARGUMENT, "problem is NULL");
  std::string error = check_bwd_problem(*problem);
  return error.empty() ? CKFMHA_SUCCESS : fail(CKFMHA_ERROR_INVALID_ARGUMENT, error);
}

void fill_layout_strides(ckfmha_layout layout, int64_t (&stride)[3], int64_t heads,
                         int64_t seqlen, int64_t hdim) {
  bool bhsd = layout == CKFMHA_LAYOUT_BHSD;
  stride[0] = heads * seqlen * hdim;
  stride[1] = bhsd ? seqlen * hdim : hdim;
  stride[2] = bhsd ? hdim : heads * hdim;
}

int check_bwd_pointers(ckfmha_bwd_problem const& p, ckfmha_bwd_args const& a) {
  struct Need {
    bool needed;
    const void* ptr;
    const char* message;
  };
  for (auto [needed, ptr, message] : {
           Need{true, a.q, "q is NULL"},
           Need{true, a.k, "k is NULL"},
           Need{true, a.v, "v is NULL"},
           Need{true, a.o, "o is NULL"},
           Need{true, a.lse, "lse is NULL: the backward reads the forward's LSE"},
           Need{true, a.do_, "do_ (dO) is NULL"},
           Need{true, a.dq, "dq is NULL"},
           Need{true, a.dk, "dk is NULL"},
           Need{true, a.dv, "dv is NULL"},
           Need{true, a.workspace,
                "workspace is NULL: allocate ckfmha_bwd_workspace_size() bytes of device memory"},
           Need{p.bias == CKFMHA_BIAS_ELEMENTWISE, a.bias, "elementwise bias needs args.bias"},
           Need{bool(p.store_dbias), a.dbias, "store_dbias is set but args.dbias is NULL"},
           Need{p.bias == CKFMHA_BIAS_ALIBI, a.alibi_slopes, "ALiBi needs args.alibi_slopes"},
           Need{p.mode == CKFMHA_MODE_GROUP, a.cu_seqlens_q,
                "group mode needs args.cu_seqlens_q (batch + 1 int32 offsets)"},
           Need{p.mode == CKFMHA_MODE_GROUP, a.cu_seqlens_k,
                "group mode needs args.cu_seqlens_k (batch + 1 int32 offsets)"},
       }) {
    if (needed && ptr == nullptr) return fail(CKFMHA_ERROR_INVALID_ARGUMENT, message);
  }
  return CKFMHA_SUCCESS;
}

}  // namespace

extern "C" {

const char* ckfmha_last_error(void) { return last_error(); }

const char* ckfmha_status_name(int status) {
  switch (status) {
    case CKFMHA_SUCCESS: return "CKFMHA_SUCCESS";
    case CKFMHA_ERROR_INVALID_ARGUMENT: return "CKFMHA_ERROR_INVALID_ARGUMENT";
    case CKFMHA_ERROR_UNSUPPORTED: return "CKFMHA_ERROR_UNSUPPORTED";
    case CKFMHA_ERROR_CUDA: return "CKFMHA_ERROR_CUDA";
    case CKFMHA_ERROR_NO_DEVICE: return "CKFMHA_ERROR_NO_DEVICE";
    case CKFMHA_ERROR_BUFFER_TOO_SMALL: return "CKFMHA_ERROR_BUFFER_TOO_SMALL";
    case CKFMHA_ERROR_NOT_FOUND: return "CKFMHA_ERROR_NOT_FOUND";
    case CKFMHA_ERROR_INTERNAL: return "CKFMHA_ERROR_INTERNAL";
  }
  return "CKFMHA_UNKNOWN_STATUS";
}

int ckfmha_version(int* major, int* minor, int* patch) {
  if (major) *major = CKFMHA_VERSION_MAJOR;
  if (minor) *minor = CKFMHA_VERSION_MINOR;
  if (patch) *patch = CKFMHA_VERSION_PATCH;
  return succeed();
}

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
  auto fill = [layout](int64_t (&stride)[3], int64_t heads, int64_t seqlen, int64_t hdim) {
    bool bhsd = layout == CKFMHA_LAYOUT_BHSD;
    stride[0] = heads * seqlen * hdim;
    stride[1] = bhsd ? seqlen * hdim : hdim;
    stride[2] = bhsd ? hdim : heads * hdim;
  };
  fill(problem->q_stride, nhead_q, seqlen_q, hdim_q);
  fill(problem->k_stride, nhead_k, seqlen_k, hdim_q);
  fill(problem->v_stride, nhead_k, seqlen_k, hdim_v);
  fill(problem->o_stride, nhead_q, seqlen_q, hdim_v);
  return checked_problem(problem) == CKFMHA_SUCCESS ? succeed() : CKFMHA_ERROR_INVALID_ARGUMENT;
}

int ckfmha_fwd_problem_validate(const ckfmha_fwd_problem* problem) {
  int s = checked_problem(problem);
  return s == CKFMHA_SUCCESS ? succeed() : s;
}

int ckfmha_device_count(int* count) {
  if (int s = require(count != nullptr, "count is NULL")) return s;
  return device_count(count);
}

int ckfmha_device_arch(int device, int* arch) {
  if (int s = require(arch != nullptr, "arch is NULL")) return s;
  int count = 0;
  if (int s = device_count(&count)) return s;
  if (device < 0 || device >= count) {
    return fail(count == 0 ? CKFMHA_ERROR_NO_DEVICE : CKFMHA_ERROR_INVALID_ARGUMENT,
                "device " + std::to_string(device) + " does not exist; " + std::to_string(count) +
                    " CUDA device(s) visible");
  }
  return device_arch(device, arch);
}

int ckfmha_current_device(int* device) {
  if (int s = require(device != nullptr, "device is NULL")) return s;
  int count = 0;
  if (int s = device_count(&count)) return s;
  if (count == 0) return fail(CKFMHA_ERROR_NO_DEVICE, "no CUDA device is visible");
  return current_device(device);
}

int ckfmha_registry_count(int* count) {
  if (int s = require(count != nullptr, "count is NULL")) return s;
  *count = int(Registry::instance().entries().size());
  return succeed();
}

int ckfmha_registry_name(int index, char* buf, size_t buf_len) {
  auto entries = Registry::instance().entries();
  if (index < 0 || index >= int(entries.size())) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT, "kernel index " + std::to_string(index) +
                                                   " out of range [0, " +
                                                   std::to_string(entries.size()) + ")");
  }
  return copy_text_out(entries[index].name, buf, buf_len, nullptr);
}

int ckfmha_registry_json(char* buf, size_t buf_len, size_t* needed) {
  return copy_text_out(Registry::instance().to_json(), buf, buf_len, needed);
}

int ckfmha_registry_load_module(const char* path, int* added) { return load_module(path, added); }

int ckfmha_fwd_select(const ckfmha_fwd_problem* problem, int arch, char* name_buf,
                      size_t buf_len) {
  if (int s = checked_problem(problem)) return s;
  PlanContext context;
  if (int s = plan_context(arch, &context)) return s;
  FwdPlan plan = plan_fwd(Registry::instance().entries(), *problem, context);
  if (!plan.found) return fail(CKFMHA_ERROR_UNSUPPORTED, plan.why);
  return copy_text_out(plan.kernel.name, name_buf, buf_len, nullptr);
}

int ckfmha_fwd_explain(const ckfmha_fwd_problem* problem, int arch, char* buf, size_t buf_len,
                       size_t* needed) {
  if (int s = checked_problem(problem)) return s;
  PlanContext context;
  if (int s = plan_context(arch, &context)) return s;
  return copy_text_out(explain_fwd_plan(Registry::instance().entries(), *problem, context), buf,
                  buf_len, needed);
}

int ckfmha_fwd_workspace_size(const ckfmha_fwd_problem* problem, int arch,
                              const char* kernel_name, size_t* bytes) {
  if (int s = checked_problem(problem)) return s;
  if (int s = require(bytes != nullptr, "bytes is NULL")) return s;
  PlanContext context;
  if (int s = plan_context(arch, &context)) return s;
  ckfmha_kernel_entry forced{};
  if (int s = find_forced(kernel_name, &forced, &context)) return s;
  FwdPlan const& plan = cached_plan_fwd(Registry::instance().entries(), *problem, context);
  if (!plan.found) return fail(CKFMHA_ERROR_UNSUPPORTED, plan.why);
  *bytes = plan.workspace_bytes;
  return succeed();
}

int ckfmha_fwd_run(const ckfmha_fwd_problem* problem, const ckfmha_fwd_args* args,
                   const char* kernel_name, ckfmha_stream_t stream) {
  if (int s = checked_problem(problem)) return s;
  if (int s = require(args != nullptr, "args is NULL")) return s;
  if (args->q == nullptr || args->k == nullptr || args->v == nullptr || args->o == nullptr) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT, "q, k, v and o must all be device pointers");
  }
  if (int s = check_feature_pointers(*problem, *args)) return s;
  PlanContext context;
  if (int s = plan_context(-1, &context)) return s;
  context.workspace_available = args->workspace != nullptr;
  ckfmha_kernel_entry forced{};
  if (int s = find_forced(kernel_name, &forced, &context)) return s;
  // A copy: the cache's entry may be replaced by a plan made while launching.
  const FwdPlan plan = cached_plan_fwd(Registry::instance().entries(), *problem, context);
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
  if (!plan.split) {
    return from_launch_result(plan.kernel.launch(problem, args, stream), plan.kernel.name);
  }
  // Both stages read the resolved split count from the problem.
  ckfmha_fwd_problem staged = *problem;
  staged.num_splits = plan.num_splits;
  if (int s = from_launch_result(plan.kernel.launch(&staged, args, stream), plan.kernel.name)) {
    return s;
  }
  if (!plan.combined()) return CKFMHA_SUCCESS;  // the one split wrote O and LSE
  return from_launch_result(plan.combine.launch(&staged, args, stream), plan.combine.name);
}

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
  *bytes = size_t(ckfmha::kernel::bwd_workspace_layout(*problem).bytes);
  return succeed();
}

int ckfmha_bwd_select(const ckfmha_bwd_problem* problem, int arch, char* names_buf,
                      size_t buf_len) {
  if (int s = checked_bwd_problem(problem)) return s;
  int device_arch = 0;
  if (int s = resolve_arch(arch, &device_arch)) return s;
  BwdPlan plan = select_bwd(Registry::instance().entries(), *problem, device_arch);
  if (!plan.found) return fail(CKFMHA_ERROR_UNSUPPORTED, plan.why_none);
  std::string names = std::string(plan.dot_do_o.name) + "\n" + plan.dq_dk_dv.name + "\n" +
                      plan.convert_dq.name + "\n";
  return copy_text_out(names, names_buf, buf_len, nullptr);
}

int ckfmha_bwd_explain(const ckfmha_bwd_problem* problem, int arch, char* buf, size_t buf_len,
                       size_t* needed) {
  if (int s = checked_bwd_problem(problem)) return s;
  int device_arch = 0;
  if (int s = resolve_arch(arch, &device_arch)) return s;
  return copy_text_out(explain_bwd(Registry::instance().entries(), *problem, device_arch), buf,
                  buf_len, needed);
}

int ckfmha_bwd_run(const ckfmha_bwd_problem* problem, const ckfmha_bwd_args* args,
                   const char* kernel_name, ckfmha_stream_t stream) {
  if (int s = checked_bwd_problem(problem)) return s;
  if (int s = require(args != nullptr, "args is NULL")) return s;
  if (int s = check_bwd_pointers(*problem, *args)) return s;
  size_t needed = size_t(ckfmha::kernel::bwd_workspace_layout(*problem).bytes);
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

  auto kernels = Registry::instance().entries();
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
  BwdPlan plan = select_bwd(kernels, *problem, device_arch, kernel_name ? &forced : nullptr);
  if (!plan.found) return fail(CKFMHA_ERROR_UNSUPPORTED, plan.why_none);
  for (ckfmha_kernel_entry const* stage : {&plan.dot_do_o, &plan.dq_dk_dv, &plan.convert_dq}) {
    if (int s = from_launch_result(stage->launch(problem, args, stream), stage->name)) return s;
  }
  return succeed();
}

}  // extern "C"
