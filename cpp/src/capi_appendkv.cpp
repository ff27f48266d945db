// The extern "C" surface of the fwd_appendkv family: argument checks, then the
// plan and its one launch.
#include "ckfmha/ckfmha.h"

#include "ckfmha/runtime/appendkv_plan.hpp"
#include "ckfmha/runtime/capi_support.hpp"
#include "ckfmha/runtime/device.hpp"
#include "ckfmha/runtime/device_errors.hpp"
#include "ckfmha/runtime/empty_problems.hpp"
#include "ckfmha/runtime/problem.hpp"
#include "ckfmha/runtime/registry.hpp"
#include "ckfmha/runtime/status.hpp"

#include <cstdint>
#include <cstring>
#include <string>

using namespace ckfmha::runtime;

namespace {

int checked_problem(ckfmha_appendkv_problem const* problem) {
  return checked(problem, check_appendkv_problem);
}

int check_pointers(ckfmha_appendkv_problem const& p, ckfmha_appendkv_args const& a) {
  return require_pointers({
      RequiredPointer{p.seqlen_new > 0, a.k_new, "k_new is NULL"},
      RequiredPointer{p.seqlen_new > 0, a.v_new, "v_new is NULL"},
      RequiredPointer{true, a.k_cache, "k_cache is NULL"},
      RequiredPointer{true, a.v_cache, "v_cache is NULL"},
      RequiredPointer{true, a.cache_seqlens,
                      "cache_seqlens is NULL: the kernel reads the lengths (int32 [batch]) from "
                      "device memory"},
      RequiredPointer{bool(p.paged_kv), a.block_table,
                      "a paged cache needs args.block_table (int32 [batch, max_pages_per_seq])"},
      RequiredPointer{p.rope != CKFMHA_ROPE_NONE, a.cos, "RoPE needs args.cos"},
      RequiredPointer{p.rope != CKFMHA_ROPE_NONE, a.sin, "RoPE needs args.sin"},
      RequiredPointer{p.rotate_q && p.seqlen_q > 0, a.q, "rotate_q is set but args.q is NULL"},
      RequiredPointer{p.rotate_q && p.seqlen_q > 0, a.q_out,
                      "rotate_q is set but args.q_out is NULL (pass q itself to rotate in place)"},
  });
}

int check_alignment(ckfmha_appendkv_problem const& p, ckfmha_appendkv_args const& a) {
  struct Aligned {
    const void* ptr;
    uintptr_t bytes;
    const char* name;
  };
  const uintptr_t angle_bytes = p.rope_dtype == CKFMHA_DTYPE_FP32 ? 4 : 2;
  for (auto [ptr, bytes, name] : {Aligned{a.k_new, 16, "k_new"},
                                  Aligned{a.v_new, 16, "v_new"},
                                  Aligned{a.k_cache, 16, "k_cache"},
                                  Aligned{a.v_cache, 16, "v_cache"},
                                  Aligned{a.q, 16, "q"},
                                  Aligned{a.q_out, 16, "q_out"},
                                  Aligned{a.cache_seqlens, 4, "cache_seqlens"},
                                  Aligned{a.block_table, 4, "block_table"},
                                  Aligned{a.overflow, 4, "overflow"},
                                  Aligned{a.cos, angle_bytes, "cos"},
                                  Aligned{a.sin, angle_bytes, "sin"}}) {
    if (ptr != nullptr && !aligned_to(ptr, bytes)) {
      return fail(CKFMHA_ERROR_UNSUPPORTED,
                  std::string(name) + " is not " + std::to_string(bytes) +
                      "-byte aligned; the append kernel moves 16-byte vectors of k/v/q and "
                      "reads the other tensors by element");
    }
  }
  return CKFMHA_SUCCESS;
}

void fill_strides(ckfmha_layout layout, int64_t (&stride)[3], int64_t heads, int64_t seqlen,
                  int64_t hdim) {
  const bool bhsd = layout == CKFMHA_LAYOUT_BHSD;
  stride[0] = heads * seqlen * hdim;
  stride[1] = bhsd ? seqlen * hdim : hdim;
  stride[2] = bhsd ? hdim : heads * hdim;
}

}  // namespace

