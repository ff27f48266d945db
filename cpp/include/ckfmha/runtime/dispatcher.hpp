// Selection rules every operation's plan shares (fwd_select, fwd_plan,
// bwd_plan, appendkv_plan): hard rules reject kernels that cannot run a
// problem, then a preference order picks among the rest.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel_entry.h"

#include <cstdint>
#include <string>

namespace ckfmha::runtime {

// Can SASS built for `kernel_arch` (e.g. 80, 90 with the "a" suffix in
// arch_name) run on a device of `device_arch`?
bool arch_runs_on(ckfmha_kernel_entry const& kernel, int device_arch);

// Kernels move 16-byte vectors: the elements of `dtype` in one.
int64_t vector_elems(ckfmha_dtype dtype);

// "sm_90" for 90.
std::string arch_label(int arch);

// Empty when each of the (batch, head, seq) strides of `tensor` is a multiple
// of `vector` elements, else which one is not.
std::string check_vector_strides(const char* tensor, int64_t const (&stride)[3], int64_t vector);

// Whether a kernel of mask kind `kind` computes `mask` (a window kernel
// computes every bounded mask, causal ones too).
bool mask_fits(ckfmha_mask_kind kind, ckfmha_mask mask);

// The narrowest mask kind computing `mask`, preferred among kernels that fit.
ckfmha_mask_kind preferred_mask_kind(ckfmha_mask mask);
bool mask_kind_preferred(ckfmha_mask_kind kind, ckfmha_mask mask);

// Higher is faster where kernels of several templates fit.
int pipeline_rank(const char* pipeline);

// Kernels whose TMA descriptors span the packed tokens of a group-mode
// problem (the sm90 forward and backward) need the token counts, within the
// descriptors' 32-bit coordinates: why the problem's counts do not serve
// `kernel`, or empty when they do (or the kernel does not need them).
std::string packed_token_counts_problem(ckfmha_kernel_entry const& kernel, ckfmha_mode mode,
                                        int64_t total_q, int64_t total_k);

}  // namespace ckfmha::runtime
