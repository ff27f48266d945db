// The epilogue of the Hopper forward: a query tile's LSE and O once its last
// P V product has landed, by the path Traits::kOutputPath names (why each
// shape takes its path: fwd_traits.cuh). TMA stores: each consumer
// warpgroup writes and stores its own rows, a column chunk at a time, so
// that its stores run under the other warpgroups' last products. Shared
// rows (group mode): both warpgroups stage O in the sm80 path's swizzled
// rows and store 16-byte row vectors that stop at the sequence's end.
// Registers: stored straight from the accumulators.
#pragma once

#include "ckfmha/kernel/common/fragment_layout.cuh"
#include "ckfmha/kernel/common/tile_copy.cuh"
#include "ckfmha/kernel/params/fwd_params.h"
#include "ckfmha/kernel/sm90/fwd_fp8.cuh"  // the fp8 scales
#include "ckfmha/kernel/sm90/fwd_mma.cuh"  // FwdSm90Accumulators, the barrier ids
#include "ckfmha/kernel/sm90/fwd_ring.cuh"  // FwdSm90Params
#include "ckfmha/kernel/sm90/fwd_traits.cuh"  // Sm90OutputPath

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <cmath>
#include <cstdint>
#include <utility>

namespace ckfmha::kernel {

// The copies of every output path, made once per consumer thread.
template <class Traits>
struct FwdSm90Epilogue {
  using Element = typename Traits::Element;
  using TileO = cute::Shape<cute::Int<Traits::kBlockM>, cute::Int<Traits::kHeadDimV>>;
  using SmemORows = decltype(cute::make_tensor(cute::make_smem_ptr(std::declval<Element*>()),
                                               typename Traits::SmemLayoutORows{}));

  SmemORows sO;
  decltype(cute::make_tiled_copy_C(typename Traits::SmemStoreAtomO{},
                                   typename Traits::TiledMmaPV{})) o_r2s;
  decltype(o_r2s.get_thread_slice(0)) o_r2s_thr;
  typename Traits::TiledMmaPVChunk mma_o_chunk;
  decltype(cute::make_tiled_copy_C(typename Traits::SmemStoreAtomO{}, mma_o_chunk)) o_chunk_r2s;
  decltype(o_chunk_r2s.get_thread_slice(0)) o_chunk_r2s_thr;
  typename Traits::RowsO::Store o_store;
  decltype(o_store.get_thread_slice(0)) o_store_thr;

  // `tid` counts from 0 over the consumer warpgroups.
  __device__ __forceinline__ FwdSm90Epilogue(typename Traits::SharedStorage* storage,
                                             typename Traits::TiledMmaPV const& mma_pv, int tid)
      : sO(cute::make_tensor(cute::make_smem_ptr(Traits::o_staging(storage)),
                             typename Traits::SmemLayoutORows{})),
        o_r2s(cute::make_tiled_copy_C(typename Traits::SmemStoreAtomO{}, mma_pv)),
        o_r2s_thr(o_r2s.get_thread_slice(tid)),
        o_chunk_r2s(cute::make_tiled_copy_C(typename Traits::SmemStoreAtomO{}, mma_o_chunk)),
        o_chunk_r2s_thr(o_chunk_r2s.get_thread_slice(tid)),
        o_store_thr(o_store.get_thread_slice(tid)) {}

  // Where the tile's first row of O goes. store_empty_tile writes the same
  // sum out itself: called there, this changed that path's generated code.
  template <class Work>
  __device__ __forceinline__ static Element* o_rows(FwdParams const& p, Work const& work) {
    const int64_t origin = Traits::kIsGroupMode ? work.seq.q_token0 * p.o_row_stride
                                                : work.tile.batch * p.o_batch_stride;
    return static_cast<Element*>(p.o) + origin + work.tile.head * p.o_head_stride +
           work.m_begin * p.o_row_stride;
  }

