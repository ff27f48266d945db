// Backward attention on Hopper at head dims 64, 96 and 128, the main stage
// (bwd_dq_dk_dv): TMA loads and wgmma, warp-specialized. One CTA per key
// tile (128 keys of one KV head and batch entry); it walks the query tiles
// (64 rows) of every query head of the KV head's group, so GQA and MQA sum
// dK and dV in registers (d256: bwd_head_split_kernel.cuh):
//   producer warpgroup (bwd_ring.cuh): one thread loads K and V once,
//     then each query tile's Q and dO (TMA) and its rows' LSE and D (bulk
//     copies from the workspace, written by dot_do_o) into a two-stage
//     ring; a stage is refilled when both consumer warpgroups have
//     released it.
//   consumer warpgroups (64 keys each), per query tile:
//     S^T = K Q^T and dP^T = V dO^T (both operands from shared memory; P^T
//     is computed while dP^T runs), dV += P^T dO with P^T as the register
//     operand (issued as soon as P^T exists), dS^T = P^T (dP^T - D), then
//     dQ = dS K over all 128 keys (dS^T through shared memory, each
//     warpgroup half of dQ's columns) and dK += dS^T Q. dQ is staged in
//     shared memory while dK runs and added to the fp32 accumulator by one
//     TMA reduce-add per warpgroup, issued by a producer thread
//     (bwd_dq_adds.cuh; fast mode only: the order of the adds is not
//     fixed). At d64 dK goes in before the barrier and the next
//     tile's S^T and dP^T right behind dQ, so they run while dQ is staged
//     (at d128 their accumulators do not fit beside dK and dV).
// Keys sit on the wgmma M dimension throughout, so no accumulator ever needs
// a transpose in registers. In group mode a batch entry is a sequence of the
// packed tensors (bwd_ring.cuh); ALiBi, soft-caps, dropout and a bias
// broadcast over the query rows (key padding) act on P^T and dS^T element by
// element (bwd_scores.cuh, bwd_dropout.cuh).
#pragma once

