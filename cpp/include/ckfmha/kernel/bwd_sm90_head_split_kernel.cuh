// Backward attention on Hopper at head dim 256, the main stage
// (bwd_dq_dk_dv): TMA loads and wgmma, warp-specialized. One CTA per key
// tile (64 keys of one KV head and batch entry) walks the query tiles (64
// rows) of every query head of the KV head's group, so GQA and MQA sum dK
// and dV in registers. The producer warpgroup is bwd_sm90_ring.cuh's.
// Both consumer warpgroups work on all 64 keys (bwd_sm90_head_split_traits.cuh),
// per query tile:
//   S^T = K Q^T and dP^T = V dO^T, each warpgroup for its 32 queries (P^T is
//   computed and stored while dP^T runs); P^T and dS^T = P^T (dP^T - D) go
//   to shared memory; after a barrier each warpgroup computes its 128
//   columns of dQ = dS K, dV += P^T dO and dK += dS^T Q over all 64 queries
//   and keys. dQ is then staged in the bytes of the tile's Q/dO stage that
//   only its warpgroup read, and added to the fp32 accumulator by TMA
//   reduce-adds (fast mode only: the order of the adds is not fixed); the
//   stage is released once they have read it, behind the next tile's S^T
//   and dP^T.
#pragma once

#include "ckfmha/kernel/attention_mask.cuh"
#include "ckfmha/kernel/bwd_params.h"
#include "ckfmha/kernel/bwd_sm90_epilogue.cuh"
#include "ckfmha/kernel/bwd_sm90_head_split_traits.cuh"
#include "ckfmha/kernel/bwd_sm90_ring.cuh"
#include "ckfmha/kernel/bwd_sm90_scores.cuh"
#include "ckfmha/kernel/bwd_workspace_rows.cuh"
#include "ckfmha/kernel/fragment_layout.cuh"
#include "ckfmha/kernel/shared_storage.cuh"
#include "ckfmha/kernel/tile_copy.cuh"

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace ckfmha::kernel {

template <class Traits>
struct BwdSm90HeadSplitParams {
  BwdParams p;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaQ tma_do;
  typename Traits::TmaK tma_k;
  typename Traits::TmaK tma_v;
  typename Traits::TmaDq tma_dq;
};

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    bwd_dq_dk_dv_sm90_head_split_kernel(
        __grid_constant__ const BwdSm90HeadSplitParams<Traits> params) {
  using namespace cute;
  using Element = typename Traits::Element;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using Storage = typename Traits::SharedStorage;
  using M = typename Traits::M;
  using N = typename Traits::N;
  using D = typename Traits::D;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kD = Traits::kHeadDim;
  constexpr int kStages = Traits::kStages;
  BwdParams const& p = params.p;

  const int n_block = blockIdx.x;
  const int head_k = blockIdx.y;
  const int batch = blockIdx.z;
  const int n_begin = n_block * kBlockN;
  const AttentionMask<Traits::kMask> mask{p.seqlen_k, p.bottom_right ? p.seqlen_k - p.seqlen_q : 0,
                                          p.window_left, p.window_right};
  int iters;
  const BwdSm90QueryWalk walk = bwd_sm90_query_walk<Traits>(p, mask, n_begin, head_k, &iters);

  extern __shared__ char smem_raw[];
  Storage* storage = shared_storage_at_1024<Storage>(smem_raw);
  auto& bar = storage->bar;
  const int warp = int(threadIdx.x) / 32;
  const int lane = int(threadIdx.x) % 32;
  if (threadIdx.x == 0) bwd_sm90_init_barriers<Traits>(bar);
  __syncthreads();

  if (warp < 4) {
    // ---- producer warpgroup
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if (warp == 0 && lane == 0) {
      bwd_sm90_load_tiles<Traits>(params, storage, walk, iters, n_block, head_k, batch);
    }
    return;
  }

  // ---- consumer warpgroups
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
  const int tid = int(threadIdx.x) - 128;
  Tensor sKt = make_tensor(make_smem_ptr(storage->k.data()), typename Traits::SmemLayoutKt{});
  Tensor sQt = make_tensor(make_smem_ptr(storage->q.data()), typename Traits::SmemLayoutQt{});
  Tensor sdOt = make_tensor(make_smem_ptr(storage->dout.data()), typename Traits::SmemLayoutQt{});
  Tensor sPt = make_tensor(make_smem_ptr(storage->pt.data()), typename Traits::SmemLayoutPt{});
  Tensor sdS = make_tensor(make_smem_ptr(storage->ds.data()), typename Traits::SmemLayoutPt{});
  Tensor sdSt = make_tensor(make_smem_ptr(storage->ds.data()), typename Traits::SmemLayoutdSt{});

  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmadKV mma_dkv;
  typename Traits::TiledMmadQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_dkv = mma_dkv.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);
  // Shared-memory descriptors: (MMA, M or N, K[, stage or buffer]).
  Tensor tdVrPt = thr_dkv.partition_fragment_A(sPt);
  Tensor tdVrdOt = thr_dkv.partition_fragment_B(sdOt);
  Tensor tdKrdS = thr_dkv.partition_fragment_A(sdS);
  Tensor tdKrQt = thr_dkv.partition_fragment_B(sQt);
  Tensor tdQrdSt = thr_dq.partition_fragment_A(sdSt);
  // dQ as two products of 128 columns: K^T's first and last 128 rows as B.
  using DqCols = Int<Traits::kDqCols * Traits::kConsumerWarpgroups>;
  Tensor tdQrKt_first =
      thr_dq.partition_fragment_B(local_tile(sKt, Shape<DqCols, N>{}, make_coord(0, 0)));
  Tensor tdQrKt_second =
      thr_dq.partition_fragment_B(local_tile(sKt, Shape<DqCols, N>{}, make_coord(1, 0)));

  using TileSt = Shape<N, M>;  // (keys, queries)
  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<N, D>{});
  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<N, D>{});
  Tensor acc_s = partition_fragment_C(mma_sdp, TileSt{});
  Tensor acc_dp = partition_fragment_C(mma_sdp, TileSt{});
  Tensor cS = thr_sdp.partition_C(make_identity_tensor(TileSt{}));
  Tensor cS_rows_cols = make_tensor(cS.data(), gmma_accum_as_rows_cols(cS.layout()));
  Tensor probs = make_tensor(acc_s.data(), gmma_accum_as_rows_cols(acc_s.layout()));
  Tensor dscores = make_tensor(acc_dp.data(), gmma_accum_as_rows_cols(acc_dp.layout()));
  auto st_r2s = make_tiled_copy_C(typename Traits::SmemStoreAtomPt{}, mma_sdp);
  auto st_r2s_thr = st_r2s.get_thread_slice(tid);
  Tensor tPsPt = st_r2s_thr.partition_D(sPt);    // (CPY, CPY_M, CPY_N, buffer)
  Tensor tdSsdS = st_r2s_thr.partition_D(sdS);  // (CPY, CPY_M, CPY_N, buffer)
  const int warpgroup = tid / 128;
  // One thread per warpgroup adds its staged dQ and releases the stages.
  const bool issues_dq = tid % 128 == 0;
  const uint32_t warpgroup_barrier = kBwdSm90FirstWarpgroupBarrierId + warpgroup;
  // This thread's part of a dQ product staged in the Q ring (the first
  // product) or the dO ring (the second), and warpgroup `w`'s piece of it in
  // stage `stage` as a TMA source.
  float* q_ring = reinterpret_cast<float*>(storage->q.data());
  float* dout_ring = reinterpret_cast<float*>(storage->dout.data());
  auto dq_r2s = make_tiled_copy_C(typename Traits::SmemStoreAtomdQ{}, mma_dq);
  auto dq_r2s_thr = dq_r2s.get_thread_slice(tid);
  Tensor tdQsdQ_first = dq_r2s_thr.partition_D(
      make_tensor(make_smem_ptr(q_ring), typename Traits::SmemLayoutdQStages{}));
  Tensor tdQsdQ_second = dq_r2s_thr.partition_D(
      make_tensor(make_smem_ptr(dout_ring), typename Traits::SmemLayoutdQStages{}));
  auto dq_piece = [&](float* ring, int stage) __attribute__((always_inline)) {
    float* piece =
        ring + stage * Traits::kDqStageStride + warpgroup * Traits::kDqWarpgroupStride;
    return make_tensor(make_smem_ptr(piece), typename Traits::SmemLayoutdQPiece{});
  };
  Tensor mdQ = params.tma_dq.get_tma_tensor(make_shape(p.workspace_rows, kD, p.nhead_q * p.batch));
  auto dq_tma = params.tma_dq.get_slice(Int<0>{});

  clear(acc_dk);
  clear(acc_dv);
  Barrier::wait(&bar.kv_full, 0);

  // One product of shared-memory operands as one wgmma batch.
  auto issue = [&](auto& mma, auto const& a, auto const& b, auto& acc, bool zero_init)
                   __attribute__((always_inline)) {
    warpgroup_fence_operand(acc);
    warpgroup_arrive();
    mma.accumulate_ = zero_init ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(a); ++k) {
      gemm(mma, a(_, _, k), b(_, _, k), acc);
      mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
  };

  // S^T and dP^T of query tile `it`, once its stage has landed. Their
  // descriptors are rebuilt from pointers the compiler cannot see through:
  // hoisted out of the loop, they would hold over a hundred registers.
  auto issue_sdp = [&](int it) __attribute__((always_inline)) {
    const int stage = it % kStages;
    Barrier::wait(&bar.q_full[stage], (it / kStages) & 1);
    Element* k = storage->k.data();
    Element* v = storage->v.data();
    Element* q = storage->q.data();
    Element* dout = storage->dout.data();
    asm volatile("" : "+l"(k), "+l"(v), "+l"(q), "+l"(dout));
    auto operand_a = [&](Element* tile) __attribute__((always_inline)) {
      return thr_sdp.partition_fragment_A(
          make_tensor(make_smem_ptr(tile), typename Traits::SmemLayoutK{}));
    };
    auto operand_b = [&](Element* ring) __attribute__((always_inline)) {
      return thr_sdp.partition_fragment_B(
          make_tensor(make_smem_ptr(ring), typename Traits::SmemLayoutQ{}))(_, _, _, stage);
    };
    issue(mma_sdp, operand_a(k), operand_b(q), acc_s, true);
    issue(mma_sdp, operand_a(v), operand_b(dout), acc_dp, true);
  };
  // P^T of tile `it` once its S^T is done (dP^T may still run), to shared
  // memory as the A operand of dV. This buffer's last readers (two tiles
  // ago) are done: both warpgroups have waited for their products since.
  auto probabilities_to_smem = [&](int it) __attribute__((always_inline)) {
    const int stage = it % kStages;
    warpgroup_fence_operand(acc_s);
    const int m_begin = walk.m_block(it) * kBlockM;
    if (mask.tile_needs_mask(m_begin, n_begin, kBlockM, kBlockN)) {
      bwd_sm90_probabilities<true>(probs, cS_rows_cols, mask, storage->lse_log2[stage],
                                   p.scale_log2, m_begin, n_begin);
    } else {
      bwd_sm90_probabilities<false>(probs, cS_rows_cols, mask, storage->lse_log2[stage],
                                    p.scale_log2, m_begin, n_begin);
    }
    Tensor rP = make_tensor<Element>(acc_s.layout());
    convert_fragment_into(acc_s, rP);
    copy(st_r2s, st_r2s_thr.retile_S(rP), tPsPt(_, _, _, it & 1));
  };

  // Everything of tile `it` after its P^T, with dP^T done. With
  // `issues_next`, the next tile's S^T and dP^T go to the tensor cores
  // right behind this tile's dQ, dV and dK, so they run while dQ is staged
  // and the next P^T is computed; no product is in flight across the
  // loop's back edge.
  auto finish_tile = [&](int it, auto issues_next) __attribute__((always_inline)) {
    constexpr bool kNext = decltype(issues_next)::value;
    const int stage = it % kStages;
    const int buffer = it & 1;
    warpgroup_fence_operand(acc_dp);
    bwd_sm90_score_gradients(dscores, probs, cS_rows_cols, storage->delta[stage]);
    Tensor rdS = make_tensor<Element>(acc_dp.layout());
    convert_fragment_into(acc_dp, rdS);
    copy(st_r2s, st_r2s_thr.retile_S(rdS), tdSsdS(_, _, _, buffer));
    // wgmma reads shared memory through the async proxy.
    cutlass::arch::fence_view_async_shared();
    // Both warpgroups' queries of P^T and dS^T are in shared memory.
    cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, kBwdSm90ConsumerBarrierId);

    // dK reads this warpgroup's columns of Q, dV those of dO: each dQ
    // product goes right behind the one that frees its piece's bytes.
    Tensor acc_dq = partition_fragment_C(mma_dq, Shape<M, DqCols>{});
    issue(mma_dkv, tdKrdS(_, _, _, buffer), tdKrQt(_, _, _, stage), acc_dk, false);
    issue(mma_dq, tdQrdSt(_, _, _, buffer), tdQrKt_first, acc_dq, true);
    issue(mma_dkv, tdVrPt(_, _, _, buffer), tdVrdOt(_, _, _, stage), acc_dv, false);
    Tensor acc_dq_second = partition_fragment_C(mma_dq, Shape<M, DqCols>{});
    issue(mma_dq, tdQrdSt(_, _, _, buffer), tdQrKt_second, acc_dq_second, true);

    // The other warpgroup's S^T and dP^T of this tile, which read every
    // column of the stage, finished before the barrier above.
    auto stage_dq = [&](auto& acc, auto& smem) __attribute__((always_inline)) {
      warpgroup_fence_operand(acc);
      copy(dq_r2s, dq_r2s_thr.retile_S(acc), smem(_, _, _, stage));
    };
    warpgroup_wait<2>();  // dK and the first dQ product
    stage_dq(acc_dq, tdQsdQ_first);
    // The next tile's accumulators take the first product's registers.
    if constexpr (kNext) issue_sdp(it + 1);
    warpgroup_wait<kNext ? 2 : 0>();  // dV and the second dQ product
    warpgroup_fence_operand(acc_dk);
    warpgroup_fence_operand(acc_dv);
    stage_dq(acc_dq_second, tdQsdQ_second);
    // The TMA unit reads shared memory through the async proxy.
    tma_store_fence();
    cutlass::arch::NamedBarrier::sync(128, warpgroup_barrier);
    if (issues_dq) {
      // Whole 64-row tiles: the workspace pads each head's rows (rows past
      // seqlen_q add zeros there, as their P is 0).
      Tensor gdQ = mdQ(_, _, batch * p.nhead_q + walk.head(it));
      auto add_piece = [&](float* ring, int product) __attribute__((always_inline)) {
        const int col_block = product * Traits::kConsumerWarpgroups + warpgroup;
        Tensor gdQ_piece = local_tile(gdQ, typename Traits::DqPiece{},
                                      make_coord(walk.m_block(it), col_block));
        copy(params.tma_dq, dq_tma.partition_S(dq_piece(ring, stage)),
             dq_tma.partition_D(gdQ_piece));
      };
      add_piece(q_ring, 0);
      add_piece(dout_ring, 1);
      tma_store_arrive();
    }
    if constexpr (kNext) {
      warpgroup_wait<1>();
      probabilities_to_smem(it + 1);
      // The stage is released once the reduce-adds have read it (done by
      // now, as a rule): the producer refills it for tile it + 2 while
      // tile it + 1 finishes.
      if (issues_dq) {
        tma_store_wait<0>();
        Barrier::arrive(&bar.q_empty[stage]);
      }
      warpgroup_wait<0>();
    }
  };

  if (iters > 0) {
    issue_sdp(0);
    warpgroup_wait<1>();
    probabilities_to_smem(0);
    warpgroup_wait<0>();
    for (int it = 0; it + 1 < iters; ++it) finish_tile(it, std::true_type{});
    finish_tile(iters - 1, std::false_type{});
  }

  // The last dQ reduce-adds have finished before the CTA (and its shared
  // memory) goes away and before convert_dq reads the accumulator.
  if (issues_dq) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");

  bwd_sm90_store_dk_dv<Element>(acc_dk, acc_dv, thr_dkv, Shape<N, D>{}, p, batch, head_k,
                                n_begin);
}

}  // namespace ckfmha::kernel
