// Backward attention on Hopper, the main stage (bwd_dq_dk_dv): TMA loads and
// wgmma, warp-specialized. One CTA per key tile (128 keys of one KV head and
// batch entry); it walks the query tiles (64 rows) of every query head of
// the KV head's group, so GQA and MQA sum dK and dV in registers:
//   producer warpgroup: one thread loads K and V once, then each query
//     tile's Q and dO (TMA) and its rows' LSE and D (bulk copies from the
//     workspace, written by dot_do_o) into a two-stage ring; a stage is
//     refilled when both consumer warpgroups have released it.
//   consumer warpgroups (64 keys each), per query tile:
//     S^T = K Q^T and dP^T = V dO^T (both operands from shared memory; P^T
//     is computed while dP^T runs), dV += P^T dO with P^T as the register
//     operand (issued as soon as P^T exists), dS^T = P^T (dP^T - D), then
//     dQ = dS K over all 128 keys (dS^T through shared memory, each
//     warpgroup half of dQ's columns) and dK += dS^T Q. dQ is staged in
//     shared memory while dK runs and added to the fp32 accumulator by one
//     TMA reduce-add per warpgroup (fast mode only: the order of the adds
//     is not fixed). At d64 dK goes in before the barrier and the next
//     tile's S^T and dP^T right behind dQ, so they run while dQ is staged
//     (at d128 their accumulators do not fit beside dK and dV).
// Keys sit on the wgmma M dimension throughout, so no accumulator ever needs
// a transpose in registers.
#pragma once

