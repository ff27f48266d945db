// The epilogue of the Hopper backward main stage: dK (scaled) and dV of the
// CTA's keys, staged in shared memory over K and V and stored to global
// memory as 16-byte row vectors; keys without a visible query get zeros,
// keys past the sequence's seqlen_k none.
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

// dK or dV of the CTA's keys (`Cols` columns), staged in shared memory by
// stmatrix from `rows_in_registers` (the accumulator of `mma`, converted)
// and stored from there as row vectors.
template <class Traits, int Cols>
struct BwdSm90KeyRows {
  using Element = typename Traits::Element;
  using Tile = cute::Shape<cute::Int<Traits::kBlockN>, cute::Int<Cols>>;
  // Where the warpgroups split the columns, each one's half is whole
  // swizzle chunks.
  static constexpr int kOwnedCols = Traits::kSplitsHeadDim ? Cols / 2 : Cols;
  using Rows = SmemRows<Element, Cols, Traits::kConsumerThreads, false,
                        (kOwnedCols % 64 == 0 ? 64 : 32)>;
  using SmemLayout = typename Rows::template Layout<Traits::kBlockN>;

  template <class Fragment, class TiledMma>
  __device__ __forceinline__ static void stage(Fragment const& rows_in_registers,
                                               TiledMma const& mma, int tid, Element* smem) {
    using namespace cute;
    // stmatrix: the rows layout keeps 8-element runs contiguous and 16-byte
    // aligned, as its rows need.
    auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma);
    auto r2s_thr = r2s.get_thread_slice(tid);
    Tensor staged = make_tensor(make_smem_ptr(smem), SmemLayout{});
    copy(r2s, r2s_thr.retile_S(rows_in_registers), r2s_thr.partition_D(staged));
  }

  __device__ __forceinline__ static void store(Element const* smem, Element* rows,
                                               int64_t row_stride, int tid, int rows_left) {
    using namespace cute;
    Tensor staged = make_tensor(make_smem_ptr(smem), SmemLayout{});
    Tensor out = make_tensor(make_gmem_ptr(rows), Tile{}, make_stride(row_stride, _1{}));
    typename Rows::Store copier;
    auto thr = copier.get_thread_slice(tid);
    Tensor coords = thr.partition_S(make_identity_tensor(Tile{}));
    Tensor dst = thr.partition_D(out);
    store_rows(copier, thr.partition_S(staged), dst, coords, rows_left);
  }
};

// Run by every consumer thread (`tid` counts from 0 over both warpgroups)
// once its own products are done; `smem_k` and `smem_v` hold K's and V's
// tiles and are overwritten. `mma_dk` and `mma_dv` are the products whose
// accumulators dK and dV are (one product for both in the key-split layout).
template <class Traits, class AccumulatorK, class AccumulatorV, class TiledMmaK, class TiledMmaV>
__device__ __forceinline__ void bwd_sm90_store_dk_dv(AccumulatorK& acc_dk,
                                                     AccumulatorV const& acc_dv,
                                                     TiledMmaK const& mma_dk,
                                                     TiledMmaV const& mma_dv, int tid,
                                                     typename Traits::Element* smem_k,
                                                     typename Traits::Element* smem_v,
                                                     BwdParams const& p,
                                                     BwdSm90KeyTile<Traits> const& tile) {
  using namespace cute;
  using Element = typename Traits::Element;
  using RowsK = BwdSm90KeyRows<Traits, Traits::kHeadDim>;
  using RowsV = BwdSm90KeyRows<Traits, Traits::kHeadDimV>;
  static_assert(cosize_v<typename RowsK::SmemLayout> <= cosize_v<typename Traits::SmemLayoutK> &&
                    cosize_v<typename RowsV::SmemLayout> <= cosize_v<typename Traits::SmemLayoutV>,
                "dK and dV are staged over K and V");

  CUTE_UNROLL
  for (int e = 0; e < size(acc_dk); ++e) acc_dk(e) *= p.scale;
  Tensor rdK = convert_fragment<Element>(acc_dk);
  Tensor rdV = convert_fragment<Element>(acc_dv);

  // The other warpgroup's last products may still read K and V.
  cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, kBwdSm90ConsumerBarrierId);
  RowsK::stage(rdK, mma_dk, tid, smem_k);
  RowsV::stage(rdV, mma_dv, tid, smem_v);
  cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, kBwdSm90ConsumerBarrierId);

  // Group mode: the sequence's keys start at its first token.
  constexpr bool kGroup = Traits::kIsGroupMode;
  const int64_t key0 = (kGroup ? tile.seq.k_token0 : 0) + tile.n_begin();
  const int64_t dk_origin = kGroup ? 0 : tile.batch * p.dk_batch_stride;
  const int64_t dv_origin = kGroup ? 0 : tile.batch * p.dv_batch_stride;
  auto* dk_tile = static_cast<Element*>(p.dk) + dk_origin + tile.head_k * p.dk_head_stride +
                  key0 * p.dk_row_stride;
  auto* dv_tile = static_cast<Element*>(p.dv) + dv_origin + tile.head_k * p.dv_head_stride +
                  key0 * p.dv_row_stride;
  const int rows_left = tile.seq.seqlen_k - tile.n_begin();
  RowsK::store(smem_k, dk_tile, p.dk_row_stride, tid, rows_left);
  RowsV::store(smem_v, dv_tile, p.dv_row_stride, tid, rows_left);
}

}  // namespace ckfmha::kernel