  // No key is visible to the tile's rows: O is 0 and the LSE -inf (a sink's
  // logit with a sink), as finalize gives such rows, stored from registers on a path of its own,
  // so that the other tiles' products, epilogue and resets are one straight
  // block (measured faster, NOTES 72).
  // `cO_rows_cols`: each O accumulator element's (row, column) in the tile;
  // `acc` gives the accumulator's layout.
  template <class Work, class Coords>
  __device__ __forceinline__ void store_empty_tile(FwdParams const& p, Work const& work,
                                                   Coords const& cO_rows_cols,
                                                   FwdSm90Accumulators<Traits> const& acc) const {
    using namespace cute;
    constexpr bool kGroup = Traits::kIsGroupMode;
    using Accumulators = FwdSm90Accumulators<Traits>;
    const int head = work.tile.head;
    const int batch = work.tile.batch;
    const int m_begin = work.m_begin;
    if constexpr (Traits::kHasLse) {
      if (p.lse != nullptr && get<1>(cO_rows_cols(0, 0)) == 0) {
        float* lse_out = p.lse + (kGroup ? work.seq.q_token0 : batch * p.lse_batch_stride) +
                         head * p.lse_head_stride;
        const float empty_lse = Traits::kHasSink ? p.sink[head] : -INFINITY;
        CUTE_UNROLL
        for (int r = 0; r < Accumulators::kRows; ++r) {
          int row = m_begin + get<0>(cO_rows_cols(r, 0));
          if (row < work.seq.seqlen_q) lse_out[row] = empty_lse;
        }
      }
    }
    const int64_t origin =
        kGroup ? work.seq.q_token0 * p.o_row_stride : batch * p.o_batch_stride;
    Tensor zeros = make_tensor<Element>(acc.acc_o.layout());
    fill(zeros, Element(0.f));
    store_fragment_rows(make_tensor(zeros.data(), gmma_accum_as_rows_cols(zeros.layout())),
                        cO_rows_cols,
                        static_cast<Element*>(p.o) + origin + head * p.o_head_stride +
                            m_begin * p.o_row_stride,
                        p.o_row_stride, work.seq.seqlen_q - m_begin);
  }

  // The softmax's final normalisation of O, and the tile's LSE.
  // `Fp8BlockScales` as attend's.
  template <bool Fp8BlockScales, class Work, class Coords>
  __device__ __forceinline__ void finish_softmax(FwdParams const& p, Work const& work,
                                                 Coords const& cO_rows_cols,
                                                 FwdSm90Accumulators<Traits>& acc) const {
    using namespace cute;
    constexpr bool kGroup = Traits::kIsGroupMode;
    constexpr int kRows = FwdSm90Accumulators<Traits>::kRows;
    const int head = work.tile.head;
    const int batch = work.tile.batch;
    const int m_begin = work.m_begin;
    Tensor out = acc.out();

    float lse[kRows];
    if constexpr (Traits::kQkvFp8) {
      // P carries 2^kFp8ProbOffsetLog2 and O holds values in units of v's
      // scale. With block scales the maxima are in log2 units already
      // (update_scaled_scores) and v's scale is the last key tile's (attend
      // runs backwards: the first tile's).
      if constexpr (Fp8BlockScales) {
        const float v_units = fp8_key_block_scales(p, work, work.n_first * Traits::kBlockN).y;
        acc.softmax.template finalize<false, kFp8ProbOffsetLog2>(out, 1.f, 0.f, v_units, lse);
      } else {
        acc.softmax.template finalize<false, kFp8ProbOffsetLog2>(
            out, fp8_qk_scale_log2(p, head), 0.f, fp8_v_scale(p, head), lse);
      }
    } else {
      // Transformed scores (bias, ALiBi, soft-cap) carry the factor to log2
      // units that Transform::softmax_scale_log2 gives (1 where log2-domain).
      using Transform = typename FwdSm90Mma<Traits>::Transform;
      constexpr bool kTransformed = Transform::kActive;
      constexpr float kLog2e = 1.4426950408889634f;
      const float sink_log2 = Traits::kHasSink ? p.sink[head] * kLog2e : 0.f;
      const float rescale = Traits::kHasDropout ? p.dropout_rescale : 1.f;
      const float max_to_log2 = kTransformed ? Transform::softmax_scale_log2(p) : p.scale_log2;
      acc.softmax.template finalize<Traits::kHasSink>(out, max_to_log2, sink_log2, rescale, lse);
    }

    if constexpr (Traits::kHasLse) {
      if (p.lse != nullptr) {
        float* lse_out = p.lse + (kGroup ? work.seq.q_token0 : batch * p.lse_batch_stride) +
                         head * p.lse_head_stride;
        if (get<1>(cO_rows_cols(0, 0)) == 0) {  // one lane of each quad owns the row
          CUTE_UNROLL
          for (int r = 0; r < kRows; ++r) {
            int row = m_begin + get<0>(cO_rows_cols(r, 0));
            if (row < work.seq.seqlen_q) lse_out[row] = lse[r];
          }
        }
      }
    }
  }

