// Host-side launcher for one fwd_appendkv instance. The runtime has checked
// the problem, pointers and alignment before a launcher is chosen.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel/appendkv/kernel.cuh"
#include "ckfmha/kernel/common/launch.cuh"
#include "ckfmha/kernel/params/launch_context.h"
#include "ckfmha/kernel_entry.h"

#include <algorithm>
#include <cstdint>

namespace ckfmha::kernel {

inline void copy_strides(int64_t (&dst)[3], int64_t const (&src)[3]) {
  for (int i = 0; i < 3; ++i) dst[i] = src[i];
}

inline AppendKvParams make_appendkv_params(ckfmha_appendkv_problem const& pr,
                                           ckfmha_appendkv_args const& ar,
                                           ckfmha_launch_context const* context) {
  AppendKvParams p{};
  p.k_new = ar.k_new;
  p.v_new = ar.v_new;
  p.k_cache = ar.k_cache;
  p.v_cache = ar.v_cache;
  p.cache_seqlens = ar.cache_seqlens;
  p.block_table = ar.block_table;
  p.cos = ar.cos;
  p.sin = ar.sin;
  // A caller that passes no overflow flag learns of dropped tokens through
  // the device's error record instead, at its next call.
  DeviceErrors* errors = device_errors_of(context);
  p.overflow = ar.overflow != nullptr ? ar.overflow
               : errors != nullptr    ? &errors->append_position
                                      : nullptr;
  copy_strides(p.k_new_stride, pr.k_new_stride);
  copy_strides(p.v_new_stride, pr.v_new_stride);
  copy_strides(p.k_cache_stride, pr.k_cache_stride);
  copy_strides(p.v_cache_stride, pr.v_cache_stride);
  p.block_table_stride = pr.block_table_stride;
  p.cos_stride = pr.cos_stride;
  p.sin_stride = pr.sin_stride;
  p.capacity = pr.paged_kv ? int64_t(pr.max_pages_per_seq) * pr.page_size
                           : int64_t(pr.max_seqlen_cache);
  p.nhead_k = pr.nhead_k;
  p.seqlen_new = pr.seqlen_new;
  p.page_size = pr.paged_kv ? pr.page_size : 1;
  p.num_pages = pr.num_pages;
  p.vectorized_pages = pr.paged_kv && pr.page_layout == CKFMHA_PAGE_LAYOUT_VECTORIZED;
  p.rotary_dim = pr.rope == CKFMHA_ROPE_NONE ? 0 : pr.rotary_dim;
  p.rope_max_pos = pr.rope_max_pos;
  p.rope_fp32 = pr.rope_dtype == CKFMHA_DTYPE_FP32;
  p.k_scale_ptr = ar.k_scale;
  p.v_scale_ptr = ar.v_scale;
  p.k_scale = pr.k_scale;
  p.v_scale = pr.v_scale;
  p.scale_per_head = pr.scale_per_head != 0;
  if (pr.rotate_q) {
    p.q = ar.q;
    p.q_out = ar.q_out;
    p.nhead_q = pr.nhead_q;
    p.seqlen_q = pr.seqlen_q;
    copy_strides(p.q_stride, pr.q_stride);
    copy_strides(p.q_out_stride, pr.q_out_stride);
  }
  return p;
}

template <class Traits>
int launch_fwd_appendkv(void const* problem, void const* args,
    ckfmha_launch_context const* context, ckfmha_stream_t stream) {
  auto const& pr = *static_cast<ckfmha_appendkv_problem const*>(problem);
  auto const& ar = *static_cast<ckfmha_appendkv_args const*>(args);
  const AppendKvParams params = make_appendkv_params(pr, ar, context);
  const int rows = std::max(params.seqlen_new, params.nhead_q > 0 ? params.seqlen_q : 0);
  dim3 grid(unsigned((rows + Traits::kTokensPerCta - 1) / Traits::kTokensPerCta),
            unsigned(params.nhead_k + params.nhead_q), unsigned(pr.batch));
  return launch_kernel(&fwd_appendkv_kernel<Traits>, grid, Traits::kThreads, 0, stream, params);
}

}  // namespace ckfmha::kernel
