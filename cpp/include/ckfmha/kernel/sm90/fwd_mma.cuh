// The consumer side of the Hopper forward on the tensor cores: consumer
// warpgroups (two or three, 64 query rows each), software-pipelined by one
// key tile. In one turn a warpgroup issues S_i = Q K_i^T and O += P_{i-1}
// V_{i-1} (wgmma; P from registers), then runs the mask and online softmax
// of S_i while its own P V product and the other warpgroups' products keep
// the tensor cores busy; O is rescaled for S_i's new maxima once that P V
// product has landed.
// The consumer warpgroups take turns issuing (ConsumerTurns), so their
// softmaxes interleave instead of meeting. A turn's critical path is one
// warpgroup's own chain (S product, softmax, O rescale, the next operands'
// barriers), so from head dim 128 two pieces are cut from it: a row's
// running maximum moves only by more than a factor 2^8 (most turns skip the
// rescale), and the next turn's barriers are tested under the softmax.
#pragma once

#include "ckfmha/kernel/common/fragment_layout.cuh"
#include "ckfmha/kernel/common/logit_transform.cuh"
#include "ckfmha/kernel/common/online_softmax.cuh"
#include "ckfmha/kernel/common/philox_dropout.cuh"
#include "ckfmha/kernel/params/fwd_params.h"
#include "ckfmha/kernel/sm90/fwd_fp8.cuh"
#include "ckfmha/kernel/sm90/fwd_ring.cuh"  // RingSlot

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace ckfmha::kernel {

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

// A consumer thread's (row, column) coordinates in a wgmma accumulator tile.
template <class ThrMma, class Tile>
__device__ __forceinline__ auto gmma_accum_coords(ThrMma const& thr_mma, Tile const& tile) {
  using namespace cute;
  Tensor coords = thr_mma.partition_C(make_identity_tensor(tile));
  return make_tensor(coords.data(), gmma_accum_as_rows_cols(coords.layout()));
}

// What a consumer thread accumulates over a query tile's key tiles: the
// online softmax's running maxima and sums, O, and P of the key tile whose
// P V product is issued next. Both the softmax state and O are reset after a
// tile's epilogue rather than at the next tile's start. The members' order
// and a struct of their own are not free: kept with the operands
// (FwdSm90Mma), or with O first, they changed the order of ptxas's input
// (its virtual registers' numbers), and with it the schedule.
struct NoFp8RowScales {};
struct NoBiasTile {};

template <class Traits>
struct FwdSm90Accumulators {
  using TileS = cute::Shape<cute::Int<Traits::kBlockM>, cute::Int<Traits::kBlockN>>;
  using TileO = cute::Shape<cute::Int<Traits::kBlockM>, cute::Int<Traits::kHeadDimV>>;
  using AccO = decltype(cute::partition_fragment_C(typename Traits::TiledMmaPV{}, TileO{}));
  static constexpr int kRows =
      decltype(cute::size<0>(gmma_accum_as_rows_cols(AccO{}.layout())))::value;

  OnlineSoftmax<kRows> softmax;
  AccO acc_o;
  // P as the P V product's A: S's own layout in fp16/bf16, or (fp8) e4m3
  // words in the A operand's order (fwd_fp8.cuh).
  std::conditional_t<Traits::kQkvFp8, ProbsE4m3<Traits>,
                     decltype(cute::make_tensor<typename Traits::Element>(
                         cute::partition_fragment_C(typename Traits::TiledMmaQK{}, TileS{})
                             .layout()))>
      probs;
  // fp8: q's dequantisation scales of this thread's rows (fwd_fp8.cuh).
  std::conditional_t<Traits::kQkvFp8, Fp8RowScales<kRows>, NoFp8RowScales> scales;

  // O seen as (rows, cols), as the softmax reads it.
  __device__ __forceinline__ auto out() {
    return cute::make_tensor(acc_o.data(), gmma_accum_as_rows_cols(acc_o.layout()));
  }
};

// A consumer thread's side of both products, made once: the tiled MMAs, the
// shared-memory descriptors of Q, K and V^T, and the (row, column) of each
// accumulator element of S and O.
template <class Traits>
struct FwdSm90Mma {
  using Element = typename Traits::InputElement;
  using TileS = cute::Shape<cute::Int<Traits::kBlockM>, cute::Int<Traits::kBlockN>>;
  using TileO = cute::Shape<cute::Int<Traits::kBlockM>, cute::Int<Traits::kHeadDimV>>;
  using Accumulators = FwdSm90Accumulators<Traits>;
  // Bias, ALiBi and soft-cap rewrite S into log2-domain logits before the
  // mask (the softmax then runs at unit scale). An elementwise bias tile
  // comes through a TMA-fed shared-memory ring where the bias fits TMA
  // (fwd_bias_ring.cuh); otherwise it is read into registers at the start of
  // its turn, so that the loads run under the turn's products (staged a turn
  // ahead with cp.async by the consumers instead, it ran slower: NOTES 90).
  using Transform = LogitTransform<typename Traits::Element, Traits::kBias, Traits::kHasSoftcap>;
  static constexpr bool kBiasAhead = Traits::kBias == BiasMode::kElementwise;
  using ScoresLayout = decltype(gmma_accum_as_rows_cols(
      cute::partition_fragment_C(typename Traits::TiledMmaQK{}, TileS{}).layout()));
  using BiasTile = std::conditional_t<
      kBiasAhead,
      decltype(cute::make_tensor<typename Traits::Element>(ScoresLayout{})), NoBiasTile>;
  using SmemQ = decltype(cute::make_tensor(cute::make_smem_ptr(std::declval<Element*>()),
                                           typename Traits::SmemLayoutQRing{}));
  using SmemK = decltype(cute::make_tensor(cute::make_smem_ptr(std::declval<Element*>()),
                                           typename Traits::SmemLayoutK{}));
  using SmemVt = decltype(cute::make_tensor(cute::make_smem_ptr(std::declval<Element*>()),
                                            typename Traits::SmemLayoutVt{}));

  // Two-warpgroup kernels from head dim 128 test the next turn's operand
  // barriers early. The three-warpgroup tile's 160 registers do not hold the
  // two flags without spilling, and at head dim 64 (a short S product) the
  // early test measured 3% slower (NOTES 73).
  static constexpr bool kTestOperandsEarly =
      Traits::kConsumerWarpgroups == 2 && Traits::kHeadDimV >= 128;
  // From head dim 128, a row's running maximum moves only when a tile raises
  // it by more than a factor 2^8 (common/online_softmax.cuh), so most turns
  // skip O's rescale (HeadDimV / 2 multiplies per thread). At 64 the check
  // cost more in the softmax than the rescale it saved (NOTES 73).
  // fp8: P peaks between 2^offset and 2^(offset + slack), which must stay
  // below e4m3's 448 (fwd_fp8.cuh).
  static constexpr int kMaxSlack =
      Traits::kQkvFp8 ? kFp8MaxSlackLog2 : (Traits::kHeadDimV >= 128 ? 8 : 0);
  static constexpr int kProbOffset = Traits::kQkvFp8 ? kFp8ProbOffsetLog2 : 0;

  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  decltype(mma_qk.get_thread_slice(0)) thr_qk;
  decltype(mma_pv.get_thread_slice(0)) thr_pv;
  decltype(thr_qk.partition_fragment_A(std::declval<SmemQ>())) tSrQ;    // descriptors
  decltype(thr_qk.partition_fragment_B(std::declval<SmemK>())) tSrK;    // (MMA, N, K, stage)
  decltype(thr_pv.partition_fragment_B(std::declval<SmemVt>())) tOrVt;  // (MMA, N, K, stage)
  decltype(gmma_accum_coords(thr_qk, TileS{})) cS_rows_cols;
  decltype(gmma_accum_coords(thr_pv, TileO{})) cO_rows_cols;

  // `tid` counts from 0 over the consumer warpgroups.
  __device__ __forceinline__ FwdSm90Mma(SmemQ const& sQ, SmemK const& sK, SmemVt const& sVt,
                                        int tid)
      : thr_qk(mma_qk.get_thread_slice(tid)), thr_pv(mma_pv.get_thread_slice(tid)),
        tSrQ(thr_qk.partition_fragment_A(sQ)), tSrK(thr_qk.partition_fragment_B(sK)),
        tOrVt(thr_pv.partition_fragment_B(sVt)),
        cS_rows_cols(gmma_accum_coords(thr_qk, TileS{})),
        cO_rows_cols(gmma_accum_coords(thr_pv, TileO{})) {}

  // S = Q K^T of one key tile into acc_s, both operands from shared memory;
  // `Accumulate`: added to what acc_s holds (a row-broadcast bias,
  // FwdBiasRingReader::init_scores).
  template <bool Accumulate = false, class AccS>
  __device__ __forceinline__ void issue_s(AccS& acc_s, int q_stage, int stage) {
    using namespace cute;
    mma_qk.accumulate_ = Accumulate ? GMMA::ScaleOut::One : GMMA::ScaleOut::Zero;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tSrQ); ++k) {
      gemm(mma_qk, tSrQ(_, _, k, q_stage), tSrK(_, _, k, stage), acc_s);
      mma_qk.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
  }

  // O += P V of the previous key tile, P from registers.
  __device__ __forceinline__ void issue_pv(Accumulators& acc, int stage) {
    using namespace cute;
    auto operand_a = [&]() {
      if constexpr (Traits::kQkvFp8) {
        return make_tensor(acc.probs.data(), acc.probs.layout());
      } else {
        return make_tensor(acc.probs.data(), gmma_accum_as_operand_a(acc.probs.layout()));
      }
    };
    Tensor tOrP = operand_a();
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tOrP); ++k) {
      gemm(mma_pv, tOrP(_, _, k), tOrVt(_, _, k, stage), acc.acc_o);
    }
    warpgroup_commit_batch();
  }

  // Every key tile of one query tile through S, the softmax and the P V
  // product, from the last to the first as on the sm80 path: the tiles
  // crossing the end of the keys or the causal diagonal come first. Q (its
  // buffer at q_slot) is released once this warpgroup's last S product is
  // done. `kv_count`: the K/V tiles loaded into the ring before this query
  // tile's; `out`: acc's O as (rows, cols), the one view the caller made.
  // Both are taken as they were when this was the kernel's own code: a copy
  // of kv_count reordered the ring slots' index sums in ptxas's input, and a
  // view of O made here renumbered the softmax state's registers, and either
  // changed the schedule.
  // `BlockScales`: fp8 per-block scales (p.fp8_block_scales), a loop of its
  // own so that per-tensor scales keep their loop as it was: sharing one
  // with a run-time test per tile cost them 10-14% (NOTES 85).
  // `bias_ring`: the reader of the elementwise bias ring (fwd_bias_ring.cuh)
  // where this query tile's bias comes through it, else nullptr (no bias, or
  // read into registers a tile ahead).
  template <bool BlockScales, class Work, class Barriers, class Turns, class Out,
            class BiasRingReader = std::nullptr_t>
  __device__ __forceinline__ void attend(FwdParams const& p, Barriers& bar, Turns const& turns,
                                         Work const& work, RingSlot q_slot,
                                         int const& kv_count, Accumulators& acc, Out& out,
                                         BiasRingReader bias_ring = nullptr) {
    using namespace cute;
    using Barrier = cutlass::arch::ClusterTransactionBarrier;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kStages = Traits::kStages;
    const int m_begin = work.m_begin;
    const int n_last = work.n_last;
    const int n_tiles = work.n_tiles();
    auto const& mask = work.mask;
    auto& acc_o = acc.acc_o;
    auto& softmax = acc.softmax;
    auto& probs = acc.probs;
    const Transform transform = Transform::for_sequence(p, work.seq.seqlen_q, work.seq.seqlen_k,
                                                        work.tile.batch, work.tile.head);
    PhiloxDropout dropout{};
    if constexpr (Traits::kHasDropout) {
      dropout = PhiloxDropout::for_sequence(p, work.seq.seqlen_q, work.seq.seqlen_k,
                                            work.tile.batch, work.tile.head);
    }
    // Key tile i's first key (tiles run from the last to the first).
    auto n_begin_of = [&](int i) { return (n_last - 1 - i) * kBlockN; };
    constexpr bool kBiasFromRing = !std::is_same_v<BiasRingReader, std::nullptr_t>;
    // Row mode without a soft-cap: each S product starts from the bias row.
    constexpr bool kInitScores = [] {
      if constexpr (kBiasFromRing) {
        return std::remove_pointer_t<BiasRingReader>::kInitsScores;
      } else {
        return false;
      }
    }();
    using TileOfBias = std::conditional_t<kBiasFromRing, NoBiasTile, BiasTile>;
    auto read_bias = [&](int i) {
      TileOfBias bias{};
      if constexpr (kBiasAhead && !kBiasFromRing) {
        transform.load_bias(bias, cS_rows_cols, m_begin, n_begin_of(i));
      }
      return bias;
    };

    auto ring_slot = [&](int i) { return ring_slot_of<kStages>(kv_count + i); };
    // fp8: q's and k's dequantisation scales join the softmax scale: once per
    // query tile, or (block scales) per row and key tile, key tile i's read
    // before the tile's barriers so that the loads hide under them.
    float fp8_scale_log2 = 0.f;
    if constexpr (Traits::kQkvFp8 && !BlockScales) {
      fp8_scale_log2 = fp8_qk_scale_log2(p, work.tile.head);
    }
    if constexpr (BlockScales) acc.scales.start(p, work, cS_rows_cols);
    auto key_scales = [&](int i) {
      if constexpr (BlockScales) {
        return fp8_key_block_scales(p, work, (n_last - 1 - i) * kBlockN);
      } else {
        return make_float2(0.f, 0.f);
      }
    };
    auto softmax_scores = [&](auto& acc_s, int i, float k_scale, auto needs_mask, auto first,
                              TileOfBias const& bias) {
      Tensor scores = make_tensor(acc_s.data(), gmma_accum_as_rows_cols(acc_s.layout()));
      if constexpr (kBiasFromRing) {
        if constexpr (!kInitScores) bias_ring->add(transform, scores, cS_rows_cols, kv_count + i);
      } else if constexpr (kBiasAhead) {
        transform.apply_loaded(scores, bias);
      } else if constexpr (Transform::kCapScaledBySoftmax) {
        transform.cap_scores(scores);
      } else if constexpr (Transform::kAlibiInScoreUnits) {
        transform.alibi_scores(scores, cS_rows_cols, m_begin, n_begin_of(i));
      } else if constexpr (Transform::kActive) {
        transform.apply(scores, cS_rows_cols, m_begin, n_begin_of(i));
      }
      if constexpr (decltype(needs_mask)::value) {
        mask.apply(scores, cS_rows_cols, m_begin, n_begin_of(i));
      }
      if constexpr (Traits::kQkvFp8 && !BlockScales) {
        return softmax.template update_scores<decltype(first)::value>(
            scores, fp8_scale_log2, std::integral_constant<int, kMaxSlack>{},
            std::integral_constant<int, kProbOffset>{}, std::true_type{});
      } else if constexpr (BlockScales) {
        float factor[Accumulators::kRows];
        CUTE_UNROLL
        for (int r = 0; r < Accumulators::kRows; ++r) factor[r] = acc.scales.q_log2[r] * k_scale;
        return softmax.template update_scaled_scores<decltype(first)::value>(
            scores, factor, std::integral_constant<int, kMaxSlack>{},
            std::integral_constant<int, kProbOffset>{});
      } else if constexpr (Transform::kActive) {
        return softmax.template update_scores<decltype(first)::value>(
            scores, Transform::softmax_scale_log2(p), std::integral_constant<int, kMaxSlack>{});
      } else {
        return softmax.template update_scores<decltype(first)::value>(
            scores, p.scale_log2, std::integral_constant<int, kMaxSlack>{});
      }
    };
    // Dropout zeroes probabilities after the row sums took them (finalize
    // scales O by 1 / (1 - p)).
    auto drop = [&](auto& acc_s, int i) {
      if constexpr (Traits::kHasDropout) {
        Tensor probs_rc = make_tensor(acc_s.data(), gmma_accum_as_rows_cols(acc_s.layout()));
        dropout.apply_per_call(probs_rc, cS_rows_cols, m_begin, n_begin_of(i));
      }
    };
    auto store_probs = [&](auto const& acc_s) {
      if constexpr (Traits::kQkvFp8) {
        quantize_probs_e4m3(acc_s, probs);
      } else {
        convert_fragment_into(acc_s, probs);
      }
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
    // The turns are inlined by force: with the feature code ptxas made them
    // calls and kept the accumulators on the stack (NOTES 90).
    // Key tile 0: S alone (there is no P yet).
    auto first_tile = [&](auto needs_mask) __attribute__((always_inline)) {
      const RingSlot slot = ring_slot(0);
      const float2 kv_scales = key_scales(0);
      const TileOfBias bias = read_bias(0);
      Tensor acc_s = partition_fragment_C(mma_qk, TileS{});
      if constexpr (kInitScores) bias_ring->init_scores(acc_s, cS_rows_cols, kv_count);
      Barrier::wait(&bar.k_full[slot.stage], slot.phase);
      warpgroup_fence_operand(acc_s);
      turns.wait_turn();
      warpgroup_arrive();
      issue_s<kInitScores>(acc_s, q_slot.stage, slot.stage);
      turns.hand_over();
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_s);
      Barrier::arrive(&bar.k_empty[slot.stage]);
      test_next_operands(0);
      softmax_scores(acc_s, 0, kv_scales.x, needs_mask, std::true_type{}, bias);
      drop(acc_s, 0);
      store_probs(acc_s);
    };
    // Key tile i >= 1: S_i and the previous tile's P V in one turn; S_i's
    // softmax runs while the P V product accumulates.
    auto next_tile = [&](int i, auto needs_mask) __attribute__((always_inline)) {
      const RingSlot slot = ring_slot(i);
      const RingSlot prev = ring_slot(i - 1);
      const float2 kv_scales = key_scales(i);
      // Block scales: O moves from the previous tile's v units into this one's.
      const float v_before = BlockScales ? key_scales(i - 1).y : 0.f;
      const TileOfBias bias = read_bias(i);
      Tensor acc_s = partition_fragment_C(mma_qk, TileS{});
      if constexpr (kInitScores) bias_ring->init_scores(acc_s, cS_rows_cols, kv_count + i);
      // Both operands are waited for before the turn, which must not be held
      // while a load is late.
      if (!k_ready) Barrier::wait(&bar.k_full[slot.stage], slot.phase);
      if (!v_ready) Barrier::wait(&bar.v_full[prev.stage], prev.phase);
      warpgroup_fence_operand(acc_s);
      warpgroup_fence_operand(acc_o);
      turns.wait_turn();
      warpgroup_arrive();
      issue_s<kInitScores>(acc_s, q_slot.stage, slot.stage);
      issue_pv(acc, prev.stage);
      turns.hand_over();
      warpgroup_wait<1>();  // S_i; the P V product may still run
      warpgroup_fence_operand(acc_s);
      Barrier::arrive(&bar.k_empty[slot.stage]);
      auto correction =
          softmax_scores(acc_s, i, kv_scales.x, needs_mask, std::false_type{}, bias);
      drop(acc_s, i);
      test_next_operands(i);
      if constexpr (BlockScales) {
        const float v_ratio = v_before / kv_scales.y;
        CUTE_UNROLL
        for (int r = 0; r < Accumulators::kRows; ++r) correction.row[r] *= v_ratio;
        correction.any = true;
      }
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_o);
      Barrier::arrive(&bar.v_empty[prev.stage]);
      // Warp-uniform: with the lazy maximum most turns skip the rescale.
      if constexpr (kMaxSlack == 0) {
        softmax.rescale(out, correction);
      } else if (__any_sync(0xffffffffu, correction.any)) {
        softmax.rescale(out, correction);
      }
      store_probs(acc_s);
    };
    // The last tile's P V, alone.
    auto last_product = [&]() __attribute__((always_inline)) {
      const RingSlot slot = ring_slot(n_tiles - 1);
      if (!v_ready) Barrier::wait(&bar.v_full[slot.stage], slot.phase);
      warpgroup_fence_operand(acc_o);
      turns.wait_turn();
      warpgroup_arrive();
      issue_pv(acc, slot.stage);
      turns.hand_over();
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_o);
      Barrier::arrive(&bar.v_empty[slot.stage]);
    };

    auto tile_needs_mask = [&](int i) {
      return mask.tile_needs_mask(m_begin, n_begin_of(i), kBlockM, kBlockN);
    };
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
  }
};

}  // namespace ckfmha::kernel
