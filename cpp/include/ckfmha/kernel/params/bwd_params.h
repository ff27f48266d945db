// Device-side parameters of the three backward stages, built by the launchers
// from a ckfmha_bwd_problem. Offsets are 64-bit: batch*stride alone can pass 2^31.
#pragma once

#include "ckfmha/kernel/params/device_errors.h"

#include <cstdint>

namespace ckfmha::kernel {

struct BwdParams {
  const void* q;
  const void* k;
  const void* v;
  const void* o;
  const void* dout;
  const float* lse;
  void* dq;
  void* dk;
  void* dv;
  const void* bias;
  void* dbias;
  const float* alibi_slopes;
  const float* sink;  // has_sink: the forward's sink logits [nhead_q]
  float* dsink;       // has_sink: their gradient [nhead_q]; null: not asked for
  const int32_t* cu_seqlens_q;  // group mode: sequence starts, batch + 1 entries
  const int32_t* cu_seqlens_k;
  DeviceErrors* errors;  // where out-of-range device metadata is reported
  // Workspace. Each region is indexed by (batch or sequence, query head, local
  // row) with workspace_rows rows per head: seqlen_q (the longest sequence in
  // group mode) rounded up to a whole 64-row block.
  float* delta;     // D = rowsum(dO * O): [batch, nhead_q, workspace_rows]
  float* lse_log2;  // LSE * log2(e), +inf where LSE is -inf or past the rows: same shape
  float* dq_accum;  // [dq_splits, batch, nhead_q, workspace_rows, hdim_q], unscaled dS K

  int64_t q_batch_stride, q_head_stride, q_row_stride;
  int64_t k_batch_stride, k_head_stride, k_row_stride;
  int64_t v_batch_stride, v_head_stride, v_row_stride;
  int64_t o_batch_stride, o_head_stride, o_row_stride;
  int64_t do_batch_stride, do_head_stride, do_row_stride;
  int64_t dq_batch_stride, dq_head_stride, dq_row_stride;
  int64_t dk_batch_stride, dk_head_stride, dk_row_stride;
  int64_t dv_batch_stride, dv_head_stride, dv_row_stride;
  int64_t lse_batch_stride, lse_head_stride;
  int64_t bias_batch_stride, bias_head_stride, bias_row_stride;
  int64_t dbias_batch_stride, dbias_head_stride, dbias_row_stride;
  int64_t alibi_batch_stride;
  int64_t dq_accum_split_stride;  // elements between dQ slices (deterministic mode)

  int32_t batch;
  int32_t seqlen_q;  // batch mode: the length; group mode: the longest sequence
  int32_t workspace_rows;
  int32_t seqlen_k;
  int32_t nhead_q;
  int32_t head_group;  // nhead_q / nhead_k: query heads sharing one K/V head
  int32_t hdim_q;
  int32_t hdim_v;
  int32_t skip_min_seqlen_q;  // always 0: the backward visits every sequence
  // Group mode: rows of the packed tensors, against which every cu_seqlens
  // range is checked (the workspace rows too: no sequence passes seqlen_q).
  int64_t total_q, total_k;
  int32_t dq_splits;          // 1 in fast mode
  int32_t deterministic;

  float scale;
  float scale_log2;
  float softcap;
  float softcap_prescale;

  int32_t window_left;
  int32_t window_right;
  int32_t bottom_right;

  uint32_t dropout_threshold;
  float dropout_rescale;
  uint32_t philox_key0, philox_key1;
  uint32_t philox_offset;
};

}  // namespace ckfmha::kernel
