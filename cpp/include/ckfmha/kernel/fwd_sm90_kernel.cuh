// Forward attention on Hopper: TMA loads and wgmma, warp-specialized and
// persistent. Each CTA walks query tiles (128 or 192 rows of one head and sequence)
// unit by unit in PersistentTileOrder (causal: pairs of tiles of equal total work):
//   producer warpgroup: one thread issues TMA copies of each tile's Q and of
//     its K and V tiles into a ring of stages, in the order the consumers
//     read them (K0, K1, V0, K2, V1, ...); a stage's K or V is reused when
//     every consumer warpgroup has released it, a Q buffer when all are done
//     with it (q_empty). Q is double-buffered where it fits, so the next
//     tile's Q arrives while this tile runs.
//   consumer warpgroups (two or three, 64 query rows each), software-pipelined by one key
//     tile: in one turn a warpgroup issues S_i = Q K_i^T and O += P_{i-1}
//     V_{i-1} (wgmma; P from registers), then runs the mask and online
//     softmax of S_i while its own P V product and the other warpgroup's
//     products keep the tensor cores busy; O is rescaled for S_i's new
//     maxima once that P V product has landed.
// The consumer warpgroups take turns issuing (ConsumerTurns), so their
// softmaxes interleave instead of meeting. A turn's critical path is one
// warpgroup's own chain (S product, softmax, O rescale, the next operands'
// barriers), so from head dim 128 two pieces are cut from it: a row's
// running maximum moves only by more than a factor 2^8 (most turns skip the
// rescale), and the next turn's barriers are tested under the softmax.
// Key tiles are visited from the last to the first, as on the sm80 path: the
// tiles crossing the end of the keys or the causal diagonal come first.
#pragma once

#include "ckfmha/kernel/attention_mask.cuh"
#include "ckfmha/kernel/fragment_layout.cuh"
#include "ckfmha/kernel/fwd_params.h"
#include "ckfmha/kernel/fwd_sm90_traits.cuh"  // Sm90OutputPath
#include "ckfmha/kernel/online_softmax.cuh"
#include "ckfmha/kernel/persistent_tile_order.cuh"
#include "ckfmha/kernel/sequence_slice.cuh"
#include "ckfmha/kernel/shared_storage.cuh"
#include "ckfmha/kernel/tile_copy.cuh"

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <type_traits>

namespace ckfmha::kernel {

template <class Traits>
using Sm90TileOrder = PersistentTileOrder<Traits::kMask == MaskMode::kCausal>;

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
};

// Named barrier 0 is __syncthreads; the consumers use their own so the
// producer warpgroup never has to join.
constexpr uint32_t kConsumerBarrierId = 1;
constexpr int kMaxConsumerWarpgroups = 3;
constexpr uint32_t kFirstTurnBarrierId = 2;  // one per consumer warpgroup
// The epilogue barriers (one per consumer warpgroup) follow the turn barriers.
template <int Warpgroups>
constexpr uint32_t kFirstEpilogueBarrierId = kFirstTurnBarrierId + Warpgroups;

// Turns between the consumer warpgroups (ping-pong with two, a ring with
// three): each issues its wgmmas only in its turn and then hands the turn to
// the next, so the tensor cores alternate between them and one warpgroup's
// softmax runs under the others' products instead of all reaching the
// softmax at once. A turn's barrier joins the warpgroup handing over and the
// one taking it.
template <int Warpgroups>
struct ConsumerTurns {
  static_assert(Warpgroups >= 2 && Warpgroups <= kMaxConsumerWarpgroups);
  int warpgroup;  // among the consumers

  // Warpgroup 0 goes first: the last one hands it the first turn.
  __device__ __forceinline__ void start() const {
    if (warpgroup == Warpgroups - 1) hand_over();
  }
  __device__ __forceinline__ void wait_turn() const {
    cutlass::arch::NamedBarrier::sync(2 * 128, kFirstTurnBarrierId + warpgroup);
  }
  __device__ __forceinline__ void hand_over() const {
    // Two warpgroups keep `1 - warpgroup`: the same next warpgroup, but
    // `% 2` changed ptxas's schedule of the whole 128-row kernel.
    const int next = Warpgroups == 2 ? 1 - warpgroup : (warpgroup + 1) % Warpgroups;
    cutlass::arch::NamedBarrier::arrive(2 * 128, kFirstTurnBarrierId + next);
  }
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

// What one query tile needs, computed alike by the producer and consumers so
// that both walk the same tiles and barrier phases.
template <class Traits>
struct Sm90TileWork {
  QueryTile tile;
  SequenceSlice seq;
  int m_begin;
  AttentionMask<Traits::kMask> mask;
  int n_first, n_last;