  // O, converted to the input type (rO), to its rows from `o_base` on, by
  // the tile's output path. `tid` (from 0 over the consumer warpgroups) is
  // read by the TMA-store path only.
  template <class Work, class Coords, class Fragment>
  __device__ __forceinline__ void store_o(FwdSm90Params<Traits> const& params,
                                          typename Traits::SharedStorage* storage,
                                          Work const& work, Coords const& cO_rows_cols,
                                          Fragment const& rO, Element* o_base, int tid) {
    using namespace cute;
    constexpr int kBlockM = Traits::kBlockM;
    FwdParams const& p = params.p;
    const int head = work.tile.head;
    const int batch = work.tile.batch;
    const int m_begin = work.m_begin;
    if constexpr (Traits::kOutputPath == Sm90OutputPath::kTmaStore) {
      // This warpgroup writes and stores its own rows, a column chunk at a
      // time; it waits only for its previous store to have read its buffer.
      constexpr int kHalf = Traits::kRowsPerWarpgroup;
      constexpr int kChunk = Traits::kOChunkCols;
      const int warpgroup = tid / 128;
      const bool leader = tid % 128 == 0;
      Tensor sO_chunks = make_tensor(make_smem_ptr(Traits::o_staging(storage)),
                                     typename Traits::SmemLayoutOChunks{});
      Tensor sO_chunk = make_tensor(
          make_smem_ptr(Traits::o_staging(storage) + warpgroup * kHalf * kChunk),
          typename Traits::SmemLayoutOChunk{});
      Tensor tOsO_chunks = o_chunk_r2s_thr.partition_D(sO_chunks);
      // A chunk's registers are contiguous in rO: four per 8-column block.
      auto chunk_layout =
          partition_fragment_C(mma_o_chunk, Shape<Int<kBlockM>, Int<kChunk>>{}).layout();
      CUTE_UNROLL
      for (int chunk = 0; chunk < Traits::kHeadDimV / kChunk; ++chunk) {
        if (leader) tma_store_wait<0>();
        cutlass::arch::NamedBarrier::sync(
            128, kFirstEpilogueBarrierId<Traits::kConsumerWarpgroups> + warpgroup);
        Tensor rO_chunk = make_tensor(rO.data() + chunk * (kChunk / 2), chunk_layout);
        copy(o_chunk_r2s, o_chunk_r2s_thr.retile_S(rO_chunk), tOsO_chunks);
        // The TMA engine reads shared memory through the async proxy.
        cutlass::arch::fence_view_async_shared();
        cutlass::arch::NamedBarrier::sync(
            128, kFirstEpilogueBarrierId<Traits::kConsumerWarpgroups> + warpgroup);
        if (leader) {
          Tensor mO = params.tma_o.get_tma_tensor(make_shape(
              params.tma_rows_q, int(Traits::kHeadDimV), p.nhead_q, params.order.num_batches));
          Tensor gO =
              local_tile(mO(_, _, head, batch), Shape<Int<kHalf>, Int<kChunk>>{},
                         make_coord(work.tile.m_block * (kBlockM / kHalf) + warpgroup, chunk));
          auto [tOgO, tOsO] = tma_partition(params.tma_o, Int<0>{}, Layout<_1>{},
                                            group_modes<0, 2>(sO_chunk), group_modes<0, 2>(gO));
          copy(params.tma_o, tOsO, tOgO);
          tma_store_arrive();
        }
      }
    } else if constexpr (Traits::kOutputPath == Sm90OutputPath::kSmemRows) {
      // Both consumer warpgroups must be done with the staging buffer (the
      // previous tile's row stores) before it is rewritten.
      cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, kConsumerBarrierId);
      copy(o_r2s, o_r2s_thr.retile_S(rO), o_r2s_thr.partition_D(sO));
      cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, kConsumerBarrierId);
      Tensor gO = make_tensor(make_gmem_ptr(o_base), TileO{}, make_stride(p.o_row_stride, _1{}));
      Tensor tOgO = o_store_thr.partition_D(gO);
      store_rows(o_store, o_store_thr.partition_S(sO), tOgO,
                 o_store_thr.partition_S(make_identity_tensor(TileO{})),
                 work.seq.seqlen_q - m_begin);
    } else {
      Tensor rO_rows_cols = make_tensor(rO.data(), gmma_accum_as_rows_cols(rO.layout()));
      store_fragment_rows(rO_rows_cols, cO_rows_cols, o_base, p.o_row_stride,
                          work.seq.seqlen_q - m_begin);
    }
  }
};

}  // namespace ckfmha::kernel
