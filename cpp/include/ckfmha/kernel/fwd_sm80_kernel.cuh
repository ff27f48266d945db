// Forward attention on the sm80 tensor-core path (cp.async + ldmatrix +
// mma.sync), one CTA per (query tile, head, batch).
//
// Per key tile, with K and V each single-buffered in shared memory:
//   wait K -> start loading V -> S = Q K^T -> mask -> wait V -> start loading
//   the next K -> online softmax -> O += P V
// so each load runs under a GEMM or the softmax. Key tiles are visited from
// the last to the first: the only tiles needing a mask (the ragged end of the
// sequence, the causal diagonal) come first, where the branch is cheapest.
#pragma once

#include "ckfmha/kernel/causal_mask.cuh"
#include "ckfmha/kernel/fragment_layout.cuh"
#include "ckfmha/kernel/fwd_params.h"
#include "ckfmha/kernel/gemm_pieces.cuh"
#include "ckfmha/kernel/online_softmax.cuh"
#include "ckfmha/kernel/tile_copy.cuh"

#include <cute/tensor.hpp>

namespace ckfmha::kernel {

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    fwd_sm80_kernel(__grid_constant__ const FwdParams p) {
  using namespace cute;
  using Element = typename Traits::Element;
  using TileQ = Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>;
  using TileKV = Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDim>>;
  using TileS = Shape<Int<Traits::kBlockM>, Int<Traits::kBlockN>>;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;

  extern __shared__ __align__(128) char smem_bytes[];
  const int tid = threadIdx.x;
  // Under a causal mask later query tiles see more keys: launching them first
  // leaves the short tiles to fill the tail of the grid.
  const int m_block = Traits::kIsCausal ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int head_k = head / p.head_group;
  const int m_begin = m_block * kBlockM;

  auto const* q_base = static_cast<Element const*>(p.q) + batch * p.q_batch_stride +
                       head * p.q_head_stride + m_begin * p.q_row_stride;
  auto const* k_base =
      static_cast<Element const*>(p.k) + batch * p.k_batch_stride + head_k * p.k_head_stride;
  auto const* v_base =
      static_cast<Element const*>(p.v) + batch * p.v_batch_stride + head_k * p.v_head_stride;
  auto* o_base = static_cast<Element*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride +
                 m_begin * p.o_row_stride;

  auto key_tile = [](Element const* base, int64_t row_stride, int n_block) {
    return make_tensor(make_gmem_ptr(base + int64_t(n_block) * kBlockN * row_stride), TileKV{},
                       make_stride(row_stride, _1{}));
  };
  Tensor gQ = make_tensor(make_gmem_ptr(q_base), TileQ{}, make_stride(p.q_row_stride, _1{}));
  Tensor gO = make_tensor(make_gmem_ptr(o_base), TileQ{}, make_stride(p.o_row_stride, _1{}));

  auto* smem_q = reinterpret_cast<Element*>(smem_bytes);
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(sQ.data() + cosize(typename Traits::SmemLayoutQ{}),
                          typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(sK.data() + cosize(typename Traits::SmemLayoutKV{}),
                          typename Traits::SmemLayoutKV{});
  Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});

  // ---- global -> shared
  typename Traits::GmemLoad gmem_load;
  auto load_thr = gmem_load.get_thread_slice(tid);
  Tensor tQsQ = load_thr.partition_D(sQ);
  Tensor tKsK = load_thr.partition_D(sK);
  Tensor tVsV = load_thr.partition_D(sV);
  Tensor tQcQ = load_thr.partition_S(make_identity_tensor(TileQ{}));
  Tensor tKVc = load_thr.partition_S(make_identity_tensor(TileKV{}));
  auto load_keys = [&](auto& smem_part, Element const* base, int64_t row_stride, int n_block) {
    load_rows(gmem_load, load_thr.partition_S(key_tile(base, row_stride, n_block)), smem_part,
              tKVc, p.seqlen_k - n_block * kBlockN);
  };

  // ---- shared -> registers and the MMAs
  typename Traits::TiledMma tiled_mma;
  auto mma_thr = tiled_mma.get_thread_slice(tid);
  Tensor tSrQ = mma_thr.partition_fragment_A(sQ);
  Tensor tSrK = mma_thr.partition_fragment_B(sK);
  Tensor tOrVt = mma_thr.partition_fragment_B(sVt);
  Tensor acc_o = partition_fragment_C(tiled_mma, TileQ{});

  auto q_s2r = make_tiled_copy_A(typename Traits::SmemLoadAtom{}, tiled_mma);
  auto q_s2r_thr = q_s2r.get_thread_slice(tid);
  Tensor tSsQ = q_s2r_thr.partition_S(sQ);
  Tensor tSrQ_view = q_s2r_thr.retile_D(tSrQ);
  auto k_s2r = make_tiled_copy_B(typename Traits::SmemLoadAtom{}, tiled_mma);
  auto k_s2r_thr = k_s2r.get_thread_slice(tid);
  Tensor tSsK = k_s2r_thr.partition_S(sK);
  Tensor tSrK_view = k_s2r_thr.retile_D(tSrK);
  auto v_s2r = make_tiled_copy_B(typename Traits::SmemLoadAtomTransposed{}, tiled_mma);
  auto v_s2r_thr = v_s2r.get_thread_slice(tid);
  Tensor tOsVt = v_s2r_thr.partition_S(sVt);
  Tensor tOrVt_view = v_s2r_thr.retile_D(tOrVt);

