// The epilogue of the Hopper backward main stage: dK (scaled) and dV of the
// CTA's keys straight from the warpgroups' accumulators to global memory;
// keys without a visible query get zeros, keys past seqlen_k none.
#pragma once

#include "ckfmha/kernel/bwd_params.h"
#include "ckfmha/kernel/fragment_layout.cuh"
#include "ckfmha/kernel/tile_copy.cuh"

#include <cute/tensor.hpp>

#include <cstdint>

namespace ckfmha::kernel {

// `thr_dkv` is the thread's slice of the dK/dV product over `tile` (keys, d).
template <class Element, class Accumulator, class ThrMma, class Tile>
__device__ __forceinline__ void bwd_sm90_store_dk_dv(Accumulator& acc_dk, Accumulator const& acc_dv,
                                                     ThrMma const& thr_dkv, Tile tile,
                                                     BwdParams const& p, int batch, int head_k,
                                                     int n_begin) {
  using namespace cute;
  CUTE_UNROLL
  for (int e = 0; e < size(acc_dk); ++e) acc_dk(e) *= p.scale;
  Tensor rdK = convert_fragment<Element>(acc_dk);
  Tensor rdV = convert_fragment<Element>(acc_dv);
  Tensor cKV = thr_dkv.partition_C(make_identity_tensor(tile));
  Tensor cKV_rows_cols = make_tensor(cKV.data(), gmma_accum_as_rows_cols(cKV.layout()));
  Tensor rdK_rows_cols = make_tensor(rdK.data(), gmma_accum_as_rows_cols(rdK.layout()));
  Tensor rdV_rows_cols = make_tensor(rdV.data(), gmma_accum_as_rows_cols(rdV.layout()));
  auto* dk_tile = static_cast<Element*>(p.dk) + batch * p.dk_batch_stride +
                  head_k * p.dk_head_stride + int64_t(n_begin) * p.dk_row_stride;
  auto* dv_tile = static_cast<Element*>(p.dv) + batch * p.dv_batch_stride +
                  head_k * p.dv_head_stride + int64_t(n_begin) * p.dv_row_stride;
  store_fragment_rows(rdK_rows_cols, cKV_rows_cols, dk_tile, p.dk_row_stride,
                      p.seqlen_k - n_begin);
  store_fragment_rows(rdV_rows_cols, cKV_rows_cols, dv_tile, p.dv_row_stride,
                      p.seqlen_k - n_begin);
}

}  // namespace ckfmha::kernel
