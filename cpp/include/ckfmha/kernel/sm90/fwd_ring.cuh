// The producer side of the Hopper forward: one thread of the producer
// warpgroup issues TMA copies of each tile's Q and of its K and V tiles into
// a ring of stages, in the order the consumers read them (K0, K1, V0, K2,
// V1, ...); a stage's K or V is reused when every consumer warpgroup has
// released it, a Q buffer when all are done with it (q_empty). Q is
// double-buffered where it fits, so the next tile's Q arrives while this
// tile runs.
#pragma once

#include "ckfmha/kernel/common/persistent_tile_order.cuh"
#include "ckfmha/kernel/params/fwd_params.h"
#include "ckfmha/kernel/sm90/fwd_tile_work.cuh"

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <cstdint>

namespace ckfmha::kernel {

template <class Traits>
struct FwdSm90Params {
  FwdParams p;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaK tma_k;
  typename Traits::TmaV tma_v;
  typename Traits::TmaO tma_o;
  Sm90TileOrder<Traits> order;
  // Rows of the TMA views: the padded lengths in batch mode, the packed
  // token counts in group mode (whose views have one "batch").
  int tma_rows_q;
  int tma_rows_k;
  // An elementwise bias through the shared-memory ring (fwd_bias_ring.cuh).
  typename Traits::TmaBias tma_bias;
};

// Where the ring's i-th K/V tile of all loaded so far lives, and the parity
// of its barriers' current phase.
struct RingSlot {
  int stage;
  uint32_t phase;
};

// The slot of the `count`-th tile loaded into a ring of `Stages` buffers.
template <int Stages>
__device__ __forceinline__ RingSlot ring_slot_of(int count) {
  return RingSlot{count % Stages, uint32_t((count / Stages) & 1)};
}

// Run by one thread before any role starts: a full barrier expects the
// producer's one arrival (with the bytes of its copies), an empty barrier
// every consumer thread's. fp8: V^T's full barrier expects the transposing
// threads, and the staging ring's barriers the copy and those threads.
template <class Traits>
__device__ __forceinline__ void fwd_sm90_init_barriers(typename Traits::Barriers& bar) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  for (int s = 0; s < Traits::kQStages; ++s) {
    Barrier::init(&bar.q_full[s], 1);
    Barrier::init(&bar.q_empty[s], Traits::kConsumerThreads);
  }
  for (int s = 0; s < Traits::kStages; ++s) {
    Barrier::init(&bar.k_full[s], 1);
    Barrier::init(&bar.v_full[s], Traits::kQkvFp8 ? Traits::kTransposeThreads : 1);
    Barrier::init(&bar.k_empty[s], Traits::kConsumerThreads);
    Barrier::init(&bar.v_empty[s], Traits::kConsumerThreads);
    if constexpr (Traits::kQkvFp8) {
      Barrier::init(&bar.v_staged[s], 1);
      Barrier::init(&bar.v_staging_free[s], Traits::kTransposeThreads);
    }
  }
  cutlass::arch::fence_barrier_init();
}