#include "ckfmha/kernel/attention_mask.cuh"
#include "ckfmha/kernel/bwd_params.h"
#include "ckfmha/kernel/bwd_sm90_traits.cuh"
#include "ckfmha/kernel/bwd_workspace_rows.cuh"
#include "ckfmha/kernel/fragment_layout.cuh"
#include "ckfmha/kernel/shared_storage.cuh"
#include "ckfmha/kernel/tile_copy.cuh"

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace ckfmha::kernel {

template <class Traits>
struct BwdSm90Params {
  BwdParams p;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaQ tma_do;
  typename Traits::TmaK tma_k;
  typename Traits::TmaK tma_v;
  typename Traits::TmaDq tma_dq;
};

// Named barrier 0 is __syncthreads; the consumers sync on their own so the
// producer warpgroup, which has left, is never waited for.
constexpr uint32_t kBwdSm90ConsumerBarrierId = 1;
constexpr uint32_t kBwdSm90FirstWarpgroupBarrierId = 2;  // and 3: one per consumer warpgroup

// The query tiles of one key tile: `iters` steps over the group's heads, each
// over the row blocks [m_first, m_first + m_count) that see any of its keys.
// Producer and consumers walk it alike, so both agree on stages and phases.
struct BwdSm90QueryWalk {
  int head_begin;
  int m_first;
  int m_count;

  __device__ __forceinline__ int head(int it) const { return head_begin + it / m_count; }
  __device__ __forceinline__ int m_block(int it) const { return m_first + it % m_count; }
};

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
  constexpr int kD = Traits::kHeadDim;
  constexpr int kStages = Traits::kStages;
  BwdParams const& p = params.p;

  const int n_block = blockIdx.x;
  const int head_k = blockIdx.y;
  const int batch = blockIdx.z;
  const int n_begin = n_block * kBlockN;
  const int seqlen_q = p.seqlen_q;
  const int seqlen_k = p.seqlen_k;
  const int group = p.head_group;
  const AttentionMask<Traits::kMask> mask{seqlen_k, p.bottom_right ? seqlen_k - seqlen_q : 0,
                                          p.window_left, p.window_right};
  int m_first, m_last;
  mask.query_block_range(n_begin, kBlockN, kBlockM, seqlen_q, &m_first, &m_last);
  const BwdSm90QueryWalk walk{head_k * group, m_first, m_last - m_first};
  const int iters = walk.m_count * group;

  extern __shared__ char smem_raw[];
  Storage* storage = shared_storage_at_1024<Storage>(smem_raw);
  auto& bar = storage->bar;
  Tensor sK = make_tensor(make_smem_ptr(storage->k.data()), typename Traits::SmemLayoutK{});
  Tensor sKt = make_tensor(make_smem_ptr(storage->k.data()), typename Traits::SmemLayoutKt{});
  Tensor sV = make_tensor(make_smem_ptr(storage->v.data()), typename Traits::SmemLayoutK{});
  Tensor sQ = make_tensor(make_smem_ptr(storage->q.data()), typename Traits::SmemLayoutQ{});
  Tensor sQt = make_tensor(make_smem_ptr(storage->q.data()), typename Traits::SmemLayoutQt{});
  Tensor sdO = make_tensor(make_smem_ptr(storage->dout.data()), typename Traits::SmemLayoutQ{});
  Tensor sdOt = make_tensor(make_smem_ptr(storage->dout.data()), typename Traits::SmemLayoutQt{});
  Tensor sdS = make_tensor(make_smem_ptr(storage->ds.data()), typename Traits::SmemLayoutdS{});
  Tensor sdSt = make_tensor(make_smem_ptr(storage->ds.data()), typename Traits::SmemLayoutdSt{});

  const int warp = int(threadIdx.x) / 32;
  const int lane = int(threadIdx.x) % 32;
  if (threadIdx.x == 0) {
    Barrier::init(&bar.kv_full, 1);
    for (int s = 0; s < kStages; ++s) {
      Barrier::init(&bar.q_full[s], 1);
      Barrier::init(&bar.q_empty[s], Traits::kConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (warp < 4) {
    // ---- producer warpgroup
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if (warp != 0 || lane != 0) return;
    const int nhead_k = p.nhead_q / group;
    // Coordinate tensors over the shapes the descriptors were encoded with.
    Tensor mQ = params.tma_q.get_tma_tensor(make_shape(seqlen_q, kD, p.nhead_q, p.batch));
    Tensor mdO = params.tma_do.get_tma_tensor(make_shape(seqlen_q, kD, p.nhead_q, p.batch));
    Tensor mK = params.tma_k.get_tma_tensor(make_shape(seqlen_k, kD, nhead_k, p.batch));
    Tensor mV = params.tma_v.get_tma_tensor(make_shape(seqlen_k, kD, nhead_k, p.batch));
    {
      Tensor gK = local_tile(mK(_, _, head_k, batch), Shape<N, D>{}, make_coord(_, 0));
      Tensor gV = local_tile(mV(_, _, head_k, batch), Shape<N, D>{}, make_coord(_, 0));
      auto [tKgK, tKsK] = tma_partition(params.tma_k, Int<0>{}, Layout<_1>{},
                                        group_modes<0, 2>(sK), group_modes<0, 2>(gK));
      auto [tVgV, tVsV] = tma_partition(params.tma_v, Int<0>{}, Layout<_1>{},
                                        group_modes<0, 2>(sV), group_modes<0, 2>(gV));
      // Rows past seqlen_k fall outside the tensor: TMA fills them with zeros
      // and still counts the whole box's bytes.
      Barrier::arrive_and_expect_tx(&bar.kv_full, 2 * Traits::kTmaBytesK);
      copy(params.tma_k.with(bar.kv_full), tKgK(_, n_block), tKsK);
      copy(params.tma_v.with(bar.kv_full), tVgV(_, n_block), tVsV);
    }
    for (int it = 0; it < iters; ++it) {
      const int stage = it % kStages;
      // The first pass finds every stage free: waiting on the parity before
      // a barrier's initial phase returns at once.
      Barrier::wait(&bar.q_empty[stage], ((it / kStages) & 1) ^ 1);
      const int head = walk.head(it);
      Tensor gQ = local_tile(mQ(_, _, head, batch), Shape<M, D>{}, make_coord(_, 0));
      Tensor gdO = local_tile(mdO(_, _, head, batch), Shape<M, D>{}, make_coord(_, 0));
      auto [tQgQ, tQsQ] = tma_partition(params.tma_q, Int<0>{}, Layout<_1>{},
                                        group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
      auto [tdOgdO, tdOsdO] = tma_partition(params.tma_do, Int<0>{}, Layout<_1>{},
                                            group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
      Barrier::arrive_and_expect_tx(&bar.q_full[stage],
                                    2 * Traits::kTmaBytesQ + 2 * Traits::kBulkBytesRows);
      copy(params.tma_q.with(bar.q_full[stage]), tQgQ(_, walk.m_block(it)), tQsQ(_, stage));
      copy(params.tma_do.with(bar.q_full[stage]), tdOgdO(_, walk.m_block(it)), tdOsdO(_, stage));
      // The workspace pads every head to whole 64-row blocks, so these rows
      // are in bounds and 16-byte aligned.
      const int64_t row0 = bwd_workspace_row0(p, batch, head) + walk.m_block(it) * kBlockM;
      SM90_BULK_COPY_G2S::copy(p.lse_log2 + row0, &bar.q_full[stage], storage->lse_log2[stage],
                               Traits::kBulkBytesRows);
      SM90_BULK_COPY_G2S::copy(p.delta + row0, &bar.q_full[stage], storage->delta[stage],
                               Traits::kBulkBytesRows);
    }
    return;
  }

  // ---- consumer warpgroups
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
  const int tid = int(threadIdx.x) - 128;
  const int warpgroup = tid / 128;
  const int lane_in_warpgroup = tid % 128;
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
  constexpr int kRows = decltype(size<0>(cS_rows_cols))::value;  // keys of this thread
  constexpr int kCols = decltype(size<1>(cS_rows_cols))::value;  // queries of this thread
  auto ds_r2s = make_tiled_copy_C(typename Traits::SmemStoreAtomdS{}, mma_sdp);
  auto ds_r2s_thr = ds_r2s.get_thread_slice(tid);
  Tensor tdSsdS = ds_r2s_thr.partition_D(sdS);  // (CPY, CPY_M, CPY_N, buffer)
  // dQ staging: every consumer thread stores its part of the (64, d) tile,
  // then one thread per warpgroup adds that warpgroup's half to global memory.
  Tensor sdQ = make_tensor(make_smem_ptr(storage->dq.data()), typename Traits::SmemLayoutdQ{});
  auto dq_r2s = make_tiled_copy_C(typename Traits::SmemStoreAtomdQ{}, mma_dq);
  auto dq_r2s_thr = dq_r2s.get_thread_slice(tid);
  Tensor tdQsdQ = dq_r2s_thr.partition_D(sdQ);
  Tensor sdQ_half = make_tensor(
      make_smem_ptr(storage->dq.data() +
                    warpgroup * cute::cosize_v<typename Traits::SmemLayoutdQHalf>),
      typename Traits::SmemLayoutdQHalf{});
  Tensor mdQ = params.tma_dq.get_tma_tensor(make_shape(p.workspace_rows, kD, p.nhead_q * p.batch));
  auto dq_tma = params.tma_dq.get_slice(Int<0>{});
  Tensor tdQsdQ_half = dq_tma.partition_S(sdQ_half);
  const bool issues_dq = lane_in_warpgroup == 0;
  const uint32_t warpgroup_barrier = kBwdSm90FirstWarpgroupBarrierId + warpgroup;

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

  // P^T in place of S^T, once S^T is done (dP^T may still run).
  Tensor probs = make_tensor(acc_s.data(), gmma_accum_as_rows_cols(acc_s.layout()));
  auto exponentials = [&](int it, auto masked) __attribute__((always_inline)) {
    warpgroup_fence_operand(acc_s);
    float const* lse_log2 = storage->lse_log2[it % kStages];
    const int m_begin = walk.m_block(it) * kBlockM;
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      CUTE_UNROLL
      for (int j = 0; j < kCols; ++j) {
        bool visible = true;
        if constexpr (decltype(masked)::value) {
          visible = mask.visible(m_begin + get<1>(cS_rows_cols(i, j)),
                                 n_begin + get<0>(cS_rows_cols(i, j)));
        }
        const int col = get<1>(cS_rows_cols(i, j));
        probs(i, j) = visible ? exp2f(probs(i, j) * p.scale_log2 - lse_log2[col]) : 0.f;
      }
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
    const int head = walk.head(it);
    warpgroup_fence_operand(acc_dp);
    // P^T in the input dtype is dV's A operand as it lies in registers: dV
    // runs while dS^T is computed.
    Tensor rP = make_tensor<Element>(acc_s.layout());
    convert_fragment_into(acc_s, rP);
    issue_dkv(rP, make_tensor(rP.data(), gmma_accum_as_operand_a(rP.layout())), tdVrdOt, stage,
              acc_dv);

    float const* delta = storage->delta[stage];
    Tensor dscores = make_tensor(acc_dp.data(), gmma_accum_as_rows_cols(acc_dp.layout()));
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      CUTE_UNROLL
      for (int j = 0; j < kCols; ++j) {
        dscores(i, j) = probs(i, j) * (dscores(i, j) - delta[get<1>(cS_rows_cols(i, j))]);
      }
    }
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
    // The previous tile's reduce-add has read the staging buffer.
    if (issues_dq) tma_store_wait<0>();
    cutlass::arch::NamedBarrier::sync(128, warpgroup_barrier);
    copy(dq_r2s, dq_r2s_thr.retile_S(acc_dq), tdQsdQ);
    // The TMA unit reads shared memory through the async proxy.
    tma_store_fence();
    cutlass::arch::NamedBarrier::sync(128, warpgroup_barrier);
    if (issues_dq) {
      // Whole 64-row tiles: the workspace pads each head's rows (rows past
      // seqlen_q add zeros there, as their P is 0).
      Tensor gdQ = local_tile(mdQ(_, _, batch * p.nhead_q + head), typename Traits::DqHalf{},
                              make_coord(walk.m_block(it), warpgroup));
      copy(params.tma_dq, tdQsdQ_half, dq_tma.partition_D(gdQ));
      tma_store_arrive();
    }

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

  // The last dQ reduce-add has finished before the CTA (and its shared
  // memory) goes away and before convert_dq reads the accumulator.
  if (issues_dq) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");

  // ---- epilogue: dK (scaled) and dV straight from registers; keys without
  // a visible query get zeros.
  CUTE_UNROLL
  for (int e = 0; e < size(acc_dk); ++e) acc_dk(e) *= p.scale;
  Tensor rdK = convert_fragment<Element>(acc_dk);
  Tensor rdV = convert_fragment<Element>(acc_dv);
  Tensor cKV = thr_dkv.partition_C(make_identity_tensor(Shape<N, D>{}));
  Tensor cKV_rows_cols = make_tensor(cKV.data(), gmma_accum_as_rows_cols(cKV.layout()));
  Tensor rdK_rows_cols = make_tensor(rdK.data(), gmma_accum_as_rows_cols(rdK.layout()));
  Tensor rdV_rows_cols = make_tensor(rdV.data(), gmma_accum_as_rows_cols(rdV.layout()));
  auto* dk_tile = static_cast<Element*>(p.dk) + batch * p.dk_batch_stride +
                  head_k * p.dk_head_stride + int64_t(n_begin) * p.dk_row_stride;
  auto* dv_tile = static_cast<Element*>(p.dv) + batch * p.dv_batch_stride +
                  head_k * p.dv_head_stride + int64_t(n_begin) * p.dv_row_stride;
  store_fragment_rows(rdK_rows_cols, cKV_rows_cols, dk_tile, p.dk_row_stride, seqlen_k - n_begin);
  store_fragment_rows(rdV_rows_cols, cKV_rows_cols, dv_tile, p.dv_row_stride, seqlen_k - n_begin);
}

}  // namespace ckfmha::kernel
