// Host side: the device parameters of a forward launch from the C API's
// problem and argument structs; shared by every forward launcher so each
// pipeline reads the problem the same way.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel/params/fwd_params.h"
#include "ckfmha/kernel/params/launch_context.h"
#include "ckfmha/kernel/params/problem_scalars.h"

#include <cstdint>

namespace ckfmha::kernel {

inline FwdParams make_fwd_params(ckfmha_fwd_problem const& problem, ckfmha_fwd_args const& args,
                                 ckfmha_launch_context const* context) {
  FwdParams p{};
  p.errors = device_errors_of(context);
  p.q = args.q;
  p.k = args.k;
  p.v = args.v;
  p.o = args.o;
  p.lse = problem.store_lse ? args.lse : nullptr;
  p.bias = args.bias;
  p.alibi_slopes = args.alibi_slopes;
  p.sink = args.sink;
  p.cu_seqlens_q = args.cu_seqlens_q;
  p.cu_seqlens_k = args.cu_seqlens_k;
  p.dropout_randval = problem.store_dropout_randval ? args.dropout_randval : nullptr;
  p.q_batch_stride = problem.q_stride[0];
  p.q_head_stride = problem.q_stride[1];
  p.q_row_stride = problem.q_stride[2];
  p.k_batch_stride = problem.k_stride[0];
  p.k_head_stride = problem.k_stride[1];
  p.k_row_stride = problem.k_stride[2];
  p.v_batch_stride = problem.v_stride[0];
  p.v_head_stride = problem.v_stride[1];
  p.v_row_stride = problem.v_stride[2];
  p.o_batch_stride = problem.o_stride[0];
  p.o_head_stride = problem.o_stride[1];
  p.o_row_stride = problem.o_stride[2];
  p.lse_batch_stride = problem.lse_stride[0];
  p.lse_head_stride = problem.lse_stride[1];
  p.bias_batch_stride = problem.bias_stride[0];
  p.bias_head_stride = problem.bias_stride[1];
  p.bias_row_stride = problem.bias_stride[2];
  p.alibi_batch_stride = problem.alibi_stride;
  p.seqlen_q = problem.seqlen_q;
  p.seqlen_k = problem.seqlen_k;
  p.nhead_q = problem.nhead_q;
  p.head_group = problem.nhead_q / problem.nhead_k;
  p.skip_min_seqlen_q = problem.skip_min_seqlen_q;
  p.total_q = problem.total_q;
  p.total_k = problem.total_k;
  p.k_scale_ptr = args.k_scale;
  p.v_scale_ptr = args.v_scale;
  p.k_scale = problem.k_scale;
  p.v_scale = problem.v_scale;
  p.kv_scale_per_head = problem.kv_scale_per_head;
  p.q_scale_ptr = args.q_scale;
  p.q_scale = problem.q_scale;
  p.fp8_block_scales = problem.fp8_block_scales;
  p.fp8_q_scale_blocks = CKFMHA_FP8_SCALE_BLOCKS(problem.seqlen_q);
  p.fp8_kv_scale_blocks = CKFMHA_FP8_SCALE_BLOCKS(problem.seqlen_k);
  set_problem_scalars(p, problem);
  return p;
}

}  // namespace ckfmha::kernel
