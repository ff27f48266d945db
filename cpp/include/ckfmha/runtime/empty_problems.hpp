// Problems with a zero extent (no batch, no queries, no keys, nothing to append): what a run
// does with them, and the outputs it writes without a kernel. ckfmha.h ("Empty problems")
// documents the results.
#pragma once

#include "ckfmha/ckfmha.h"

namespace ckfmha::runtime {

enum class RunWork {
  kNothing,  // every output is empty: success without touching the device
  kFill,     // outputs are constants (O = 0 and LSE = -inf or the sink, zero gradients):
             // written with memsets and copies on the stream, no kernel
  kKernels,  // the plan's kernels run the problem `launch_problem` returns
};

RunWork fwd_run_work(ckfmha_fwd_problem const& problem);
RunWork bwd_run_work(ckfmha_bwd_problem const& problem);
RunWork appendkv_run_work(ckfmha_appendkv_problem const& problem);

// The problem the kernels are planned and launched for. A zero length bound of a group-mode or
// paged problem (every sequence without keys, or without queries in the backward) becomes 1:
// each sequence's own length, 0, then decides, through the kernels' path for an empty range
// (O = 0, LSE = -inf; zero gradients). Optional outputs with no elements then (dropout bytes,
// dbias) are not stored; without queries neither is dsink (the run zeroes it with a memset).
ckfmha_fwd_problem fwd_launch_problem(ckfmha_fwd_problem const& problem);
ckfmha_bwd_problem bwd_launch_problem(ckfmha_bwd_problem const& problem);

// kFill of a forward problem (batch mode, seqlen_k = 0): O = 0 and LSE = -inf, or sink[h]
// with sinks, on `stream`.
int fill_fwd_without_keys(ckfmha_fwd_problem const& problem, ckfmha_fwd_args const& args,
                          ckfmha_stream_t stream);
// kFill of a backward problem (batch mode, seqlen_q or seqlen_k = 0; with sinks, also batch 0
// or both lengths 0): the non-empty gradients are 0 (dk and dv without queries, dq without
// keys, dsink with sinks), on `stream`.
int zero_bwd_gradients(ckfmha_bwd_problem const& problem, ckfmha_bwd_args const& args,
                       ckfmha_stream_t stream);
// dsink = 0 on `stream`: a problem with sinks where no sequence has queries.
int zero_bwd_dsink(ckfmha_bwd_problem const& problem, ckfmha_bwd_args const& args,
                   ckfmha_stream_t stream);

}  // namespace ckfmha::runtime
