// Host side: the page-table parameters of a paged K/V launch (fwd_pagedkv,
// batch_prefill) from the C API's problem and arguments. The runtime checks
// the page size (a power of two) and the table pointers before any launch.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel/params/fwd_params.h"

namespace ckfmha::kernel {

inline void set_paged_kv_params(FwdParams& p, ckfmha_fwd_problem const& problem,
                                ckfmha_fwd_args const& args) {
  const bool indptr = problem.kv_storage == CKFMHA_KV_PAGED_INDPTR;
  p.block_table = indptr ? nullptr : args.block_table;
  p.kv_indices = indptr ? args.kv_indices : nullptr;
  p.kv_indptr = indptr ? args.kv_indptr : nullptr;
  p.seqlens_k = args.seqlens_k;
  p.block_table_stride = problem.block_table_stride;
  p.num_pages = problem.num_pages;
  p.num_kv_indices = indptr ? problem.num_kv_indices : 0;
  p.max_pages_per_seq = problem.max_pages_per_seq;
  int log2 = 0;
  while ((int64_t(1) << log2) < problem.page_size) ++log2;
  p.page_size_log2 = log2;
}

}  // namespace ckfmha::kernel