  __device__ __forceinline__ Sm90TileWork(FwdParams const& p, QueryTile t)
      : tile(t), seq(locate_sequence<Traits::kIsGroupMode>(p, t.batch)),
        m_begin(t.m_block * Traits::kBlockM),
        mask{seq.seqlen_k, p.bottom_right ? seq.seqlen_k - seq.seqlen_q : 0, p.window_left,
             p.window_right} {
    mask.key_block_range(m_begin, Traits::kBlockM, Traits::kBlockN, &n_first, &n_last);
  }
  // Group mode sizes the tile grid for the longest sequence; skipped
  // sequences keep whatever their outputs held.
  __device__ __forceinline__ bool has_rows() const { return !seq.skip && m_begin < seq.seqlen_q; }
  __device__ __forceinline__ int n_tiles() const { return n_last - n_first; }
};

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    fwd_sm90_kernel(__grid_constant__ const FwdSm90Params<Traits> params) {
  using namespace cute;
  using Element = typename Traits::Element;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using Storage = typename Traits::SharedStorage;
  using Work = Sm90TileWork<Traits>;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kStages = Traits::kStages;
  constexpr bool kGroup = Traits::kIsGroupMode;
  FwdParams const& p = params.p;

  extern __shared__ char smem_raw[];
  Storage* storage = shared_storage_at_1024<Storage>(smem_raw);
  auto& bar = storage->bar;
  Tensor sQ = make_tensor(make_smem_ptr(storage->q.data()), typename Traits::SmemLayoutQRing{});
  Tensor sK = make_tensor(make_smem_ptr(storage->k.data()), typename Traits::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(storage->v.data()), typename Traits::SmemLayoutV{});
  Tensor sVt = make_tensor(make_smem_ptr(storage->v.data()), typename Traits::SmemLayoutVt{});

  const int warp = int(threadIdx.x) / 32;
  const int lane = int(threadIdx.x) % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < Traits::kQStages; ++s) {
      Barrier::init(&bar.q_full[s], 1);
      Barrier::init(&bar.q_empty[s], Traits::kConsumerThreads);
    }
    for (int s = 0; s < kStages; ++s) {
      Barrier::init(&bar.k_full[s], 1);
      Barrier::init(&bar.v_full[s], 1);
      Barrier::init(&bar.k_empty[s], Traits::kConsumerThreads);
      Barrier::init(&bar.v_empty[s], Traits::kConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (warp < 4) {
    // ---- producer warpgroup
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if (warp != 0 || lane != 0) return;
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

      // Q is loaded even for a tile without visible keys: every tile with
      // rows takes one turn of q_full/q_empty, so both sides agree on phases.
      auto load_q = [&](auto const& src, auto&& dst) {
        const RingSlot slot = ring_slot_of<Traits::kQStages>(q_count);
        Barrier::wait(&bar.q_empty[slot.stage], slot.phase ^ 1);
        Barrier::arrive_and_expect_tx(&bar.q_full[slot.stage], Traits::kTmaBytesQ);
        copy(params.tma_q.with(bar.q_full[slot.stage]), src, dst(_, slot.stage));
        ++q_count;
      };
      // Key tile i of K or V into its ring; `tma` and the barrier arrays say
      // which (passed as pointers: array references trip the front end in
      // generic lambdas). The first pass over the ring finds every stage free:
      // waiting on the parity before a barrier's initial phase returns at once.
      // Structured bindings cannot be captured before C++20: the partitions
      // are passed in.
      auto load_kv_tile = [&](int i, auto const& tma, uint64_t* empty, uint64_t* full,
                              uint32_t bytes, auto const& src, auto&& dst) {
        const RingSlot slot = ring_slot_of<kStages>(kv_count + i);
        Barrier::wait(&empty[slot.stage], slot.phase ^ 1);
        Barrier::arrive_and_expect_tx(&full[slot.stage], bytes);
        copy(tma.with(full[slot.stage]), src(_, work.n_last - 1 - i), dst(_, slot.stage));
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
          load_kv_tile(i - 1, params.tma_v, bar.v_empty, bar.v_full, Traits::kTmaBytesV, tVgV,
                       tVsV);
        }
      }
      if (n_tiles > 0) {
        load_kv_tile(n_tiles - 1, params.tma_v, bar.v_empty, bar.v_full, Traits::kTmaBytesV, tVgV,
                     tVsV);
      }
      kv_count += n_tiles;
    });
    return;
  }

  // ---- consumer warpgroups
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
  const int tid = int(threadIdx.x) - 128;
  using TileS = Shape<Int<kBlockM>, Int<kBlockN>>;
  using TileO = Shape<Int<kBlockM>, Int<Traits::kHeadDimV>>;
  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(tid);
  auto thr_pv = mma_pv.get_thread_slice(tid);
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);   // descriptors
  Tensor tSrK = thr_qk.partition_fragment_B(sK);   // (MMA, N, K, stage)
  Tensor tOrVt = thr_pv.partition_fragment_B(sVt);  // (MMA, N, K, stage)
  Tensor acc_o = partition_fragment_C(mma_pv, TileO{});
  Tensor out = make_tensor(acc_o.data(), gmma_accum_as_rows_cols(acc_o.layout()));
  Tensor cS = thr_qk.partition_C(make_identity_tensor(TileS{}));
  Tensor cS_rows_cols = make_tensor(cS.data(), gmma_accum_as_rows_cols(cS.layout()));
  Tensor cO = thr_pv.partition_C(make_identity_tensor(TileO{}));
  Tensor cO_rows_cols = make_tensor(cO.data(), gmma_accum_as_rows_cols(cO.layout()));
  constexpr int kRows = decltype(size<0>(out))::value;
  Tensor sO = make_tensor(make_smem_ptr(Traits::o_staging(storage)),
                          typename Traits::SmemLayoutORows{});
  auto o_r2s = make_tiled_copy_C(typename Traits::SmemStoreAtomO{}, mma_pv);
  auto o_r2s_thr = o_r2s.get_thread_slice(tid);
  typename Traits::TiledMmaPVChunk mma_o_chunk;
  auto o_chunk_r2s = make_tiled_copy_C(typename Traits::SmemStoreAtomO{}, mma_o_chunk);
  auto o_chunk_r2s_thr = o_chunk_r2s.get_thread_slice(tid);
  typename Traits::RowsO::Store o_store;
  auto o_store_thr = o_store.get_thread_slice(tid);

  const ConsumerTurns<Traits::kConsumerWarpgroups> turns{tid / 128};
  turns.start();

  int kv_count = 0;  // same counters as the producer's
  int q_count = 0;
  // Two-warpgroup kernels from head dim 128 test the next turn's operand
  // barriers early. The three-warpgroup tile's 160 registers do not hold the
  // two flags without spilling, and at head dim 64 (a short S product) the
  // early test measured 3% slower (NOTES 73).
  constexpr bool kTestOperandsEarly =
      Traits::kConsumerWarpgroups == 2 && Traits::kHeadDimV >= 128;
  // From head dim 128, a row's running maximum moves only when a tile raises
  // it by more than a factor 2^8 (online_softmax.cuh), so most turns skip
  // O's rescale (HeadDimV / 2 multiplies per thread). At 64 the check cost
  // more in the softmax than the rescale it saved (NOTES 73).
  constexpr int kMaxSlack = Traits::kHeadDimV >= 128 ? 8 : 0;
  // The softmax state and P live across tiles: both are reset after a
  // tile's epilogue, with O, rather than at the next tile's start.
  OnlineSoftmax<kRows> softmax;
  softmax.reset();
  clear(acc_o);
  // P of the key tile whose P V product is issued next.
  Tensor probs = make_tensor<Element>(partition_fragment_C(mma_qk, TileS{}).layout());
  Tensor tOrP = make_tensor(probs.data(), gmma_accum_as_operand_a(probs.layout()));
  for_each_tile(params.order, [&](QueryTile query_tile) {
    const Work work(p, query_tile);
    if (!work.has_rows()) return;
    const int head = work.tile.head;
    const int batch = work.tile.batch;
    const int m_begin = work.m_begin;
    const int n_last = work.n_last;
    const int n_tiles = work.n_tiles();
    auto const& mask = work.mask;

    const RingSlot q_slot = ring_slot_of<Traits::kQStages>(q_count);
    Barrier::wait(&bar.q_full[q_slot.stage], q_slot.phase);

    auto ring_slot = [&](int i) { return ring_slot_of<kStages>(kv_count + i); };
    auto issue_s = [&](auto& acc_s, int stage) {
      mma_qk.accumulate_ = GMMA::ScaleOut::Zero;
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tSrQ); ++k) {
        gemm(mma_qk, tSrQ(_, _, k, q_slot.stage), tSrK(_, _, k, stage), acc_s);
        mma_qk.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
    };
    auto issue_pv = [&](int stage) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tOrP); ++k) {
        gemm(mma_pv, tOrP(_, _, k), tOrVt(_, _, k, stage), acc_o);
      }
      warpgroup_commit_batch();
    };
    auto softmax_scores = [&](auto& acc_s, int i, auto needs_mask, auto first) {
      Tensor scores = make_tensor(acc_s.data(), gmma_accum_as_rows_cols(acc_s.layout()));
      if constexpr (decltype(needs_mask)::value) {
        mask.apply(scores, cS_rows_cols, m_begin, (n_last - 1 - i) * kBlockN);
      }
      return softmax.template update_scores<decltype(first)::value>(
          scores, p.scale_log2, std::integral_constant<int, kMaxSlack>{});
    };

    // Whether the next turn's operands (K_{i+1}, V_i) have landed, tested
    // while this turn's softmax or P V product runs: a completed barrier's
    // wait still costs a round trip to shared memory at the next turn.
    bool k_ready = false, v_ready = false;
    auto test_next_operands = [&](int i) {
      if constexpr (!kTestOperandsEarly) return;
      const RingSlot k_slot = ring_slot(i + 1);
      const RingSlot v_slot = ring_slot(i);
      k_ready = Barrier::test_wait(&bar.k_full[k_slot.stage], k_slot.phase, 1);
      v_ready = Barrier::test_wait(&bar.v_full[v_slot.stage], v_slot.phase, 1);
    };
    // Key tile 0: S alone (there is no P yet).
    auto first_tile = [&](auto needs_mask) {
      const RingSlot slot = ring_slot(0);
      Tensor acc_s = partition_fragment_C(mma_qk, TileS{});
      Barrier::wait(&bar.k_full[slot.stage], slot.phase);
      warpgroup_fence_operand(acc_s);
      turns.wait_turn();
      warpgroup_arrive();
      issue_s(acc_s, slot.stage);
      turns.hand_over();
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_s);
      Barrier::arrive(&bar.k_empty[slot.stage]);
      test_next_operands(0);
      softmax_scores(acc_s, 0, needs_mask, std::true_type{});
      convert_fragment_into(acc_s, probs);
    };
    // Key tile i >= 1: S_i and the previous tile's P V in one turn; S_i's
    // softmax runs while the P V product accumulates.
    auto next_tile = [&](int i, auto needs_mask) {
      const RingSlot slot = ring_slot(i);
      const RingSlot prev = ring_slot(i - 1);
      Tensor acc_s = partition_fragment_C(mma_qk, TileS{});
      // Both operands are waited for before the turn, which must not be held
      // while a load is late.
      if (!k_ready) Barrier::wait(&bar.k_full[slot.stage], slot.phase);
      if (!v_ready) Barrier::wait(&bar.v_full[prev.stage], prev.phase);
      warpgroup_fence_operand(acc_s);
      warpgroup_fence_operand(acc_o);
      turns.wait_turn();
      warpgroup_arrive();
      issue_s(acc_s, slot.stage);
      issue_pv(prev.stage);
      turns.hand_over();
      warpgroup_wait<1>();  // S_i; the P V product may still run
      warpgroup_fence_operand(acc_s);
      Barrier::arrive(&bar.k_empty[slot.stage]);
      const auto correction = softmax_scores(acc_s, i, needs_mask, std::false_type{});
      test_next_operands(i);
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_o);
      Barrier::arrive(&bar.v_empty[prev.stage]);
      // Warp-uniform: with the lazy maximum most turns skip the rescale.
      if constexpr (kMaxSlack == 0) {
        softmax.rescale(out, correction);
      } else if (__any_sync(0xffffffffu, correction.any)) {
        softmax.rescale(out, correction);
      }
      convert_fragment_into(acc_s, probs);
    };
    // The last tile's P V, alone.
    auto last_product = [&]() {
      const RingSlot slot = ring_slot(n_tiles - 1);
      if (!v_ready) Barrier::wait(&bar.v_full[slot.stage], slot.phase);
      warpgroup_fence_operand(acc_o);
      turns.wait_turn();
      warpgroup_arrive();
      issue_pv(slot.stage);
      turns.hand_over();
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_o);
      Barrier::arrive(&bar.v_empty[slot.stage]);
    };

    auto tile_needs_mask = [&](int i) {
      return mask.tile_needs_mask(m_begin, (n_last - 1 - i) * kBlockN, kBlockM, kBlockN);
    };
    if (n_tiles == 0) {
      // No key is visible to the tile's rows: O is 0 and the LSE -inf, as
      // finalize gives such rows, stored from registers on a path of its
      // own, so that the other tiles' products, epilogue and resets are one
      // straight block (measured faster, NOTES 72).
      Barrier::arrive(&bar.q_empty[q_slot.stage]);
      if constexpr (Traits::kHasLse) {
        if (p.lse != nullptr && get<1>(cO_rows_cols(0, 0)) == 0) {
          float* lse_out = p.lse + (kGroup ? work.seq.q_token0 : batch * p.lse_batch_stride) +
                           head * p.lse_head_stride;
          CUTE_UNROLL
          for (int r = 0; r < kRows; ++r) {
            int row = m_begin + get<0>(cO_rows_cols(r, 0));
            if (row < work.seq.seqlen_q) lse_out[row] = -INFINITY;
          }
        }
      }
      const int64_t origin =
          kGroup ? work.seq.q_token0 * p.o_row_stride : batch * p.o_batch_stride;
      Tensor zeros = make_tensor<Element>(acc_o.layout());
      fill(zeros, Element(0.f));
      store_fragment_rows(make_tensor(zeros.data(), gmma_accum_as_rows_cols(zeros.layout())),
                          cO_rows_cols,
                          static_cast<Element*>(p.o) + origin + head * p.o_head_stride +
                              m_begin * p.o_row_stride,
                          p.o_row_stride, work.seq.seqlen_q - m_begin);
      ++q_count;
      return;
    }
    if (tile_needs_mask(0)) {
      first_tile(std::true_type{});
    } else {
      first_tile(std::false_type{});
    }
    // Same order as the sm80 path: masked tiles at the end of the keys and
    // on the diagonal, then unmasked ones, then (windows only) the left edge.
    int i = 1;
    for (; i < n_tiles && tile_needs_mask(i); ++i) next_tile(i, std::true_type{});
    for (; i < n_tiles && !tile_needs_mask(i); ++i) next_tile(i, std::false_type{});
    if constexpr (Traits::kMask == MaskMode::kWindow) {
      for (; i < n_tiles; ++i) next_tile(i, std::true_type{});
    }
    // Q is free once this warpgroup's last S product is done.
    Barrier::arrive(&bar.q_empty[q_slot.stage]);
    last_product();
    kv_count += n_tiles;

    // ---- epilogue
    float lse[kRows];
    softmax.template finalize<false>(out, p.scale_log2, 0.f, 1.f, lse);

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

    Tensor rO = convert_fragment<Element>(acc_o);
    const int64_t o_origin =
        kGroup ? work.seq.q_token0 * p.o_row_stride : batch * p.o_batch_stride;
    auto* o_base = static_cast<Element*>(p.o) + o_origin + head * p.o_head_stride +
                   m_begin * p.o_row_stride;
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
          Tensor gO = local_tile(mO(_, _, head, batch), Shape<Int<kHalf>, Int<kChunk>>{},
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
    ++q_count;
    clear(acc_o);
    softmax.reset();
  });
  // Shared memory must outlive the last stores' reads.
  if constexpr (Traits::kOutputPath == Sm90OutputPath::kTmaStore) {
    if (tid % 128 == 0) tma_store_wait<0>();
  }
}

}  // namespace ckfmha::kernel
