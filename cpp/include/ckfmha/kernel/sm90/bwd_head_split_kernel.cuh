// Backward attention on Hopper at head dims 256 and 192x128, the main stage
// (bwd_dq_dk_dv): TMA loads and wgmma, warp-specialized. One CTA per key
// tile (64 keys of one KV head and batch entry) walks the query tiles (64
// rows) of every query head of the KV head's group, so GQA and MQA sum dK
// and dV in registers. The producer warpgroup is bwd_ring.cuh's.
// Both consumer warpgroups work on all 64 keys (bwd_head_split_traits.cuh),
// per query tile:
//   S^T = K Q^T and dP^T = V dO^T, each warpgroup for its 32 queries (P^T is
//   computed and stored while dP^T runs); P^T and dS^T = P^T (dP^T - D) go
//   to shared memory; after a barrier each warpgroup computes its half of
//   the columns of dQ = dS K, dV += P^T dO and dK += dS^T Q over all 64
//   queries and keys. dQ is then staged (d256: in the bytes of the tile's
//   Q/dO stage that only its warpgroup read; d192x128: in a tile of its own)
//   and added to the fp32 accumulator by TMA reduce-adds (fast mode only:
//   the order of the adds is not fixed); a ring stage is released once they
//   have read it, behind the next tile's products.
// Group mode and the features (ALiBi, soft-caps, dropout, a bias broadcast
// over the query rows) as at d <= 128 (bwd_kernel.cuh).
#pragma once

#include "ckfmha/kernel/common/attention_mask.cuh"
#include "ckfmha/kernel/common/fragment_layout.cuh"
#include "ckfmha/kernel/common/shared_storage.cuh"
#include "ckfmha/kernel/common/tile_copy.cuh"
#include "ckfmha/kernel/params/bwd_params.h"
#include "ckfmha/kernel/params/bwd_workspace_rows.cuh"
#include "ckfmha/kernel/sm90/bwd_dropout.cuh"
#include "ckfmha/kernel/sm90/bwd_epilogue.cuh"
#include "ckfmha/kernel/sm90/bwd_head_split_traits.cuh"
#include "ckfmha/kernel/sm90/bwd_ring.cuh"
#include "ckfmha/kernel/sm90/bwd_scores.cuh"

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <cstdint>
#include <type_traits>

