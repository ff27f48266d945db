// Device-side parameters of one forward launch, built by the launcher from a
// ckfmha_fwd_problem. Offsets are 64-bit: batch*stride alone can pass 2^31.
#pragma once

#include <cstdint>

namespace ckfmha::kernel {

struct FwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;  // [batch, nhead_q, seqlen_q], written only when the kernel has LSE and it is non-null

  int64_t q_batch_stride, q_head_stride, q_row_stride;
  int64_t k_batch_stride, k_head_stride, k_row_stride;
  int64_t v_batch_stride, v_head_stride, v_row_stride;
  int64_t o_batch_stride, o_head_stride, o_row_stride;

  int32_t seqlen_q;
  int32_t seqlen_k;
  int32_t nhead_q;
  int32_t head_group;  // nhead_q / nhead_k: query heads sharing one K/V head

  float scale;       // softmax scale (natural-log domain, for the LSE)
  float scale_log2;  // scale * log2(e): the kernel exponentiates with exp2

  // Causal: key j is visible to query i iff j <= i + causal_offset
  // (0 = top-left aligned, seqlen_k - seqlen_q = bottom-right aligned).
  int32_t causal_offset;
};

}  // namespace ckfmha::kernel
