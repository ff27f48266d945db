// Host side: the device parameters of a backward stage from the C API's
// problem and argument structs; shared by the three launchers so every stage
// reads the problem, and carves the workspace, the same way.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel/params/bwd_params.h"
#include "ckfmha/kernel/params/bwd_workspace.h"
#include "ckfmha/kernel/params/launch_context.h"
#include "ckfmha/kernel/params/problem_scalars.h"

#include <cstdint>

namespace ckfmha::kernel {

inline BwdParams make_bwd_params(ckfmha_bwd_problem const& problem, ckfmha_bwd_args const& args,
                                 ckfmha_launch_context const* context) {
  BwdParams p{};
  p.errors = device_errors_of(context);
  p.q = args.q;
  p.k = args.k;
  p.v = args.v;
  p.o = args.o;
  p.dout = args.do_;
  p.lse = args.lse;
  p.dq = args.dq;
  p.dk = args.dk;
  p.dv = args.dv;
  p.bias = args.bias;
  p.dbias = problem.store_dbias ? args.dbias : nullptr;
  p.alibi_slopes = args.alibi_slopes;
  p.sink = problem.has_sink ? args.sink : nullptr;
  p.dsink = problem.has_sink ? args.dsink : nullptr;
  p.cu_seqlens_q = args.cu_seqlens_q;
  p.cu_seqlens_k = args.cu_seqlens_k;

  BwdWorkspaceLayout w = bwd_workspace_layout(problem);
  auto* base = static_cast<char*>(args.workspace);
  p.delta = reinterpret_cast<float*>(base + w.delta_offset);
  p.lse_log2 = reinterpret_cast<float*>(base + w.lse_log2_offset);
  p.dq_accum = reinterpret_cast<float*>(base + w.dq_accum_offset);
  p.dq_accum_split_stride = w.dq_accum_split_stride;
  p.dq_splits = w.dq_splits;
  p.deterministic = problem.deterministic != 0;

  auto strides = [](int64_t const (&s)[3], int64_t& b, int64_t& h, int64_t& r) {
    b = s[0];
    h = s[1];
    r = s[2];
  };
  strides(problem.q_stride, p.q_batch_stride, p.q_head_stride, p.q_row_stride);
  strides(problem.k_stride, p.k_batch_stride, p.k_head_stride, p.k_row_stride);
  strides(problem.v_stride, p.v_batch_stride, p.v_head_stride, p.v_row_stride);
  strides(problem.o_stride, p.o_batch_stride, p.o_head_stride, p.o_row_stride);
  strides(problem.do_stride, p.do_batch_stride, p.do_head_stride, p.do_row_stride);
  strides(problem.dq_stride, p.dq_batch_stride, p.dq_head_stride, p.dq_row_stride);
  strides(problem.dk_stride, p.dk_batch_stride, p.dk_head_stride, p.dk_row_stride);
  strides(problem.dv_stride, p.dv_batch_stride, p.dv_head_stride, p.dv_row_stride);
  strides(problem.bias_stride, p.bias_batch_stride, p.bias_head_stride, p.bias_row_stride);
  strides(problem.dbias_stride, p.dbias_batch_stride, p.dbias_head_stride, p.dbias_row_stride);
  p.lse_batch_stride = problem.lse_stride[0];
  p.lse_head_stride = problem.lse_stride[1];
  p.alibi_batch_stride = problem.alibi_stride;

  p.batch = problem.batch;
  p.seqlen_q = problem.seqlen_q;
  p.workspace_rows = w.rows_per_head;
  p.seqlen_k = problem.seqlen_k;
  p.nhead_q = problem.nhead_q;
  p.head_group = problem.nhead_q / problem.nhead_k;
  p.hdim_q = problem.hdim_q;
  p.hdim_v = problem.hdim_v;
  p.skip_min_seqlen_q = 0;
  p.total_q = problem.total_q;
  p.total_k = problem.total_k;
  set_problem_scalars(p, problem);
  return p;
}

}  // namespace ckfmha::kernel