namespace ckfmha::kernel {

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    bwd_dq_dk_dv_sm90_head_split_kernel(
        __grid_constant__ const BwdSm90Params<Traits> params) {
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
  constexpr bool kDqInRing = Traits::kDqInRing;
  BwdParams const& p = params.p;

  const BwdSm90KeyTile<Traits> tile = bwd_sm90_key_tile(params);
  if (!tile.owned) return;
  const int n_begin = tile.n_begin();
  const auto mask = tile.mask(p);
  int iters;
  const BwdSm90QueryWalk walk = bwd_sm90_query_walk<Traits>(p, mask, tile.seq.seqlen_q, n_begin,
                                                            tile.head_k, &iters);

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
      bwd_sm90_load_tiles<Traits>(params, storage, walk, iters, tile);
    }
    return;
  }

  // ---- consumer warpgroups
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
  const int tid = int(threadIdx.x) - 128;
  Tensor sK = make_tensor(make_smem_ptr(storage->k.data()), typename Traits::SmemLayoutK{});
  Tensor sKt = make_tensor(make_smem_ptr(storage->k.data()), typename Traits::SmemLayoutKt{});
  Tensor sV = make_tensor(make_smem_ptr(storage->v.data()), typename Traits::SmemLayoutV{});
  Tensor sQ = make_tensor(make_smem_ptr(storage->q.data()), typename Traits::SmemLayoutQ{});
  Tensor sQt = make_tensor(make_smem_ptr(storage->q.data()), typename Traits::SmemLayoutQt{});
  Tensor sdO = make_tensor(make_smem_ptr(storage->dout.data()), typename Traits::SmemLayoutdO{});
  Tensor sdOt = make_tensor(make_smem_ptr(storage->dout.data()), typename Traits::SmemLayoutdOt{});
  Tensor sPt = make_tensor(make_smem_ptr(storage->pt.data()), typename Traits::SmemLayoutPt{});
  Tensor sdS = make_tensor(make_smem_ptr(storage->ds.data()), typename Traits::SmemLayoutPt{});
  Tensor sdSt = make_tensor(make_smem_ptr(storage->ds.data()), typename Traits::SmemLayoutdSt{});

  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmadK mma_dk;
  typename Traits::TiledMmadV mma_dv;
  typename Traits::TiledMmadQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_dk = mma_dk.get_thread_slice(tid);
  auto thr_dv = mma_dv.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);
  // Shared-memory descriptors: (MMA, M or N, K[, stage or buffer]).
  Tensor tSrK = thr_sdp.partition_fragment_A(sK);
  Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);
  Tensor tdPrV = thr_sdp.partition_fragment_A(sV);
  Tensor tdPrdO = thr_sdp.partition_fragment_B(sdO);
  Tensor tdVrPt = thr_dv.partition_fragment_A(sPt);
  Tensor tdVrdOt = thr_dv.partition_fragment_B(sdOt);
  Tensor tdKrdS = thr_dk.partition_fragment_A(sdS);
  Tensor tdKrQt = thr_dk.partition_fragment_B(sQt);
  Tensor tdQrdSt = thr_dq.partition_fragment_A(sdSt);
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKt);

  using TileSt = Shape<N, M>;  // (keys, queries)
  // ALiBi and soft-caps rewrite the logits before the exponential; dropout
  // drops and rescales the weights of dV's product and dP^T.
  using Transform = LogitTransform<Element, Traits::kBias, Traits::kHasSoftcap>;
  constexpr bool kDropout = Traits::kHasDropout;
  // An elementwise bias is broadcast over the query rows (the launcher takes
  // no other): one value a key (BwdSm90KeyBias), as at d <= 128. With a
  // soft-cap or dropout it goes through the transform.
  constexpr bool kKeyBias = Traits::kBiasRowsOnly && !Traits::kHasSoftcap && !kDropout;
  constexpr bool kPerElement = (Transform::kActive && !kKeyBias) || kDropout;
  using DropoutTile = BwdSm90DropoutTile<Traits::kDropoutQueries>;
  BwdSm90Dropout dropout{0u, p.dropout_rescale};  // this query tile's keep bits
  Tensor acc_dk = partition_fragment_C(mma_dk, Shape<N, D>{});
  Tensor acc_dv = partition_fragment_C(mma_dv, Shape<N, typename Traits::DV>{});
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
  // One thread per warpgroup adds the warpgroup's staged dQ.
  const bool issues_dq = tid % 128 == 0;
  const uint32_t warpgroup_barrier = kBwdSm90FirstWarpgroupBarrierId + warpgroup;
  // This thread's part of a stage's dQ tile (in the ring: staged in Q's and
  // dO's bytes; else in the tile of its own), and piece `piece` of this
  // warpgroup's columns as a TMA source.
  auto dq_r2s = make_tiled_copy_C(typename Traits::SmemStoreAtomdQ{}, mma_dq);
  auto dq_r2s_thr = dq_r2s.get_thread_slice(tid);
  auto staged_dq = [&]() __attribute__((always_inline)) {
    if constexpr (kDqInRing) {
      return dq_r2s_thr.partition_D(  // (CPY, CPY_M, CPY_N, stage)
          make_tensor(make_smem_ptr(reinterpret_cast<float*>(storage->q.data())),
                      typename Traits::SmemLayoutdQStages{}));
    } else {
      return dq_r2s_thr.partition_D(  // (CPY, CPY_M, CPY_N)
          make_tensor(make_smem_ptr(storage->dq.data()), typename Traits::SmemLayoutdQTile{}));
    }
  };
  Tensor tdQsdQ = staged_dq();
  auto dq_piece = [&](int stage, int piece) __attribute__((always_inline)) {
    float* start;
    if constexpr (kDqInRing) {
      start = reinterpret_cast<float*>(storage->q.data()) + stage * Traits::kDqStageStride +
              piece * Traits::kDqRingStride + warpgroup * Traits::kDqWarpgroupStride;
    } else {
      start = storage->dq.data() + (Traits::kDqPieces * warpgroup + piece) *
                                       cute::cosize_v<typename Traits::SmemLayoutdQBox>;
    }
    return make_tensor(make_smem_ptr(start), typename Traits::SmemLayoutdQBox{});
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

  for (int it = 0; it < iters; ++it) {
    const int stage = it % kStages;
    const int buffer = it & 1;
    Barrier::wait(&bar.q_full[stage], (it / kStages) & 1);
    issue(mma_sdp, tSrK, tSrQ(_, _, _, stage), acc_s, true);
    issue(mma_sdp, tdPrV, tdPrdO(_, _, _, stage), acc_dp, true);

    // P^T while dP^T runs; to shared memory as the A operand of dV. This
    // buffer's last readers (two tiles ago) are done: both warpgroups have
    // waited for their products since.
    warpgroup_wait<1>();
    warpgroup_fence_operand(acc_s);
    const int m_begin = walk.m_block(it) * kBlockM;
    Tensor rP = make_tensor<Element>(acc_s.layout());
    auto exponentials = [&](auto masked) __attribute__((always_inline)) {
      constexpr bool kMasked = decltype(masked)::value;
      if constexpr (kPerElement) {
        // acc_s then holds P^T times the soft-cap's derivative, rP the
        // weights of dV's product (P^T, dropped and rescaled).
        Tensor weights = make_tensor(rP.data(), gmma_accum_as_rows_cols(rP.layout()));
        const int head = walk.head(it);
        if constexpr (kDropout) {
          // All 64 keys against this warpgroup's 32 queries.
          const int query0 = warpgroup * Traits::kDropoutQueries;
          uint32_t* words = Traits::dropout_words(storage, warpgroup);
          const PhiloxDropout stream = PhiloxDropout::for_backward(
              p, tile.seq.seqlen_q, tile.seq.seqlen_k, tile.batch, head);
          DropoutTile::generate(stream, words, tid % 128, n_begin, m_begin + query0,
                                warpgroup_barrier);
          dropout.keep = DropoutTile::keep_bits(words, cS_rows_cols, query0,
                                                p.dropout_threshold);
        }
        const Transform transform =
            Transform::for_sequence(p, tile.seq.seqlen_q, tile.seq.seqlen_k, tile.batch, head);
        bwd_sm90_transformed_probabilities<kMasked, kDropout>(
            probs, weights, cS_rows_cols, mask, transform, dropout, p.scale_log2,
            storage->lse_log2[stage], m_begin, n_begin);
      } else if constexpr (kKeyBias) {
        using KeyBias = BwdSm90KeyBias<decltype(size<0>(probs))::value>;
        Element const* keys = static_cast<Element const*>(p.bias) +
                              tile.batch * p.bias_batch_stride +
                              walk.head(it) * p.bias_head_stride;
        const KeyBias key_bias = KeyBias::load(keys, tile.seq.seqlen_k, cS_rows_cols, n_begin);
        bwd_sm90_probabilities<kMasked>(probs, cS_rows_cols, mask, storage->lse_log2[stage],
                                        p.scale_log2, m_begin, n_begin, key_bias);
      } else {
        bwd_sm90_probabilities<kMasked>(probs, cS_rows_cols, mask, storage->lse_log2[stage],
                                        p.scale_log2, m_begin, n_begin);
      }
    };
    if (mask.tile_needs_mask(m_begin, n_begin, kBlockM, kBlockN)) {
      exponentials(std::true_type{});
    } else {
      exponentials(std::false_type{});
    }
    if constexpr (!kPerElement) convert_fragment_into(acc_s, rP);
    copy(st_r2s, st_r2s_thr.retile_S(rP), tPsPt(_, _, _, buffer));

    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_dp);
    bwd_sm90_score_gradients<kDropout>(dscores, probs, cS_rows_cols, storage->delta[stage],
                                       dropout);
    Tensor rdS = make_tensor<Element>(acc_dp.layout());
    convert_fragment_into(acc_dp, rdS);
    copy(st_r2s, st_r2s_thr.retile_S(rdS), tdSsdS(_, _, _, buffer));
    // wgmma reads shared memory through the async proxy.
    cutlass::arch::fence_view_async_shared();
    // A staging tile of its own is written again below: the previous tile's
    // reduce-adds have read it before this warpgroup passes the barrier.
    if constexpr (!kDqInRing) {
      if (it > 0 && issues_dq) tma_store_wait<0>();
    }
    // Both warpgroups' queries of P^T and dS^T are in shared memory.
    cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, kBwdSm90ConsumerBarrierId);
    // The previous tile's stage is released, so that the producer refills it
    // for the next tile while this one finishes: each thread is done with
    // it, and (dQ staged in the ring) the thread that added its staged dQ
    // arrives once the reduce-adds have read it (long done by now: S^T and
    // dP^T ran since).
    if (it > 0) {
      if constexpr (kDqInRing) {
        if (issues_dq) tma_store_wait<0>();
      }
      Barrier::arrive(&bar.q_empty[(it - 1) % kStages]);
    }

    Tensor acc_dq = partition_fragment_C(mma_dq, Shape<M, D>{});
    issue(mma_dq, tdQrdSt(_, _, _, buffer), tdQrKt, acc_dq, true);
    issue(mma_dv, tdVrPt(_, _, _, buffer), tdVrdOt(_, _, _, stage), acc_dv, false);
    issue(mma_dk, tdKrdS(_, _, _, buffer), tdKrQt(_, _, _, stage), acc_dk, false);

    // dQ, dV and dK are done: this warpgroup's columns of the stage's Q and
    // dO are read by no one else (the other warpgroup's S^T and dP^T of
    // this tile finished before the barrier above).
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_dq);
    warpgroup_fence_operand(acc_dv);
    warpgroup_fence_operand(acc_dk);
    if constexpr (kDqInRing) {
      copy(dq_r2s, dq_r2s_thr.retile_S(acc_dq), tdQsdQ(_, _, _, stage));
    } else {
      copy(dq_r2s, dq_r2s_thr.retile_S(acc_dq), tdQsdQ);
    }
    // The TMA unit reads shared memory through the async proxy.
    tma_store_fence();
    cutlass::arch::NamedBarrier::sync(128, warpgroup_barrier);
    if (issues_dq) {
      // Whole 64-row tiles: the workspace pads each head's rows (rows past
      // seqlen_q add zeros there, as their P is 0).
      Tensor gdQ = mdQ(_, _, tile.batch * p.nhead_q + walk.head(it));
      CUTE_UNROLL
      for (int piece = 0; piece < Traits::kDqPieces; ++piece) {
        Tensor gdQ_piece =
            local_tile(gdQ, typename Traits::DqBox{},
                       make_coord(walk.m_block(it), Traits::kDqPieces * warpgroup + piece));
        copy(params.tma_dq, dq_tma.partition_S(dq_piece(stage, piece)),
             dq_tma.partition_D(gdQ_piece));
      }
      tma_store_arrive();
    }
  }

  // The last dQ reduce-adds have finished before the CTA (and its shared
  // memory) goes away and before convert_dq reads the accumulator.
  if (issues_dq) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");

  bwd_sm90_store_dk_dv<Traits>(acc_dk, acc_dv, mma_dk, mma_dv, tid, storage->k.data(),
                               storage->v.data(), p, tile);
}

}  // namespace ckfmha::kernel