// Run by one thread: every query tile of this CTA, its Q and its key tiles
// from the last to the first. sQ (QStages Q tiles), sK and sV (stages of
// key tiles) are the shared-memory buffers the copies fill; fp8 V goes to
// its staging ring, which the transposing warps empty.
template <class Traits, class SmemQ, class SmemK, class SmemV>
__device__ __forceinline__ void fwd_sm90_load_tiles(FwdSm90Params<Traits> const& params,
                                                    typename Traits::Barriers& bar,
                                                    SmemQ const& sQ, SmemK const& sK,
                                                    SmemV const& sV) {
  using namespace cute;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using Work = Sm90TileWork<Traits>;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kStages = Traits::kStages;
  constexpr bool kGroup = Traits::kIsGroupMode;
  FwdParams const& p = params.p;

  // Coordinate tensors over the shapes the descriptors were encoded with.
  const int views = kGroup ? 1 : params.order.num_batches;
  const int nhead_k = p.nhead_q / p.head_group;
  Tensor mQ = params.tma_q.get_tma_tensor(
      make_shape(params.tma_rows_q, int(Traits::kHeadDimQK), p.nhead_q, views));
  Tensor mK = params.tma_k.get_tma_tensor(
      make_shape(params.tma_rows_k, int(Traits::kHeadDimQK), nhead_k, views));
  Tensor mV = params.tma_v.get_tma_tensor(
      make_shape(params.tma_rows_k, int(Traits::kHeadDimV), nhead_k, views));
  int kv_count = 0;  // K/V tiles loaded so far: the ring's stage and phase
  int q_count = 0;   // Q tiles loaded so far: the Q buffer and its barriers' phase
  uint64_t* v_free = bar.v_empty;
  uint64_t* v_loaded = bar.v_full;
  if constexpr (Traits::kQkvFp8) {
    v_free = bar.v_staging_free;
    v_loaded = bar.v_staged;
  }
  for_each_tile(params.order, [&](QueryTile query_tile) {
    const Work work(p, query_tile);
    if (!work.has_rows()) return;
    const int head = work.tile.head;
    const int head_k = head / p.head_group;
    const int view = kGroup ? 0 : work.tile.batch;
    // A sequence's rows start at its first token in group mode; rows past
    // its end belong to the next sequence and are masked or not stored.
    Tensor gQ = local_tile(
        domain_offset(make_coord(int(work.seq.q_token0), 0), mQ(_, _, head, view)),
        Shape<Int<kBlockM>, Int<Traits::kHeadDimQK>>{}, make_coord(work.tile.m_block, 0));
    Tensor gK = local_tile(
        domain_offset(make_coord(int(work.seq.k_token0), 0), mK(_, _, head_k, view)),
        Shape<Int<kBlockN>, Int<Traits::kHeadDimQK>>{}, make_coord(_, 0));
    Tensor gV = local_tile(
        domain_offset(make_coord(int(work.seq.k_token0), 0), mV(_, _, head_k, view)),
        Shape<Int<kBlockN>, Int<Traits::kHeadDimV>>{}, make_coord(_, 0));
    auto [tQgQ, tQsQ] = tma_partition(params.tma_q, Int<0>{}, Layout<_1>{},
                                      group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    auto [tKgK, tKsK] = tma_partition(params.tma_k, Int<0>{}, Layout<_1>{},
                                      group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto [tVgV, tVsV] = tma_partition(params.tma_v, Int<0>{}, Layout<_1>{},
                                      group_modes<0, 2>(sV), group_modes<0, 2>(gV));

    // Key tile i of K or V into its ring; `tma` and the barrier arrays say
    // which (passed as pointers: array references trip the front end in
    // generic lambdas). The first pass over the ring finds every stage free:
    // waiting on the parity before a barrier's initial phase returns at once.
    // Structured bindings cannot be captured before C++20: the partitions
    // are passed in. Defined before load_q: in the other order the two
    // counters' registers came out swapped in ptxas's input, and the
    // schedule with them.
    auto load_kv_tile = [&](int i, auto const& tma, uint64_t* empty, uint64_t* full,
                            uint32_t bytes, auto const& src, auto&& dst) {
      const RingSlot slot = ring_slot_of<kStages>(kv_count + i);
      Barrier::wait(&empty[slot.stage], slot.phase ^ 1);
      Barrier::arrive_and_expect_tx(&full[slot.stage], bytes);
      copy(tma.with(full[slot.stage]), src(_, work.n_last - 1 - i), dst(_, slot.stage));
    };
    // Q is loaded even for a tile without visible keys: every tile with
    // rows takes one turn of q_full/q_empty, so both sides agree on phases.
    auto load_q = [&](auto const& src, auto&& dst) {
      const RingSlot slot = ring_slot_of<Traits::kQStages>(q_count);
      Barrier::wait(&bar.q_empty[slot.stage], slot.phase ^ 1);
      Barrier::arrive_and_expect_tx(&bar.q_full[slot.stage], Traits::kTmaBytesQ);
      copy(params.tma_q.with(bar.q_full[slot.stage]), src, dst(_, slot.stage));
      ++q_count;
    };
    const int n_tiles = work.n_tiles();
    // With two Q buffers, Q goes first: its buffer was freed a tile ago.
    constexpr bool kQFirst = Traits::kQStages > 1;
    if (n_tiles == 0 || kQFirst) load_q(tQgQ, tQsQ);
    for (int i = 0; i < n_tiles; ++i) {
      load_kv_tile(i, params.tma_k, bar.k_empty, bar.k_full, Traits::kTmaBytesK, tKgK, tKsK);
      // With one, the first K tile goes out before Q, which may still wait
      // for the previous tile's consumers.
      if (i == 0 && !kQFirst) load_q(tQgQ, tQsQ);
      // V trails K by one tile, as the consumers' products do.
      if (i > 0) {
        load_kv_tile(i - 1, params.tma_v, v_free, v_loaded, Traits::kTmaBytesV, tVgV, tVsV);
      }
    }
    if (n_tiles > 0) {
      load_kv_tile(n_tiles - 1, params.tma_v, v_free, v_loaded, Traits::kTmaBytesV, tVgV, tVsV);
    }
    kv_count += n_tiles;
  });
}

}  // namespace ckfmha::kernel