#include "ckfmha/kernel/common/attention_mask.cuh"
#include "ckfmha/kernel/common/fragment_layout.cuh"
#include "ckfmha/kernel/common/shared_storage.cuh"
#include "ckfmha/kernel/common/tile_copy.cuh"
#include "ckfmha/kernel/params/bwd_params.h"
#include "ckfmha/kernel/params/bwd_workspace_rows.cuh"
#include "ckfmha/kernel/sm90/bwd_dq_adds.cuh"
#include "ckfmha/kernel/sm90/bwd_dropout.cuh"
#include "ckfmha/kernel/sm90/bwd_epilogue.cuh"
#include "ckfmha/kernel/sm90/bwd_ring.cuh"
#include "ckfmha/kernel/sm90/bwd_scores.cuh"
#include "ckfmha/kernel/sm90/bwd_traits.cuh"

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace ckfmha::kernel {


template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    bwd_dq_dk_dv_sm90_kernel(__grid_constant__ const BwdSm90Params<Traits> params) {
  using namespace cute;
  using Element = typename Traits::Element;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using Storage = typename Traits::SharedStorage;
  using M = typename Traits::M;
  using N = typename Traits::N;
  using D = typename Traits::D;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kStages = Traits::kStages;
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
  Tensor sK = make_tensor(make_smem_ptr(storage->k.data()), typename Traits::SmemLayoutK{});
  Tensor sKt = make_tensor(make_smem_ptr(storage->k.data()), typename Traits::SmemLayoutKt{});
  Tensor sV = make_tensor(make_smem_ptr(storage->v.data()), typename Traits::SmemLayoutV{});
  Tensor sQ = make_tensor(make_smem_ptr(storage->q.data()), typename Traits::SmemLayoutQ{});
  Tensor sQt = make_tensor(make_smem_ptr(storage->q.data()), typename Traits::SmemLayoutQt{});
  Tensor sdO = make_tensor(make_smem_ptr(storage->dout.data()), typename Traits::SmemLayoutdO{});
  Tensor sdOt = make_tensor(make_smem_ptr(storage->dout.data()), typename Traits::SmemLayoutdOt{});
  Tensor sdS = make_tensor(make_smem_ptr(storage->ds.data()), typename Traits::SmemLayoutdS{});
  Tensor sdSt = make_tensor(make_smem_ptr(storage->ds.data()), typename Traits::SmemLayoutdSt{});

  const int warp = int(threadIdx.x) / 32;
  const int lane = int(threadIdx.x) % 32;
  if (threadIdx.x == 0) bwd_sm90_init_barriers<Traits>(bar);
  __syncthreads();

  if (warp < 4) {
    // ---- producer warpgroup
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if (lane != 0) return;
    if (warp == 0) {
      bwd_sm90_load_tiles<Traits>(params, storage, walk, iters, tile);
    } else if (warp == 1) {
      bwd_sm90_add_dq_tiles<Traits>(params, storage, walk, iters, tile.batch);
    }
    return;
  }

  // ---- consumer warpgroups
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
  const int tid = int(threadIdx.x) - 128;
  const int warpgroup = tid / 128;
  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmadKV mma_dkv;
  typename Traits::TiledMmadQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_dkv = mma_dkv.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);
  // Shared-memory descriptors: (MMA, M or N, K[, stage or buffer]).
  Tensor tSrK = thr_sdp.partition_fragment_A(sK);
  Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);
  Tensor tdPrV = thr_sdp.partition_fragment_A(sV);
  Tensor tdPrdO = thr_sdp.partition_fragment_B(sdO);
  Tensor tdVrdOt = thr_dkv.partition_fragment_B(sdOt);
  Tensor tdKrQt = thr_dkv.partition_fragment_B(sQt);
  Tensor tdQrdSt = thr_dq.partition_fragment_A(sdSt);
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKt);

  using TileSt = Shape<N, M>;  // (keys, queries)
  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<N, D>{});
  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<N, D>{});
  Tensor cS = thr_sdp.partition_C(make_identity_tensor(TileSt{}));
  Tensor cS_rows_cols = make_tensor(cS.data(), gmma_accum_as_rows_cols(cS.layout()));
  auto ds_r2s = make_tiled_copy_C(typename Traits::SmemStoreAtomdS{}, mma_sdp);
  auto ds_r2s_thr = ds_r2s.get_thread_slice(tid);
  Tensor tdSsdS = ds_r2s_thr.partition_D(sdS);  // (CPY, CPY_M, CPY_N, buffer)
  // dQ staging: every consumer thread stores its part of the (64, d) tile
  // (a warpgroup writes only its half of the columns); a producer thread
  // adds each half to global memory (bwd_dq_adds.cuh).
  Tensor sdQ = make_tensor(make_smem_ptr(storage->dq.data()), typename Traits::SmemLayoutdQ{});
  auto dq_r2s = make_tiled_copy_C(typename Traits::SmemStoreAtomdQ{}, mma_dq);
  auto dq_r2s_thr = dq_r2s.get_thread_slice(tid);
  Tensor tdQsdQ = dq_r2s_thr.partition_D(sdQ);

  clear(acc_dk);
  clear(acc_dv);
  Barrier::wait(&bar.kv_full, 0);

  // dV += P^T dO or dK += dS^T Q as one wgmma batch: the A operand from
  // registers (a view of `a_regs`), the B operand from the query tile's stage.
  auto issue_dkv = [&](auto& a_regs, auto const& a, auto const& b, int stage,
                       auto& acc) __attribute__((always_inline)) {
    warpgroup_fence_operand(a_regs);
    warpgroup_fence_operand(acc);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int k = 0; k < size<2>(a); ++k) gemm(mma_dkv, a(_, _, k), b(_, _, k, stage), acc);
    warpgroup_commit_batch();
  };

  // S^T and dP^T of query tile `it` as two wgmma batches, once its stage
  // has landed.
  Tensor acc_s = partition_fragment_C(mma_sdp, TileSt{});
  Tensor acc_dp = partition_fragment_C(mma_sdp, TileSt{});
  auto issue_sdp = [&](int it) __attribute__((always_inline)) {
    const int stage = it % kStages;
    Barrier::wait(&bar.q_full[stage], (it / kStages) & 1);
    warpgroup_fence_operand(acc_s);
    warpgroup_fence_operand(acc_dp);
    warpgroup_arrive();
    mma_sdp.accumulate_ = GMMA::ScaleOut::Zero;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tSrK); ++k) {
      gemm(mma_sdp, tSrK(_, _, k), tSrQ(_, _, k, stage), acc_s);
      mma_sdp.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    mma_sdp.accumulate_ = GMMA::ScaleOut::Zero;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tdPrV); ++k) {
      gemm(mma_sdp, tdPrV(_, _, k), tdPrdO(_, _, k, stage), acc_dp);
      mma_sdp.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
  };

  // P^T in place of S^T, once S^T is done (dP^T may still run). Through a
  // logit transform (ALiBi, soft-cap) the weights of dV's product (P^T,
  // dropped and rescaled with dropout) are written here too in the input
  // dtype, as acc_s then holds P^T times the soft-cap's derivative; with
  // dropout alone they are made from P^T when dV is issued.
  using Transform = LogitTransform<Element, Traits::kBias, Traits::kHasSoftcap>;
  constexpr bool kDropout = Traits::kHasDropout;
  // An elementwise bias here is broadcast over the query rows (the launcher
  // takes no other): one value per key. With a soft-cap it is added after
  // the cap, through the transform.
  constexpr bool kKeyBias = Traits::kBiasRowsOnly && !Traits::kHasSoftcap;
  constexpr bool kWeightsFirst = Transform::kActive && !kKeyBias;
  using KeyBias = BwdSm90KeyBias<decltype(size<0>(gmma_accum_as_rows_cols(acc_s.layout())))::value>;
  using DropoutTile = BwdSm90DropoutTile<kBlockM>;
  uint32_t* dropout_words = Traits::dropout_words(storage, warpgroup);
  BwdSm90Dropout dropout{0u, p.dropout_rescale};  // this query tile's keep bits
  Tensor probs = make_tensor(acc_s.data(), gmma_accum_as_rows_cols(acc_s.layout()));
  Tensor rP_weights = make_tensor<Element>(acc_s.layout());
  Tensor weights = make_tensor(rP_weights.data(), gmma_accum_as_rows_cols(rP_weights.layout()));
  // The random words of query tile `it`: this warpgroup's 64 keys against
  // the tile's 64 queries. One tile at a time (d > 64), they are made before
  // the tile's S^T and dP^T are issued, while those accumulators hold nothing
  // yet; with the next tile's products issued early (d64), under them.
  constexpr bool kWordsBeforeProducts = !Traits::kOverlapQueryTiles;
  auto dropout_words_of = [&](int it) __attribute__((always_inline)) {
    const PhiloxDropout stream = PhiloxDropout::for_backward(
        p, tile.seq.seqlen_q, tile.seq.seqlen_k, tile.batch, walk.head(it));
    DropoutTile::generate(stream, dropout_words, tid % 128, n_begin + 64 * warpgroup,
                          walk.m_block(it) * kBlockM, kBwdSm90FirstWarpgroupBarrierId + warpgroup);
  };
  auto exponentials = [&](int it, auto masked) __attribute__((always_inline)) {
    warpgroup_fence_operand(acc_s);
    constexpr bool kMasked = decltype(masked)::value;
    float const* lse_log2 = storage->lse_log2[it % kStages];
    const int m_begin = walk.m_block(it) * kBlockM;
    if constexpr (kDropout) {
      if constexpr (!kWordsBeforeProducts) dropout_words_of(it);
      dropout.keep = DropoutTile::keep_bits(dropout_words, cS_rows_cols, 0, p.dropout_threshold);
    }
    if constexpr (kWeightsFirst) {
      const Transform transform = Transform::for_sequence(p, tile.seq.seqlen_q, tile.seq.seqlen_k,
                                                          tile.batch, walk.head(it));
      bwd_sm90_transformed_probabilities<kMasked, kDropout>(probs, weights, cS_rows_cols, mask,
                                                            transform, dropout, p.scale_log2,
                                                            lse_log2, m_begin, n_begin);
    } else if constexpr (kKeyBias) {
      Element const* keys = static_cast<Element const*>(p.bias) +
                            tile.batch * p.bias_batch_stride + walk.head(it) * p.bias_head_stride;
      const KeyBias key_bias =
          KeyBias::load(keys, tile.seq.seqlen_k, cS_rows_cols, n_begin);
      bwd_sm90_probabilities<kMasked>(probs, cS_rows_cols, mask, lse_log2, p.scale_log2,
                                      m_begin, n_begin, key_bias);
    } else {
      bwd_sm90_probabilities<kMasked>(probs, cS_rows_cols, mask, lse_log2, p.scale_log2,
                                      m_begin, n_begin);
    }
  };
  // Uniform over the CTA: tiles inside the causal triangle and the keys
  // skip the per-element mask.
  auto needs_mask = [&](int it) __attribute__((always_inline)) {
    return mask.tile_needs_mask(walk.m_block(it) * kBlockM, n_begin, kBlockM, kBlockN);
  };
  auto softmax = [&](int it) __attribute__((always_inline)) {
    if (needs_mask(it)) {
      exponentials(it, std::true_type{});
    } else {
      exponentials(it, std::false_type{});
    }
  };

  // Everything of query tile `it` after its P^T, with dP^T done. With
  // `issues_next`, dK goes in before the dS^T barrier and the next tile's
  // S^T and dP^T right behind dQ, so they run while dQ is staged, and the
  // next P^T is computed while its dP^T runs; no product is in flight
  // across the loop's back edge.
  auto finish_tile = [&](int it, auto issues_next) __attribute__((always_inline)) {
    constexpr bool kNext = decltype(issues_next)::value;
    const int stage = it % kStages;
    const int buffer = it & 1;
    warpgroup_fence_operand(acc_dp);
    // P^T in the input dtype is dV's A operand as it lies in registers: dV
    // runs while dS^T is computed.
    Tensor rP_converted = make_tensor<Element>(acc_s.layout());
    if constexpr (!kWeightsFirst) {
      if constexpr (kDropout) {
        Tensor dropped =
            make_tensor(rP_converted.data(), gmma_accum_as_rows_cols(rP_converted.layout()));
        bwd_sm90_dropped_weights(probs, dropped, dropout);
      } else {
        convert_fragment_into(acc_s, rP_converted);
      }
    }
    auto& rP = [&]() -> auto& {
      if constexpr (kWeightsFirst) {
        return rP_weights;
      } else {
        return rP_converted;
      }
    }();
    issue_dkv(rP, make_tensor(rP.data(), gmma_accum_as_operand_a(rP.layout())), tdVrdOt, stage,
              acc_dv);

    Tensor dscores = make_tensor(acc_dp.data(), gmma_accum_as_rows_cols(acc_dp.layout()));
    bwd_sm90_score_gradients<kDropout>(dscores, probs, cS_rows_cols, storage->delta[stage],
                                       dropout);
    // dS^T in the input dtype: dK's A operand in registers, and to shared
    // memory for dQ.
    Tensor rdS = make_tensor<Element>(acc_dp.layout());
    convert_fragment_into(acc_dp, rdS);
    // The other warpgroup may still read buffer `buffer ^ 1` in its dQ
    // product; this buffer's last reader (two tiles ago) has finished, as
    // both warpgroups passed the barrier below since.
    copy(ds_r2s, ds_r2s_thr.retile_S(rdS), tdSsdS(_, _, _, buffer));
    // wgmma reads shared memory through the async proxy.
    cutlass::arch::fence_view_async_shared();
    // With the next tile to issue, dK (this warpgroup's own dS^T, from
    // registers) goes in before the barrier, so the tensor cores have dV
    // and dK while the warpgroups meet; dQ is then staged behind the next
    // S^T and dP^T instead of behind dK.
    auto issue_dk = [&]() __attribute__((always_inline)) {
      issue_dkv(rdS, make_tensor(rdS.data(), gmma_accum_as_operand_a(rdS.layout())), tdKrQt,
                stage, acc_dk);
    };
    if constexpr (kNext) issue_dk();
    // Whether the previous reduce-add of this warpgroup's dQ half has read
    // its buffer, tested now so that the round trip runs under the barrier.
    const uint32_t dq_parity = (it & 1) ^ 1;
    const bool dq_buffer_free = Barrier::test_wait(&bar.dq_empty[warpgroup], dq_parity, 1);
    // Both warpgroups' halves of dS^T are in shared memory.
    cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, kBwdSm90ConsumerBarrierId);

    Tensor acc_dq = partition_fragment_C(mma_dq, Shape<M, D>{});
    warpgroup_fence_operand(acc_dq);
    warpgroup_arrive();
    mma_dq.accumulate_ = GMMA::ScaleOut::Zero;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tdQrKt); ++k) {
      gemm(mma_dq, tdQrdSt(_, _, k, buffer), tdQrKt(_, _, k), acc_dq);
      mma_dq.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    if constexpr (kNext) {
      issue_sdp(it + 1);
    } else {
      issue_dk();
    }

    // dV and dQ are done (and dK, issued before dQ); dQ is staged and added
    // while the next S^T and dP^T, or dK, run.
    warpgroup_wait<kNext ? 2 : 1>();
    warpgroup_fence_operand(acc_dv);
    warpgroup_fence_operand(acc_dq);
    // The previous tile's reduce-add of this half has read the buffer (the
    // first tile finds it free: the parity before the initial phase).
    if (!dq_buffer_free) Barrier::wait(&bar.dq_empty[warpgroup], dq_parity);
    copy(dq_r2s, dq_r2s_thr.retile_S(acc_dq), tdQsdQ);
    // The TMA unit reads shared memory through the async proxy; the arrive
    // releases the stores to the thread that issues the add.
    tma_store_fence();
    Barrier::arrive(&bar.dq_full[warpgroup]);

    // dK is done: this warpgroup no longer reads this tile's Q or dO.
    if constexpr (!kNext) warpgroup_wait<0>();
    warpgroup_fence_operand(acc_dk);
    warpgroup_fence_operand(rP);
    warpgroup_fence_operand(rdS);
    Barrier::arrive(&bar.q_empty[stage]);
    if constexpr (kNext) {
      warpgroup_wait<1>();
      softmax(it + 1);
      warpgroup_wait<0>();
    }
  };

  if constexpr (Traits::kOverlapQueryTiles) {
    if (iters > 0) {
      issue_sdp(0);
      warpgroup_wait<1>();
      softmax(0);
      warpgroup_wait<0>();
      for (int it = 0; it + 1 < iters; ++it) finish_tile(it, std::true_type{});
      finish_tile(iters - 1, std::false_type{});
    }
  } else {
    // One tile at a time, each tile's whole body specialized on the mask
    // (measured faster at d128 than one body with a branch around the
    // exponentials).
    auto query_tile = [&](int it, auto masked) __attribute__((always_inline)) {
      if constexpr (kDropout && kWordsBeforeProducts) dropout_words_of(it);
      issue_sdp(it);
      // P^T while dP^T is computed.
      warpgroup_wait<1>();
      exponentials(it, masked);
      warpgroup_wait<0>();
      finish_tile(it, std::false_type{});
    };
    for (int it = 0; it < iters; ++it) {
      if (needs_mask(it)) {
        query_tile(it, std::true_type{});
      } else {
        query_tile(it, std::false_type{});
      }
    }
  }

  bwd_sm90_store_dk_dv<Traits>(acc_dk, acc_dv, mma_dkv, mma_dkv, tid, storage->k.data(),
                               storage->v.data(),
                               p, tile);
}

}  // namespace ckfmha::kernel
