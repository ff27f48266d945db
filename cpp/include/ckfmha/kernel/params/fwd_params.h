// Device-side parameters of one forward launch, built by the launcher from a
// ckfmha_fwd_problem. Offsets are 64-bit: batch*stride alone can pass 2^31.
#pragma once

#include "ckfmha/kernel/params/device_errors.h"

#include <cstdint>

namespace ckfmha::kernel {

struct FwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;  // written only when the kernel has LSE and this is non-null
  const void* bias;
  const float* alibi_slopes;
  const float* sink;
  const int32_t* cu_seqlens_q;  // group mode: sequence starts, batch + 1 entries
  const int32_t* cu_seqlens_k;
  uint8_t* dropout_randval;     // optional [batch, nhead_q, seqlen_q, seqlen_k]
  DeviceErrors* errors;         // where out-of-range device metadata is reported

  int64_t q_batch_stride, q_head_stride, q_row_stride;
  int64_t k_batch_stride, k_head_stride, k_row_stride;
  int64_t v_batch_stride, v_head_stride, v_row_stride;
  int64_t o_batch_stride, o_head_stride, o_row_stride;
  int64_t lse_batch_stride, lse_head_stride;
  int64_t bias_batch_stride, bias_head_stride, bias_row_stride;
  int64_t alibi_batch_stride;

  int32_t seqlen_q;  // batch mode: the length; group mode: the longest sequence
  int32_t seqlen_k;
  int32_t nhead_q;
  int32_t head_group;  // nhead_q / nhead_k: query heads sharing one K/V head
  int32_t skip_min_seqlen_q;
  // Group mode: rows of the packed q/o and k/v tensors; every sequence range
  // read from cu_seqlens is checked against them before it is followed.
  int64_t total_q, total_k;

  float scale;       // softmax scale (natural-log domain)
  float scale_log2;  // scale * log2(e): plain kernels exponentiate raw scores with exp2
  float softcap;            // cap; logits = cap * tanh(scale * s / cap)
  float softcap_prescale;   // scale / cap

  // Visible keys for query i: [i + offset - left, i + offset + right], a
  // negative bound meaning unbounded; offset = 0 or seqlen_k - seqlen_q.
  int32_t window_left;
  int32_t window_right;
  int32_t bottom_right;

  uint32_t dropout_threshold;  // drop iff random byte < threshold (floor(p * 256))
  float dropout_rescale;       // 1 / (1 - p)
  uint32_t philox_key0, philox_key1;
  uint32_t philox_offset;

  // Split-KV plans only (fwd_splitkv writes, fwd_splitkv_combine reads): fp32
  // partial results in the caller's workspace, see splitkv_workspace.h.
  float* partial_o;
  float* partial_lse;
  int32_t num_splits;
  int32_t batch;

  // Paged K/V (fwd_pagedkv, batch_prefill; common/paged_kv.cuh): k/v are page caches
  // and k/v_batch_stride their page strides. Pages come from block_table
  // (vLLM, row b at b * block_table_stride, max_pages_per_seq entries) or,
  // when kv_indptr is set, from kv_indices[kv_indptr[b] .. kv_indptr[b + 1]).
  const int32_t* block_table;
  const int32_t* kv_indices;
  const int32_t* kv_indptr;
  const int32_t* seqlens_k;  // keys per sequence; null: every key of its pages
  int64_t block_table_stride;
  int64_t num_kv_indices;  // entries of kv_indices: kv_indptr ranges are checked against it
  int32_t num_pages;       // pages in the caches: every page id is checked against it
  int32_t max_pages_per_seq;
  int32_t page_size_log2;

  // fp8 K/V (Traits::kKvFp8): k and v are e4m3 bytes standing for scale *
  // value. A kernel reads its K/V head's scales from the device arrays (one
  // value, or one per K/V head) when given, else the scalars.
  const float* k_scale_ptr;
  const float* v_scale_ptr;
  float k_scale, v_scale;
  int32_t kv_scale_per_head;
  // fp8 queries (the Hopper fp8 forward): q is e4m3 bytes standing for
  // scale * value; the device array has one value, or one per query head.
  const float* q_scale_ptr;
  float q_scale;
  // Per-block scales (fp8 queries): the three device arrays hold one scale
  // per 128 tokens of a head, [batch][head][blocks] with these block counts.
  int32_t fp8_block_scales;
  int32_t fp8_q_scale_blocks;
  int32_t fp8_kv_scale_blocks;
};

}  // namespace ckfmha::kernel