  Tensor cS = mma_thr.partition_C(make_identity_tensor(TileS{}));
  Tensor cS_rows_cols = make_tensor(cS.data(), accum_as_rows_cols(cS.layout()));
  Tensor out = make_tensor(acc_o.data(), accum_as_rows_cols(acc_o.layout()));
  constexpr int kRows = decltype(size<0>(out))::value;

  AttentionMask<Traits::kIsCausal> mask{p.seqlen_k, p.causal_offset};
  int n_blocks = ceil_div(p.seqlen_k, kBlockN);
  if constexpr (Traits::kIsCausal) {
    int visible_end = m_begin + kBlockM + p.causal_offset;  // one past the last visible key
    n_blocks = visible_end <= 0 ? 0 : min(n_blocks, ceil_div(visible_end, kBlockN));
  }

  load_rows(gmem_load, load_thr.partition_S(gQ), tQsQ, tQcQ, p.seqlen_q - m_begin);
  if (n_blocks > 0) load_keys(tKsK, k_base, p.k_row_stride, n_blocks - 1);
  cp_async_fence();

  clear(acc_o);
  OnlineSoftmax<kRows> softmax;
  softmax.reset();

  for (int step = 0; step < n_blocks; ++step) {
    const int n_block = n_blocks - 1 - step;
    const int n_begin = n_block * kBlockN;
    Tensor acc_s = partition_fragment_C(tiled_mma, TileS{});
    clear(acc_s);

    cp_async_wait<0>();
    __syncthreads();  // K tile landed; every warp is done with the previous V
    load_keys(tVsV, v_base, p.v_row_stride, n_block);
    cp_async_fence();

    gemm_smem_smem(tiled_mma, acc_s, tSrQ, tSrQ_view, tSsQ, q_s2r, tSrK, tSrK_view, tSsK, k_s2r);
    Tensor scores = make_tensor(acc_s.data(), accum_as_rows_cols(acc_s.layout()));
    if (mask.tile_needs_mask(m_begin, n_begin, kBlockN)) {
      mask.apply(scores, cS_rows_cols, m_begin, n_begin);
    }

    cp_async_wait<0>();
    __syncthreads();  // V tile landed; every warp is done with this K
    if (n_block > 0) {
      load_keys(tKsK, k_base, p.k_row_stride, n_block - 1);
      cp_async_fence();
    }

    if (step == 0) {
      softmax.template update<true>(scores, out, p.scale_log2);
    } else {
      softmax.template update<false>(scores, out, p.scale_log2);
    }
    Tensor probs = convert_fragment<Element>(acc_s);
    Tensor tOrP = make_tensor(probs.data(), accum_as_operand_a(probs.layout()));
    gemm_regs_smem(tiled_mma, acc_o, tOrP, tOrVt, tOrVt_view, tOsVt, v_s2r);
  }

  // ---- epilogue
  float lse[kRows];
  softmax.finalize(out, p.scale, lse);

  if constexpr (Traits::kHasLse) {
    if (p.lse != nullptr) {
      Tensor cO = mma_thr.partition_C(make_identity_tensor(TileQ{}));
      Tensor cO_rows_cols = make_tensor(cO.data(), accum_as_rows_cols(cO.layout()));
      float* lse_out = p.lse + (int64_t(batch) * p.nhead_q + head) * p.seqlen_q;
      if (get<1>(cO_rows_cols(0, 0)) == 0) {  // one lane of each quad owns the row
        CUTE_UNROLL
        for (int i = 0; i < kRows; ++i) {
          int row = m_begin + get<0>(cO_rows_cols(i, 0));
          if (row < p.seqlen_q) lse_out[row] = lse[i];
        }
      }
    }
  }

  // Stage O through shared memory (over Q) so global stores are 16 bytes wide.
  Tensor rO = convert_fragment<Element>(acc_o);
  Tensor sO = make_tensor(sQ.data(), typename Traits::SmemLayoutQ{});
  auto o_r2s = make_tiled_copy_C(typename Traits::SmemStoreAtom{}, tiled_mma);
  auto o_r2s_thr = o_r2s.get_thread_slice(tid);
  Tensor tOrO = o_r2s_thr.retile_S(rO);
  Tensor tOsO = o_r2s_thr.partition_D(sO);
  cp_async_wait<0>();  // with no visible key the Q load may still be in flight
  __syncthreads();
  copy(o_r2s, tOrO, tOsO);
  __syncthreads();

  typename Traits::GmemStore gmem_store;
  auto store_thr = gmem_store.get_thread_slice(tid);
  Tensor tOgO = store_thr.partition_D(gO);
  store_rows(gmem_store, store_thr.partition_S(sO), tOgO, tQcQ, p.seqlen_q - m_begin);
}

}  // namespace ckfmha::kernel
