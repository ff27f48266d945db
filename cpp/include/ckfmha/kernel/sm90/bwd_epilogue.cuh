// The epilogue of the Hopper backward main stage: dK (scaled) and dV of the
// CTA's keys, staged in shared memory over K and V and stored to global
// memory as 16-byte row vectors; keys without a visible query get zeros,
// keys past seqlen_k none.
//
// Why staged: stored straight from the accumulators, each warp instruction
// writes 4-byte pieces of 8 different rows, and L1 takes those a row at a
// time. A CTA's 128 keys then spent about 6 us (d128) and 2 us (d64) in
// these stores, against 26-300 us for the whole CTA; row vectors take an
// eighth of the L1 work (benchmarks/NOTES.md, entry 75).
#pragma once

#include "ckfmha/kernel/common/fragment_layout.cuh"
#include "ckfmha/kernel/common/smem_rows.cuh"
#include "ckfmha/kernel/common/tile_copy.cuh"
#include "ckfmha/kernel/params/bwd_params.h"
#include "ckfmha/kernel/sm90/bwd_ring.cuh"  // kBwdSm90ConsumerBarrierId

#include <cute/arch/copy_sm90.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <cstdint>

namespace ckfmha::kernel {

// Run by every consumer thread (`tid` counts from 0 over both warpgroups)
// once its own products are done; `smem_k` and `smem_v` hold (kBlockN,
// kHeadDim) elements each and are overwritten.
template <class Traits, class Accumulator, class TiledMma>
__device__ __forceinline__ void bwd_sm90_store_dk_dv(Accumulator& acc_dk, Accumulator const& acc_dv,
                                                     TiledMma const& mma_dkv, int tid,
                                                     typename Traits::Element* smem_k,
                                                     typename Traits::Element* smem_v,
                                                     BwdParams const& p, int batch, int head_k,
                                                     int n_begin) {
  using namespace cute;
  using Element = typename Traits::Element;
  using Tile = Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDim>>;
  using Rows = SmemRows<Element, Traits::kHeadDim, Traits::kConsumerThreads>;
  using SmemLayoutRows = typename Rows::template Layout<Traits::kBlockN>;
  static_assert(cosize_v<SmemLayoutRows> <= cosize_v<typename Traits::SmemLayoutK>,
                "dK and dV are staged over K and V");

  CUTE_UNROLL
  for (int e = 0; e < size(acc_dk); ++e) acc_dk(e) *= p.scale;
  Tensor rdK = convert_fragment<Element>(acc_dk);
  Tensor rdV = convert_fragment<Element>(acc_dv);
  Tensor sdK = make_tensor(make_smem_ptr(smem_k), SmemLayoutRows{});
  Tensor sdV = make_tensor(make_smem_ptr(smem_v), SmemLayoutRows{});

  // The other warpgroup's last products may still read K and V.
  cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, kBwdSm90ConsumerBarrierId);
  // stmatrix: the rows layout keeps 8-element runs contiguous and 16-byte
  // aligned, as its rows need.
  auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_dkv);
  auto r2s_thr = r2s.get_thread_slice(tid);
  copy(r2s, r2s_thr.retile_S(rdK), r2s_thr.partition_D(sdK));
  copy(r2s, r2s_thr.retile_S(rdV), r2s_thr.partition_D(sdV));
  cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, kBwdSm90ConsumerBarrierId);

  auto* dk_tile = static_cast<Element*>(p.dk) + batch * p.dk_batch_stride +
                  head_k * p.dk_head_stride + int64_t(n_begin) * p.dk_row_stride;
  auto* dv_tile = static_cast<Element*>(p.dv) + batch * p.dv_batch_stride +
                  head_k * p.dv_head_stride + int64_t(n_begin) * p.dv_row_stride;
  Tensor gdK = make_tensor(make_gmem_ptr(dk_tile), Tile{}, make_stride(p.dk_row_stride, _1{}));
  Tensor gdV = make_tensor(make_gmem_ptr(dv_tile), Tile{}, make_stride(p.dv_row_stride, _1{}));
  typename Rows::Store store;
  auto store_thr = store.get_thread_slice(tid);
  Tensor coords = store_thr.partition_S(make_identity_tensor(Tile{}));
  Tensor tdKgdK = store_thr.partition_D(gdK);
  Tensor tdVgdV = store_thr.partition_D(gdV);
  const int rows_left = p.seqlen_k - n_begin;
  store_rows(store, store_thr.partition_S(sdK), tdKgdK, coords, rows_left);
  store_rows(store, store_thr.partition_S(sdV), tdVgdV, coords, rows_left);
}

}  // namespace ckfmha::kernel