extern "C" {

int ckfmha_appendkv_problem_init(ckfmha_appendkv_problem* problem, ckfmha_dtype dtype,
                                 ckfmha_layout cache_layout, int32_t batch, int32_t nhead_k,
                                 int32_t seqlen_new, int32_t max_seqlen_cache, int32_t hdim_k,
                                 int32_t hdim_v) {
  if (problem == nullptr) return fail(CKFMHA_ERROR_INVALID_ARGUMENT, "problem is NULL");
  if (cache_layout != CKFMHA_LAYOUT_BHSD && cache_layout != CKFMHA_LAYOUT_BSHD) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT, "cache layout " + std::to_string(int(cache_layout)) +
                                                   " is not one of BHSD (0), BSHD (1)");
  }
  *problem = ckfmha_appendkv_problem{};
  problem->dtype = dtype;
  problem->batch = batch;
  problem->nhead_k = nhead_k;
  problem->seqlen_new = seqlen_new;
  problem->hdim_k = hdim_k;
  problem->hdim_v = hdim_v;
  problem->max_seqlen_cache = max_seqlen_cache;
  problem->rope = CKFMHA_ROPE_NONE;
  problem->rope_dtype = CKFMHA_DTYPE_FP32;
  problem->k_scale = 1.f;
  problem->v_scale = 1.f;
  fill_strides(CKFMHA_LAYOUT_BSHD, problem->k_new_stride, nhead_k, seqlen_new, hdim_k);
  fill_strides(CKFMHA_LAYOUT_BSHD, problem->v_new_stride, nhead_k, seqlen_new, hdim_v);
  fill_strides(cache_layout, problem->k_cache_stride, nhead_k, max_seqlen_cache, hdim_k);
  fill_strides(cache_layout, problem->v_cache_stride, nhead_k, max_seqlen_cache, hdim_v);
  return checked_problem(problem) == CKFMHA_SUCCESS ? succeed() : CKFMHA_ERROR_INVALID_ARGUMENT;
}

int ckfmha_appendkv_problem_validate(const ckfmha_appendkv_problem* problem) {
  int s = checked_problem(problem);
  return s == CKFMHA_SUCCESS ? succeed() : s;
}

int ckfmha_appendkv_select(const ckfmha_appendkv_problem* problem, int arch, char* name_buf,
                           size_t buf_len) {
  if (int s = checked_problem(problem)) return s;
  // An empty append selects no kernel: an empty name.
  if (appendkv_run_work(*problem) == RunWork::kNothing) {
    return copy_text_out("", name_buf, buf_len, nullptr);
  }
  int device_arch = 0;
  if (int s = resolve_arch(arch, &device_arch)) return s;
  AppendKvPlan plan = plan_appendkv(*Registry::instance().entries(), *problem, device_arch);
  if (!plan.found) return fail(CKFMHA_ERROR_UNSUPPORTED, plan.why);
  return copy_text_out(plan.kernel.name, name_buf, buf_len, nullptr);
}

int ckfmha_appendkv_explain(const ckfmha_appendkv_problem* problem, int arch, char* buf,
                            size_t buf_len, size_t* needed) {
  if (int s = checked_problem(problem)) return s;
  if (appendkv_run_work(*problem) == RunWork::kNothing) {
    return copy_text_out(describe(*problem) + "\nno kernel runs: there is nothing to append or "
                                              "rotate\n",
                         buf, buf_len, needed);
  }
  int device_arch = 0;
  if (int s = resolve_arch(arch, &device_arch)) return s;
  return copy_text_out(explain_appendkv(*Registry::instance().entries(), *problem, device_arch), buf,
                   buf_len, needed);
}

int ckfmha_appendkv_run(const ckfmha_appendkv_problem* problem, const ckfmha_appendkv_args* args,
                        const char* kernel_name, ckfmha_stream_t stream) {
  if (int s = checked_problem(problem)) return s;
  if (args == nullptr) return fail(CKFMHA_ERROR_INVALID_ARGUMENT, "args is NULL");
  if (appendkv_run_work(*problem) == RunWork::kNothing) return succeed();
  if (int s = check_pointers(*problem, *args)) return s;
  // Host-visible lengths are checked before anything touches the device.
  if (std::string error = check_appendkv_lengths(*problem, args->cache_seqlens_host);
      !error.empty()) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT, error);
  }
  if (int s = check_fp8_scale_pointers(
          problem->cache_quant != CKFMHA_KV_QUANT_NONE, problem->scale_per_head != 0,
          args->k_scale, args->v_scale, "the caches are not fp8 (cache_quant none)",
          "scale_per_head")) {
    return s;
  }
  if (int s = check_alignment(*problem, *args)) return s;
  ckfmha_kernel_entry forced{};
  if (kernel_name != nullptr) {
    if (int s = find_forced_of_family(kernel_name, CKFMHA_FAMILY_FWD_APPENDKV,
                                       "ckfmha_appendkv_run", &forced)) {
      return s;
    }
  }
  int device_arch = 0;
  if (int s = current_device_arch(&device_arch)) return s;
  AppendKvPlan plan = plan_appendkv(*Registry::instance().entries(), *problem, device_arch,
                                    kernel_name != nullptr ? &forced : nullptr);
  if (!plan.found) return fail(CKFMHA_ERROR_UNSUPPORTED, plan.why);
  ckfmha_launch_context launch_context{};
  if (int s = begin_launch(&launch_context)) return s;
  return from_launch_result(plan.kernel.launch(problem, args, &launch_context, stream),
                            plan.kernel.name);
}

}  // extern "C"
