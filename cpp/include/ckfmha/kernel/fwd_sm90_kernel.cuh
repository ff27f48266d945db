// Forward attention on Hopper: TMA loads and wgmma, warp-specialized. One CTA
// per (128-row query tile, head, batch):
//   producer warpgroup: one thread issues TMA copies of Q once, then K and V
//     of each key tile into a ring of stages; a stage is reused when both
//     consumer warpgroups have released it (kv_empty).
//   consumer warpgroups (64 query rows each): wait K -> S = Q K^T (wgmma,
//     both operands in shared memory) -> mask -> online softmax -> wait V ->
//     O += P V (wgmma, P from registers) -> release the stage.
// While one consumer warpgroup runs its softmax the other can keep the tensor
// cores busy; the producer keeps the next stages in flight under both.
// Key tiles are visited from the last to the first, as on the sm80 path: the
// tiles crossing the end of the keys or the causal diagonal come first.
#pragma once

#include "ckfmha/kernel/attention_mask.cuh"
#include "ckfmha/kernel/fragment_layout.cuh"
#include "ckfmha/kernel/fwd_params.h"
#include "ckfmha/kernel/online_softmax.cuh"
#include "ckfmha/kernel/tile_copy.cuh"

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <type_traits>

namespace ckfmha::kernel {

template <class Traits>
struct FwdSm90Params {
  FwdParams p;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaK tma_k;
  typename Traits::TmaV tma_v;
};

// Named barrier 0 is __syncthreads; the consumers use their own so the
// producer warpgroup never has to join.
constexpr uint32_t kConsumerBarrierId = 1;

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    fwd_sm90_kernel(__grid_constant__ const FwdSm90Params<Traits> params) {
  using namespace cute;
  using Element = typename Traits::Element;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using Storage = typename Traits::SharedStorage;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kStages = Traits::kStages;
  FwdParams const& p = params.p;

  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  // Later causal query tiles see more keys: launching them first leaves the
  // short ones for the tail of the grid.
  const int m_block = Traits::kMask == MaskMode::kCausal ? int(gridDim.x) - 1 - int(blockIdx.x)
                                                          : int(blockIdx.x);
  const int m_begin = m_block * kBlockM;
  const int head_k = head / p.head_group;

  extern __shared__ char smem_raw[];
  auto* storage = reinterpret_cast<Storage*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  Tensor sQ = make_tensor(make_smem_ptr(storage->q.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(storage->k.data()), typename Traits::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(storage->v.data()), typename Traits::SmemLayoutV{});
  Tensor sVt = make_tensor(make_smem_ptr(storage->v.data()), typename Traits::SmemLayoutVt{});

  const int offset = p.bottom_right ? p.seqlen_k - p.seqlen_q : 0;
  AttentionMask<Traits::kMask> mask{p.seqlen_k, offset, p.window_left, p.window_right};
  int n_first, n_last;
  mask.key_block_range(m_begin, kBlockM, kBlockN, &n_first, &n_last);
  const int n_tiles = n_last - n_first;

  const int warp = int(threadIdx.x) / 32;
  const int lane = int(threadIdx.x) % 32;
  if (threadIdx.x == 0) {
    Barrier::init(&storage->q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      Barrier::init(&storage->k_full[s], 1);
      Barrier::init(&storage->v_full[s], 1);
      Barrier::init(&storage->kv_empty[s], Traits::kConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (warp < 4) {
    // ---- producer warpgroup
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if (warp != 0 || lane != 0 || n_tiles == 0) return;
    // Coordinate tensors over the shapes the descriptors were encoded with.
    const int batches = int(gridDim.z);
    const int nhead_k = p.nhead_q / p.head_group;
    Tensor mQ = params.tma_q.get_tma_tensor(
        make_shape(p.seqlen_q, int(Traits::kHeadDimQK), p.nhead_q, batches));
    Tensor mK = params.tma_k.get_tma_tensor(
        make_shape(p.seqlen_k, int(Traits::kHeadDimQK), nhead_k, batches));
    Tensor mV = params.tma_v.get_tma_tensor(
        make_shape(p.seqlen_k, int(Traits::kHeadDimV), nhead_k, batches));
    Tensor gQ = local_tile(mQ(_, _, head, batch),
                           Shape<Int<kBlockM>, Int<Traits::kHeadDimQK>>{}, make_coord(m_block, 0));
    Tensor gK = local_tile(mK(_, _, head_k, batch),
                           Shape<Int<kBlockN>, Int<Traits::kHeadDimQK>>{}, make_coord(_, 0));
    Tensor gV = local_tile(mV(_, _, head_k, batch),
                           Shape<Int<kBlockN>, Int<Traits::kHeadDimV>>{}, make_coord(_, 0));
    auto [tQgQ, tQsQ] = tma_partition(params.tma_q, Int<0>{}, Layout<_1>{},
                                      group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    auto [tKgK, tKsK] = tma_partition(params.tma_k, Int<0>{}, Layout<_1>{},
                                      group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto [tVgV, tVsV] = tma_partition(params.tma_v, Int<0>{}, Layout<_1>{},
                                      group_modes<0, 2>(sV), group_modes<0, 2>(gV));

    Barrier::arrive_and_expect_tx(&storage->q_full, Traits::kTmaBytesQ);
    copy(params.tma_q.with(storage->q_full), tQgQ, tQsQ);
    for (int i = 0; i < n_tiles; ++i) {
      const int stage = i % kStages;
      const uint32_t phase = (i / kStages) & 1;
      const int n_block = n_last - 1 - i;
      // The first pass over the ring finds every stage free: waiting on the
      // parity before the barrier's initial phase returns at once.
      Barrier::wait(&storage->kv_empty[stage], phase ^ 1);
      Barrier::arrive_and_expect_tx(&storage->k_full[stage], Traits::kTmaBytesK);
      copy(params.tma_k.with(storage->k_full[stage]), tKgK(_, n_block), tKsK(_, stage));
      Barrier::arrive_and_expect_tx(&storage->v_full[stage], Traits::kTmaBytesV);
      copy(params.tma_v.with(storage->v_full[stage]), tVgV(_, n_block), tVsV(_, stage));
    }
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
  constexpr int kRows = decltype(size<0>(out))::value;

  clear(acc_o);
  OnlineSoftmax<kRows> softmax;
  softmax.reset();
  if (n_tiles > 0) Barrier::wait(&storage->q_full, 0);

  auto process_tile = [&](int i, auto needs_mask) {
    const int stage = i % kStages;
    const uint32_t phase = (i / kStages) & 1;
    const int n_block = n_last - 1 - i;
    Tensor acc_s = partition_fragment_C(mma_qk, TileS{});

    Barrier::wait(&storage->k_full[stage], phase);
    mma_qk.accumulate_ = GMMA::ScaleOut::Zero;
    warpgroup_fence_operand(acc_s);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tSrQ); ++k) {
      gemm(mma_qk, tSrQ(_, _, k), tSrK(_, _, k, stage), acc_s);
      mma_qk.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_s);

    Tensor scores = make_tensor(acc_s.data(), gmma_accum_as_rows_cols(acc_s.layout()));
    if constexpr (decltype(needs_mask)::value) {
      mask.apply(scores, cS_rows_cols, m_begin, n_block * kBlockN);
    }
    if (i == 0) {
      softmax.template update<true>(scores, out, p.scale_log2);
    } else {
      softmax.template update<false>(scores, out, p.scale_log2);
    }
    Tensor probs = convert_fragment<Element>(acc_s);
    Tensor tOrP = make_tensor(probs.data(), gmma_accum_as_operand_a(probs.layout()));

    Barrier::wait(&storage->v_full[stage], phase);
    warpgroup_fence_operand(acc_o);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tOrP); ++k) {
      gemm(mma_pv, tOrP(_, _, k), tOrVt(_, _, k, stage), acc_o);
    }
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_o);
    Barrier::arrive(&storage->kv_empty[stage]);
  };

  auto tile_needs_mask = [&](int i) {
    return mask.tile_needs_mask(m_begin, (n_last - 1 - i) * kBlockN, kBlockM, kBlockN);
  };
  // Same order as the sm80 path: masked tiles at the end of the keys and on
  // the diagonal, then unmasked ones, then (windows only) the left edge.
  int i = 0;
  for (; i < n_tiles && tile_needs_mask(i); ++i) process_tile(i, std::true_type{});
  for (; i < n_tiles && !tile_needs_mask(i); ++i) process_tile(i, std::false_type{});
  if constexpr (Traits::kMask == MaskMode::kWindow) {
    for (; i < n_tiles; ++i) process_tile(i, std::true_type{});
  }

  // ---- epilogue
  float lse[kRows];
  softmax.template finalize<false>(out, p.scale_log2, 0.f, 1.f, lse);

  if constexpr (Traits::kHasLse) {
    if (p.lse != nullptr) {
      Tensor cO = thr_pv.partition_C(make_identity_tensor(TileO{}));
      Tensor cO_rows_cols = make_tensor(cO.data(), gmma_accum_as_rows_cols(cO.layout()));
      float* lse_out = p.lse + batch * p.lse_batch_stride + head * p.lse_head_stride;
      if (get<1>(cO_rows_cols(0, 0)) == 0) {  // one lane of each quad owns the row
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
          int row = m_begin + get<0>(cO_rows_cols(r, 0));
          if (row < p.seqlen_q) lse_out[row] = lse[r];
        }
      }
    }
  }

  // Both consumer warpgroups must be done reading Q before O overwrites it.
  cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, kConsumerBarrierId);
  Tensor sO = make_tensor(make_smem_ptr(storage->q.data()), typename Traits::SmemLayoutO{});
  Tensor rO = convert_fragment<Element>(acc_o);
  auto o_r2s = make_tiled_copy_C(typename Traits::SmemStoreAtomO{}, mma_pv);
  auto o_r2s_thr = o_r2s.get_thread_slice(tid);
  copy(o_r2s, o_r2s_thr.retile_S(rO), o_r2s_thr.partition_D(sO));
  cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, kConsumerBarrierId);

  auto* o_base = static_cast<Element*>(p.o) + batch * p.o_batch_stride +
                 head * p.o_head_stride + m_begin * p.o_row_stride;
  Tensor gO = make_tensor(make_gmem_ptr(o_base), TileO{}, make_stride(p.o_row_stride, _1{}));
  typename Traits::RowsO::Store o_store;
  auto o_store_thr = o_store.get_thread_slice(tid);
  Tensor tOgO = o_store_thr.partition_D(gO);
  store_rows(o_store, o_store_thr.partition_S(sO), tOgO,
             o_store_thr.partition_S(make_identity_tensor(TileO{})), p.seqlen_q - m_begin);
}

}  // namespace ckfmha::kernel
