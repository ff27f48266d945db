// Backward attention on the sm80 tensor-core path (cp.async + ldmatrix +
// mma.sync): the three stages of the plan.
//
// bwd_dq_dk_dv: one CTA per key tile (BlockN keys of one KV head and batch
// entry). K and V stay in shared memory; dK and dV accumulate in registers
// over every query tile of every query head of the KV head's group, so GQA
// and MQA sum their gradients without atomics or an fp32 dK/dV buffer (and
// deterministically); the price is a grid smaller by the group size, which
// only matters for short sequences with few KV heads. Per query tile:
//   S = Q K^T, dP = dO V^T -> P = exp(S - LSE), dS = P (dP - D) -> P, dS to
//   shared memory -> dV += P^T dO, dK += dS^T Q, dQ_partial = dS K
// and dQ_partial is added to the fp32 accumulator in global memory: with
// atomics (fast mode), or, deterministic, into this CTA's own slice in
// program order (the CTA then walks key tiles split, split + splits, ...).
// With two stages the next query tile's Q and dO load under this one's work.
// Soft-capping, biases (elementwise, ALiBi) and dropout recompute the
// forward's logits and Philox stream per score; dS then carries the soft-cap's
// derivative and dP the dropout mask. Kernels with dbias also store
// P (dP - D) of every visited tile and zero the rest of their key columns
// (common/dbias.cuh).
#pragma once

#include "ckfmha/kernel/common/attention_mask.cuh"
#include "ckfmha/kernel/common/dbias.cuh"
#include "ckfmha/kernel/common/fragment_layout.cuh"
#include "ckfmha/kernel/common/gemm_pieces.cuh"
#include "ckfmha/kernel/common/logit_transform.cuh"
#include "ckfmha/kernel/common/online_softmax.cuh"
#include "ckfmha/kernel/common/philox_dropout.cuh"
#include "ckfmha/kernel/common/sequence_slice.cuh"
#include "ckfmha/kernel/common/tile_copy.cuh"
#include "ckfmha/kernel/params/bwd_params.h"
#include "ckfmha/kernel/params/bwd_workspace_rows.cuh"

#include <cute/tensor.hpp>
#include <cutlass/array.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace ckfmha::kernel {

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinCtasPerSm)
    bwd_dq_dk_dv_sm80_kernel(__grid_constant__ const BwdParams p) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kD = Traits::kHeadDimQK;
  constexpr int kDv = Traits::kHeadDimV;
  using TileQ = Shape<Int<kBlockM>, Int<kD>>;
  using TileO = Shape<Int<kBlockM>, Int<kDv>>;
  using TileK = Shape<Int<kBlockN>, Int<kD>>;
  using TileV = Shape<Int<kBlockN>, Int<kDv>>;
  using TileS = Shape<Int<kBlockM>, Int<kBlockN>>;
  constexpr bool kGroup = Traits::kIsGroupMode;
  constexpr bool kDoubleBuffered = Traits::kStages == 2;
  using Transform = LogitTransform<Element, Traits::kBias, Traits::kHasSoftcap>;
  // Kernels with logit transforms or dropout compute P one score at a time.
  constexpr bool kPerElement = Transform::kActive || Traits::kHasDropout;
  constexpr bool kDbias = Traits::kHasDbias;
  static_assert(!kDbias || kPerElement, "dbias kernels have an elementwise bias");
  // With a soft-cap, dbias (dL/d logit) and dS (dL/d scaled score) differ by
  // the cap's derivative, which is then kept per score.
  constexpr bool kKeepCapGrad = kDbias && Traits::kHasSoftcap;

  const int tid = threadIdx.x;
  const int head_k = blockIdx.y;
  const int batch = blockIdx.z;
  const SequenceSlice seq = locate_sequence<kGroup>(p, batch);
  const int n_blocks = (seq.seqlen_k + kBlockN - 1) / kBlockN;
  // dbias: key tiles of the padded problem too, whose columns only get zeroes
  // (group mode: past this sequence's keys); batch mode walks the same tiles.
  const int n_blocks_walked = kDbias ? (p.seqlen_k + kBlockN - 1) / kBlockN : n_blocks;
  if (int(blockIdx.x) >= n_blocks_walked) return;
  const int group = p.head_group;
  const int head_begin = head_k * group;
  // Deterministic mode: blockIdx.x is the split and owns dQ slice blockIdx.x.
  const int split = p.deterministic ? int(blockIdx.x) : 0;

  const int64_t q_origin = kGroup ? seq.q_token0 * p.q_row_stride : batch * p.q_batch_stride;
  const int64_t do_origin = kGroup ? seq.q_token0 * p.do_row_stride : batch * p.do_batch_stride;
  const int64_t k_origin = kGroup ? seq.k_token0 * p.k_row_stride : batch * p.k_batch_stride;
  const int64_t v_origin = kGroup ? seq.k_token0 * p.v_row_stride : batch * p.v_batch_stride;
  const int64_t dk_origin = kGroup ? seq.k_token0 * p.dk_row_stride : batch * p.dk_batch_stride;
  const int64_t dv_origin = kGroup ? seq.k_token0 * p.dv_row_stride : batch * p.dv_batch_stride;
  auto const* q_heads = static_cast<Element const*>(p.q) + q_origin + head_begin * p.q_head_stride;
  auto const* do_heads =
      static_cast<Element const*>(p.dout) + do_origin + head_begin * p.do_head_stride;
  auto const* k_head = static_cast<Element const*>(p.k) + k_origin + head_k * p.k_head_stride;
  auto const* v_head = static_cast<Element const*>(p.v) + v_origin + head_k * p.v_head_stride;
  auto* dk_head = static_cast<Element*>(p.dk) + dk_origin + head_k * p.dk_head_stride;
  auto* dv_head = static_cast<Element*>(p.dv) + dv_origin + head_k * p.dv_head_stride;
  float const* lse_heads = p.lse + (kGroup ? seq.q_token0 : batch * p.lse_batch_stride) +
                           head_begin * p.lse_head_stride;
  float const* delta_heads = p.delta + bwd_workspace_row0(p, batch, head_begin);
  float* dq_accum_heads = p.dq_accum + split * p.dq_accum_split_stride +
                          bwd_workspace_row0(p, batch, head_begin) * kD;
  const int64_t workspace_head_rows = p.workspace_rows;
  // dbias planes of the group's first query head; GQA heads are further planes.
  const int64_t dbias_origin = kDbias ? batch * p.dbias_batch_stride + head_begin * p.dbias_head_stride : 0;
  auto dbias_plane = [&](int h) {
    return DbiasPlane<Element>::at(p.dbias, dbias_origin + int64_t(h) * p.dbias_head_stride,
                                   p.dbias_row_stride);
  };

  // ---- shared memory: Q and dO stages, K, V, P, dS
  extern __shared__ __align__(128) char smem_bytes[];
  auto* smem = reinterpret_cast<Element*>(smem_bytes);
  // Local copies: binding a static member to cute's by-reference operators
  // would odr-use it in device code.
  constexpr int kQElems = Traits::kSmemQElems;
  constexpr int kdOElems = Traits::kSmemdOElems;
  constexpr int kKElems = Traits::kSmemKElems;
  constexpr int kVElems = Traits::kSmemVElems;
  constexpr int kSElems = Traits::kSmemSElems;
  constexpr int kStages = Traits::kStages;
  Tensor sQ = make_tensor(make_smem_ptr(smem), typename Traits::SmemLayoutQ{});
  Tensor sQt = make_tensor(sQ.data(), typename Traits::SmemLayoutQt{});
  Tensor sdO = make_tensor(sQ.data() + kStages * kQElems, typename Traits::SmemLayoutdO{});
  Tensor sdOt = make_tensor(sdO.data(), typename Traits::SmemLayoutdOt{});
  Tensor sK = make_tensor(sdO.data() + kStages * kdOElems, typename Traits::SmemLayoutK{});
  Tensor sKt = make_tensor(sK.data(), typename Traits::SmemLayoutKt{});
  Tensor sV = make_tensor(sK.data() + kKElems, typename Traits::SmemLayoutV{});
  Tensor sP = make_tensor(sV.data() + kVElems, typename Traits::SmemLayoutS{});
  Tensor sPt = make_tensor(sP.data(), typename Traits::SmemLayoutSt{});
  Tensor sdS = make_tensor(sP.data() + kSElems, typename Traits::SmemLayoutS{});
  Tensor sdSt = make_tensor(sdS.data(), typename Traits::SmemLayoutSt{});

  // ---- global -> shared
  typename Traits::RowsQK::Load qk_load;
  typename Traits::RowsV::Load v_load;
  auto qk_load_thr = qk_load.get_thread_slice(tid);
  auto v_load_thr = v_load.get_thread_slice(tid);
  Tensor tQsQ = qk_load_thr.partition_D(sQ);
  Tensor tdOsdO = v_load_thr.partition_D(sdO);
  Tensor tKsK = qk_load_thr.partition_D(sK);
  Tensor tVsV = v_load_thr.partition_D(sV);
  Tensor tQcQ = qk_load_thr.partition_S(make_identity_tensor(TileQ{}));
  Tensor tdOcdO = v_load_thr.partition_S(make_identity_tensor(TileO{}));
  Tensor tKcK = qk_load_thr.partition_S(make_identity_tensor(TileK{}));
  Tensor tVcV = v_load_thr.partition_S(make_identity_tensor(TileV{}));
  // This thread's slice of the first query tile of the first head; other
  // tiles are the same slice moved, so row addresses are computed once.
  Tensor tQgQ0 = qk_load_thr.partition_S(
      make_tensor(make_gmem_ptr(q_heads), TileQ{}, make_stride(p.q_row_stride, _1{})));
  Tensor tdOgdO0 = v_load_thr.partition_S(
      make_tensor(make_gmem_ptr(do_heads), TileO{}, make_stride(p.do_row_stride, _1{})));

  // ---- shared -> registers and the five products
  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmadK mma_dk;
  typename Traits::TiledMmadV mma_dv;
  typename Traits::TiledMmadQ mma_dq;
  auto sdp_thr = mma_sdp.get_thread_slice(tid);
  auto dk_thr = mma_dk.get_thread_slice(tid);
  auto dv_thr = mma_dv.get_thread_slice(tid);
  auto dq_thr = mma_dq.get_thread_slice(tid);

  // S = Q K^T and dP = dO V^T
  Tensor tSrQ = sdp_thr.partition_fragment_A(sQ);
  Tensor tSrK = sdp_thr.partition_fragment_B(sK);
  Tensor tdPrdO = sdp_thr.partition_fragment_A(sdO);
  Tensor tdPrV = sdp_thr.partition_fragment_B(sV);
  auto sdp_a = make_tiled_copy_A(typename Traits::SmemLoadAtom{}, mma_sdp);
  auto sdp_a_thr = sdp_a.get_thread_slice(tid);
  auto sdp_b = make_tiled_copy_B(typename Traits::SmemLoadAtom{}, mma_sdp);
  auto sdp_b_thr = sdp_b.get_thread_slice(tid);
  Tensor tSsQ = sdp_a_thr.partition_S(sQ);
  Tensor tSrQ_view = sdp_a_thr.retile_D(tSrQ);
  Tensor tdPsdO = sdp_a_thr.partition_S(sdO);
  Tensor tdPrdO_view = sdp_a_thr.retile_D(tdPrdO);
  Tensor tSsK = sdp_b_thr.partition_S(sK);
  Tensor tSrK_view = sdp_b_thr.retile_D(tSrK);
  Tensor tdPsV = sdp_b_thr.partition_S(sV);
  Tensor tdPrV_view = sdp_b_thr.retile_D(tdPrV);

  // dV += P^T dO
  Tensor tdVrPt = dv_thr.partition_fragment_A(sPt);
  Tensor tdVrdOt = dv_thr.partition_fragment_B(sdOt);
  auto dv_a = make_tiled_copy_A(typename Traits::SmemLoadAtomTransposed{}, mma_dv);
  auto dv_a_thr = dv_a.get_thread_slice(tid);
  auto dv_b = make_tiled_copy_B(typename Traits::SmemLoadAtomTransposed{}, mma_dv);
  auto dv_b_thr = dv_b.get_thread_slice(tid);
  Tensor tdVsPt = dv_a_thr.partition_S(sPt);
  Tensor tdVrPt_view = dv_a_thr.retile_D(tdVrPt);
  Tensor tdVsdOt = dv_b_thr.partition_S(sdOt);
  Tensor tdVrdOt_view = dv_b_thr.retile_D(tdVrdOt);

  // dK += dS^T Q
  Tensor tdKrdSt = dk_thr.partition_fragment_A(sdSt);
  Tensor tdKrQt = dk_thr.partition_fragment_B(sQt);
  auto dk_a = make_tiled_copy_A(typename Traits::SmemLoadAtomTransposed{}, mma_dk);
  auto dk_a_thr = dk_a.get_thread_slice(tid);
  auto dk_b = make_tiled_copy_B(typename Traits::SmemLoadAtomTransposed{}, mma_dk);
  auto dk_b_thr = dk_b.get_thread_slice(tid);
  Tensor tdKsdSt = dk_a_thr.partition_S(sdSt);
  Tensor tdKrdSt_view = dk_a_thr.retile_D(tdKrdSt);
  Tensor tdKsQt = dk_b_thr.partition_S(sQt);
  Tensor tdKrQt_view = dk_b_thr.retile_D(tdKrQt);

  // dQ = dS K
  Tensor tdQrdS = dq_thr.partition_fragment_A(sdS);
  Tensor tdQrKt = dq_thr.partition_fragment_B(sKt);
  auto dq_a = make_tiled_copy_A(typename Traits::SmemLoadAtom{}, mma_dq);
  auto dq_a_thr = dq_a.get_thread_slice(tid);
  auto dq_b = make_tiled_copy_B(typename Traits::SmemLoadAtomTransposed{}, mma_dq);
  auto dq_b_thr = dq_b.get_thread_slice(tid);
  Tensor tdQsdS = dq_a_thr.partition_S(sdS);
  Tensor tdQrdS_view = dq_a_thr.retile_D(tdQrdS);
  Tensor tdQsKt = dq_b_thr.partition_S(sKt);
  Tensor tdQrKt_view = dq_b_thr.retile_D(tdQrKt);
  Tensor cdQ = dq_thr.partition_C(make_identity_tensor(TileQ{}));

  // P and dS: registers -> shared memory in the S accumulator's layout.
  auto s_r2s = make_tiled_copy_C(typename Traits::SmemStoreAtom{}, mma_sdp);
  auto s_r2s_thr = s_r2s.get_thread_slice(tid);
  Tensor tPsP = s_r2s_thr.partition_D(sP);
  Tensor tdSsdS = s_r2s_thr.partition_D(sdS);

  Tensor acc_dk = partition_fragment_C(mma_dk, TileK{});
  Tensor acc_dv = partition_fragment_C(mma_dv, TileV{});
  Tensor cS = sdp_thr.partition_C(make_identity_tensor(TileS{}));
  Tensor cS_rows_cols = make_tensor(cS.data(), accum_as_rows_cols(cS.layout()));
  constexpr int kRows = decltype(size<0>(cS_rows_cols))::value;

  // ---- per-sequence features
  const auto mask = AttentionMask<Traits::kMask>::for_sequence(p, seq.seqlen_q, seq.seqlen_k);
  // Transformed scores are already log2-domain logits.
  const float exp2_scale = Transform::kActive ? 1.f : p.scale_log2;

  for (int n_block = blockIdx.x; n_block < n_blocks_walked; n_block += gridDim.x) {
    const int n_begin = n_block * kBlockN;
    if constexpr (kDbias) {
      if (n_block >= n_blocks) {  // padding columns only (group mode)
        const int n_end = min(n_begin + kBlockN, p.seqlen_k);
        for (int h = 0; h < group; ++h) {
          dbias_plane(h).template zero<Traits::kThreads, kBlockN>(tid, n_begin, 0, p.seqlen_q,
                                                                  n_begin, n_end);
        }
        continue;
      }
    }
    int m_first, m_last;
    mask.query_block_range(n_begin, kBlockN, kBlockM, seq.seqlen_q, &m_first, &m_last);
    const int m_count = m_last - m_first;
    const int iters = m_count * group;
    if constexpr (kDbias) {
      // Everything of these columns the tiles below do not store: rows the
      // mask leaves out, rows past the sequence, and (group mode) keys past it.
      const int n_end = min(n_begin + kBlockN, p.seqlen_k);
      const int rows_begin = min(m_first * kBlockM, seq.seqlen_q);
      const int rows_end = m_count > 0 ? min(m_last * kBlockM, seq.seqlen_q) : rows_begin;
      for (int h = 0; h < group; ++h) {
        const DbiasPlane<Element> plane = dbias_plane(h);
        plane.template zero<Traits::kThreads, kBlockN>(tid, n_begin, 0, rows_begin, n_begin,
                                                       n_end);
        plane.template zero<Traits::kThreads, kBlockN>(tid, n_begin, rows_end, p.seqlen_q,
                                                       n_begin, n_end);
        plane.template zero<Traits::kThreads, kBlockN>(tid, n_begin, rows_begin, rows_end,
                                                       seq.seqlen_k, n_end);
      }
    }

    // Query tiles are visited head by head (head_begin + h), each over the row
    // blocks [m_first, m_last); (h, m_block) advance together with a flat
    // counter `it` (whose parity picks the stage), never by division.
    auto load_q_do = [&](int h, int m_block, int stage) {
      const int m_begin = m_block * kBlockM;
      Tensor src_q = make_tensor(
          tQgQ0.data() + (int64_t(h) * p.q_head_stride + int64_t(m_begin) * p.q_row_stride),
          tQgQ0.layout());
      Tensor src_do = make_tensor(
          tdOgdO0.data() + (int64_t(h) * p.do_head_stride + int64_t(m_begin) * p.do_row_stride),
          tdOgdO0.layout());
      Tensor dst_q = in_stage(tQsQ, stage, kQElems);
      Tensor dst_do = in_stage(tdOsdO, stage, kdOElems);
      const int rows_left = seq.seqlen_q - m_begin;
      if (rows_left >= kBlockM) {  // uniform over the CTA: whole tiles skip the predicates
        copy(qk_load, src_q, dst_q);
        copy(v_load, src_do, dst_do);
      } else {
        load_rows(qk_load, src_q, dst_q, tQcQ, rows_left);
        load_rows(v_load, src_do, dst_do, tdOcdO, rows_left);
      }
    };

    // The previous key tile staged dK and dV over K and V.
    __syncthreads();
    {
      Tensor gK = make_tensor(make_gmem_ptr(k_head + int64_t(n_begin) * p.k_row_stride), TileK{},
                              make_stride(p.k_row_stride, _1{}));
      Tensor gV = make_tensor(make_gmem_ptr(v_head + int64_t(n_begin) * p.v_row_stride), TileV{},
                              make_stride(p.v_row_stride, _1{}));
      load_rows(qk_load, qk_load_thr.partition_S(gK), tKsK, tKcK, seq.seqlen_k - n_begin);
      load_rows(v_load, v_load_thr.partition_S(gV), tVsV, tVcV, seq.seqlen_k - n_begin);
    }
    if (iters > 0) load_q_do(0, m_first, 0);
    cp_async_fence();
    clear(acc_dk);
    clear(acc_dv);

    // Tile `it` is (h, m_block); (next_h, next_m) is the one after it, if any.
    auto process_tile = [&](int it, int h, int m_block, int next_h, int next_m,
                            auto needs_mask) __attribute__((always_inline)) {
      constexpr bool kNeedsMask = decltype(needs_mask)::value;
      const int m_begin = m_block * kBlockM;
      const int stage = kDoubleBuffered ? (it & 1) : 0;
      if constexpr (!kDoubleBuffered) {
        if (it > 0) {
          __syncthreads();  // every warp is done with the previous Q, dO, P and dS
          load_q_do(h, m_block, 0);
          cp_async_fence();
        }
      }

      // Each thread's rows: the LSE (log2 domain) and D, read before the
      // loads are waited on so their latency hides under the wait.
      float lse_log2[kRows];
      float delta[kRows];
      {
        float const* lse_rows = lse_heads + int64_t(h) * p.lse_head_stride;
        float const* delta_rows = delta_heads + int64_t(h) * workspace_head_rows;
        CUTE_UNROLL
        for (int i = 0; i < kRows; ++i) {
          const int row = m_begin + get<0>(cS_rows_cols(i, 0));
          if (row < seq.seqlen_q) {
            lse_log2[i] = bwd_lse_log2(lse_rows[row]);
            delta[i] = delta_rows[row];
          } else {
            lse_log2[i] = INFINITY;  // rows past the sequence: P = 0
            delta[i] = 0.f;
          }
        }
      }

      cp_async_wait<0>();
      // This tile's Q and dO landed; double-buffered, every warp is also done
      // with the other stage, so the next tile may load into it now.
      __syncthreads();
      if constexpr (kDoubleBuffered) {
        if (it + 1 < iters) {
          load_q_do(next_h, next_m, stage ^ 1);
          cp_async_fence();
        }
      }

      Tensor acc_s = partition_fragment_C(mma_sdp, TileS{});
      clear(acc_s);
      gemm_smem_smem(mma_sdp, acc_s, tSrQ, tSrQ_view, in_stage(tSsQ, stage, kQElems), sdp_a,
                     tSrK, tSrK_view, tSsK, sdp_b);
      Tensor scores = make_tensor(acc_s.data(), accum_as_rows_cols(acc_s.layout()));
      // Set bit (i * cols + j): the forward kept element (i, j) (dropout only).
      uint64_t kept_bits = ~uint64_t(0);
      constexpr int kCols = decltype(size<1>(scores))::value;
      float cap_grads[kKeepCapGrad ? kRows * kCols : 1];
      if constexpr (!kPerElement) {
        if constexpr (kNeedsMask) mask.apply(scores, cS_rows_cols, m_begin, n_begin);
        CUTE_UNROLL
        for (int i = 0; i < kRows; ++i) {
          CUTE_UNROLL
          for (int j = 0; j < size<1>(scores); ++j) {
            scores(i, j) = exp2f(scores(i, j) * exp2_scale - lse_log2[i]);
          }
        }
        // P goes to shared memory while the tensor cores compute dP.
        Tensor rP = convert_fragment<Element>(acc_s);
        copy(s_r2s, s_r2s_thr.retile_S(rP), tPsP);
      } else {
        // Logit transforms and dropout, one score at a time: shared memory
        // gets the dropped, rescaled P (the forward's weights of V), and the
        // registers keep P times the soft-cap's derivative for dS.
        const int head = head_begin + h;
        const Transform transform =
            Transform::for_sequence(p, seq.seqlen_q, seq.seqlen_k, batch, head);
        if constexpr (Traits::kHasDropout) {
          // Keys of one thread sit 8 * (warps along N) apart, so each column
          // pair needs its own Philox block (ColumnGroup 2).
          kept_bits = PhiloxDropout::for_backward(p, seq.seqlen_q, seq.seqlen_k, batch, head)
                          .template keep_bits<2>(cS_rows_cols, m_begin, n_begin);
        }
        const float rescale = Traits::kHasDropout ? p.dropout_rescale : 1.f;
        Tensor rP = make_tensor<Element>(acc_s.layout());
        Tensor probs = make_tensor(rP.data(), accum_as_rows_cols(rP.layout()));
        CUTE_UNROLL
        for (int i = 0; i < kRows; ++i) {
          const int row = m_begin + get<0>(cS_rows_cols(i, 0));
          CUTE_UNROLL
          for (int j = 0; j < size<1>(scores); ++j) {
            const int col = n_begin + get<1>(cS_rows_cols(i, j));
            float cap_grad = 1.f;
            float logit = Transform::kActive ? transform.logit_log2(scores(i, j), row, col, cap_grad)
                                             : scores(i, j) * exp2_scale;
            bool visible = !kNeedsMask || mask.visible(row, col);
            float prob = visible ? exp2f(logit - lse_log2[i]) : 0.f;
            bool kept = (kept_bits >> (i * size<1>(scores) + j)) & 1;
            probs(i, j) = Element(kept ? prob * rescale : 0.f);
            if constexpr (kKeepCapGrad) {
              cap_grads[i * kCols + j] = cap_grad;
              scores(i, j) = prob;
            } else {
              scores(i, j) = prob * cap_grad;
            }
          }
        }
        copy(s_r2s, s_r2s_thr.retile_S(rP), tPsP);
      }

      Tensor acc_dp = partition_fragment_C(mma_sdp, TileS{});
      clear(acc_dp);
      gemm_smem_smem(mma_sdp, acc_dp, tdPrdO, tdPrdO_view, in_stage(tdPsdO, stage, kdOElems),
                     sdp_a, tdPrV, tdPrV_view, tdPsV, sdp_b);
      Tensor dps = make_tensor(acc_dp.data(), accum_as_rows_cols(acc_dp.layout()));
      // dS = P (dP - D), dP taken through the forward's dropout; with a
      // soft-cap `scores` holds P (1 - tanh^2), the chain rule's last factor
      // (dbias kernels keep P there and apply the factor after storing dbias).
      Tensor rdBias = make_tensor<Element>(acc_dp.layout());
      Tensor dbias_vals = make_tensor(rdBias.data(), accum_as_rows_cols(rdBias.layout()));
      CUTE_UNROLL
      for (int i = 0; i < kRows; ++i) {
        CUTE_UNROLL
        for (int j = 0; j < size<1>(dps); ++j) {
          float dp = dps(i, j);
          if constexpr (Traits::kHasDropout) {
            bool kept = (kept_bits >> (i * size<1>(dps) + j)) & 1;
            dp = kept ? dp * p.dropout_rescale : 0.f;
          }
          const float ds = scores(i, j) * (dp - delta[i]);
          if constexpr (kKeepCapGrad) {
            dbias_vals(i, j) = Element(ds);
            dps(i, j) = ds * cap_grads[i * kCols + j];
          } else {
            dps(i, j) = ds;
          }
        }
      }
      Tensor rdS = convert_fragment<Element>(acc_dp);
      copy(s_r2s, s_r2s_thr.retile_S(rdS), tdSsdS);
      if constexpr (kDbias) {
        // Masked and out-of-range scores have P = 0, so dbias 0 there; the
        // store skips rows and keys past the sequence.
        if constexpr (kKeepCapGrad) {
          dbias_plane(h).store_tile(dbias_vals, cS_rows_cols, m_begin, n_begin, seq.seqlen_q,
                                    seq.seqlen_k);
        } else {
          Tensor rdS_rows_cols = make_tensor(rdS.data(), accum_as_rows_cols(rdS.layout()));
          dbias_plane(h).store_tile(rdS_rows_cols, cS_rows_cols, m_begin, n_begin, seq.seqlen_q,
                                    seq.seqlen_k);
        }
      }
      __syncthreads();  // P and dS visible to every warp

      gemm_smem_smem(mma_dv, acc_dv, tdVrPt, tdVrPt_view, tdVsPt, dv_a, tdVrdOt, tdVrdOt_view,
                     in_stage(tdVsdOt, stage, kdOElems), dv_b);
      gemm_smem_smem(mma_dk, acc_dk, tdKrdSt, tdKrdSt_view, tdKsdSt, dk_a, tdKrQt, tdKrQt_view,
                     in_stage(tdKsQt, stage, kQElems), dk_b);

      Tensor acc_dq = partition_fragment_C(mma_dq, TileQ{});
      clear(acc_dq);
      gemm_smem_smem(mma_dq, acc_dq, tdQrdS, tdQrdS_view, tdQsdS, dq_a, tdQrKt, tdQrKt_view,
                     tdQsKt, dq_b);
      float* dq_rows = dq_accum_heads + (int64_t(h) * workspace_head_rows + m_begin) * kD;
      const int rows_left = seq.seqlen_q - m_begin;
      // Accumulator elements come in pairs of neighbouring columns of one row.
      static_assert(decltype(size<0, 0>(acc_dq))::value == 2);
      if (p.deterministic) {
        // This CTA alone writes its slice, always with the same thread per
        // element: a plain read-modify-write in program order.
        CUTE_UNROLL
        for (int e = 0; e < size(acc_dq); e += 2) {
          const int row = get<0>(cdQ(e));
          if (row < rows_left) {
            auto* pair = reinterpret_cast<float2*>(dq_rows + row * kD + get<1>(cdQ(e)));
            float2 sum = *pair;
            sum.x += acc_dq(e);
            sum.y += acc_dq(e + 1);
            *pair = sum;
          }
        }
      } else {
        CUTE_UNROLL
        for (int e = 0; e < size(acc_dq); e += 2) {
          const int row = get<0>(cdQ(e));
          if (row < rows_left) {
            float* dst = dq_rows + row * kD + get<1>(cdQ(e));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            // One 8-byte reduction per column pair (sm_90's vector red.global):
            // half the atomic instructions, and each quad fills a 32-byte sector.
            atomicAdd(reinterpret_cast<float2*>(dst), make_float2(acc_dq(e), acc_dq(e + 1)));
#else
            atomicAdd(dst, acc_dq(e));
            atomicAdd(dst + 1, acc_dq(e + 1));
#endif
          }
        }
      }
    };

    for (int it = 0, h = 0, m_block = m_first; it < iters; ++it) {
      int next_h = h, next_m = m_block + 1;
      if (next_m == m_last) {
        next_m = m_first;
        ++next_h;
      }
      if (mask.tile_needs_mask(m_block * kBlockM, n_begin, kBlockM, kBlockN)) {
        process_tile(it, h, m_block, next_h, next_m, std::true_type{});
      } else {
        process_tile(it, h, m_block, next_h, next_m, std::false_type{});
      }
      h = next_h;
      m_block = next_m;
    }

    // ---- epilogue: dK (scaled) and dV through shared memory, over K and V
    CUTE_UNROLL
    for (int e = 0; e < size(acc_dk); ++e) acc_dk(e) *= p.scale;
    Tensor rdK = convert_fragment<Element>(acc_dk);
    Tensor rdV = convert_fragment<Element>(acc_dv);
    cp_async_wait<0>();  // with no query tile the K/V loads may still be in flight
    __syncthreads();     // every warp is done reading K and V
    auto dk_r2s = make_tiled_copy_C(typename Traits::SmemStoreAtom{}, mma_dk);
    auto dk_r2s_thr = dk_r2s.get_thread_slice(tid);
    copy(dk_r2s, dk_r2s_thr.retile_S(rdK), dk_r2s_thr.partition_D(sK));
    auto dv_r2s = make_tiled_copy_C(typename Traits::SmemStoreAtom{}, mma_dv);
    auto dv_r2s_thr = dv_r2s.get_thread_slice(tid);
    copy(dv_r2s, dv_r2s_thr.retile_S(rdV), dv_r2s_thr.partition_D(sV));
    __syncthreads();

    typename Traits::RowsQK::Store dk_store;
    typename Traits::RowsV::Store dv_store;
    auto dk_store_thr = dk_store.get_thread_slice(tid);
    auto dv_store_thr = dv_store.get_thread_slice(tid);
    Tensor gdK = make_tensor(make_gmem_ptr(dk_head + int64_t(n_begin) * p.dk_row_stride), TileK{},
                             make_stride(p.dk_row_stride, _1{}));
    Tensor gdV = make_tensor(make_gmem_ptr(dv_head + int64_t(n_begin) * p.dv_row_stride), TileV{},
                             make_stride(p.dv_row_stride, _1{}));
    Tensor tdKgdK = dk_store_thr.partition_D(gdK);
    Tensor tdVgdV = dv_store_thr.partition_D(gdV);
    store_rows(dk_store, dk_store_thr.partition_S(sK), tdKgdK, tKcK, seq.seqlen_k - n_begin);
    store_rows(dv_store, dv_store_thr.partition_S(sV), tdVgdV, tVcV, seq.seqlen_k - n_begin);
  }
}

// D = rowsum(dO * O) in fp32 for BlockM rows, their LSE in the log2 domain
// (what the sm90 main stage reads), and zeroes those rows of every dQ
// accumulator slice (the main stage only adds to them). The last block also
// fills the padding rows of the (sequence, head) up to its last whole
// 64-row block, which the sm90 main stage reads and adds to as part of
// whole tiles (in group mode its Q rows there are the next sequence's).
template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads)
    bwd_dot_do_o_kernel(__grid_constant__ const BwdParams p) {
  using Element = typename Traits::Element;
  constexpr int kVec = Traits::kVecElems;
  constexpr int kLanes = Traits::kLanesPerRow;
  constexpr bool kGroup = Traits::kIsGroupMode;
  static_assert(Traits::kBlockM % Traits::kRowsPerPass == 0,
                "every pass keeps whole warps inside the tile, so shuffles see all lanes");
  const int tid = threadIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const SequenceSlice seq = locate_sequence<kGroup>(p, batch);
  const int m_begin = blockIdx.x * Traits::kBlockM;
  if (m_begin >= seq.seqlen_q) return;
  const int rows = min(Traits::kBlockM, seq.seqlen_q - m_begin);

  const int64_t o_origin = kGroup ? seq.q_token0 * p.o_row_stride : batch * p.o_batch_stride;
  const int64_t do_origin = kGroup ? seq.q_token0 * p.do_row_stride : batch * p.do_batch_stride;
  auto const* o_rows = static_cast<Element const*>(p.o) + o_origin + head * p.o_head_stride;
  auto const* do_rows =
      static_cast<Element const*>(p.dout) + do_origin + head * p.do_head_stride;
  const int64_t head_row0 = bwd_workspace_row0(p, batch, head);
  const int64_t row0 = head_row0 + m_begin;
  float const* lse_rows = p.lse + (kGroup ? seq.q_token0 : batch * p.lse_batch_stride) +
                          head * p.lse_head_stride;

  const int lane = tid % kLanes;
  for (int r = tid / kLanes; r < Traits::kBlockM; r += Traits::kRowsPerPass) {
    const int row = m_begin + r;
    float sum = 0.f;
    if (r < rows) {
      auto const* o_row = o_rows + int64_t(row) * p.o_row_stride;
      auto const* do_row = do_rows + int64_t(row) * p.do_row_stride;
      CUTE_UNROLL
      for (int v = lane; v < Traits::kVecsPerRow; v += kLanes) {
        cutlass::Array<Element, kVec> o_vec, do_vec;
        *reinterpret_cast<uint4*>(&o_vec) = *reinterpret_cast<uint4 const*>(o_row + v * kVec);
        *reinterpret_cast<uint4*>(&do_vec) = *reinterpret_cast<uint4 const*>(do_row + v * kVec);
        CUTE_UNROLL
        for (int i = 0; i < kVec; ++i) sum += float(o_vec[i]) * float(do_vec[i]);
      }
    }
    sum = lane_group_sum<kLanes>(sum);
    if (lane == 0 && r < rows) {
      p.delta[row0 + r] = sum;
      p.lse_log2[row0 + r] = bwd_lse_log2(lse_rows[row]);
    }
  }

  const int64_t floats = int64_t(rows) * p.hdim_q;
  for (int s = 0; s < p.dq_splits; ++s) {
    auto* dst = reinterpret_cast<float4*>(p.dq_accum + s * p.dq_accum_split_stride +
                                          row0 * p.hdim_q);
    for (int64_t i = tid; i < floats / 4; i += Traits::kThreads) {
      dst[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }

  if (m_begin + Traits::kBlockM >= seq.seqlen_q) {
    // Padding rows: P = 0 (LSE +inf), D = 0, and a zero dQ accumulator.
    const int rows_read = bwd_workspace_rows_read(seq.seqlen_q);
    for (int r = seq.seqlen_q + tid; r < rows_read; r += Traits::kThreads) {
      p.delta[head_row0 + r] = 0.f;
      p.lse_log2[head_row0 + r] = INFINITY;
    }
    const int64_t pad_begin = (head_row0 + seq.seqlen_q) * p.hdim_q;
    const int64_t pad_end = (head_row0 + rows_read) * p.hdim_q;
    for (int s = 0; s < p.dq_splits; ++s) {
      float* slice = p.dq_accum + s * p.dq_accum_split_stride;
      for (int64_t i = pad_begin + tid; i < pad_end; i += Traits::kThreads) slice[i] = 0.f;
    }
  }
}

// dQ = scale * (sum of the dQ accumulator slices, in slice order), in the
// output dtype, 16-byte vectors per thread.
template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads)
    bwd_convert_dq_kernel(__grid_constant__ const BwdParams p) {
  using Element = typename Traits::Element;
  constexpr int kVec = Traits::kVecElems;
  constexpr int kD = Traits::kHeadDim;
  constexpr bool kGroup = Traits::kIsGroupMode;
  const int tid = threadIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const SequenceSlice seq = locate_sequence<kGroup>(p, batch);
  const int m_begin = blockIdx.x * Traits::kBlockM;
  if (m_begin >= seq.seqlen_q) return;
  const int rows = min(Traits::kBlockM, seq.seqlen_q - m_begin);

  const int64_t dq_origin = kGroup ? seq.q_token0 * p.dq_row_stride : batch * p.dq_batch_stride;
  auto* dq_rows = static_cast<Element*>(p.dq) + dq_origin + head * p.dq_head_stride;
  float const* acc_rows = p.dq_accum + (bwd_workspace_row0(p, batch, head) + m_begin) * kD;

  for (int i = tid; i < rows * Traits::kVecsPerRow; i += Traits::kThreads) {
    const int r = i / Traits::kVecsPerRow;
    const int c = (i % Traits::kVecsPerRow) * kVec;
    float sum[kVec];
    CUTE_UNROLL
    for (int e = 0; e < kVec; ++e) sum[e] = 0.f;
    for (int s = 0; s < p.dq_splits; ++s) {
      float const* src = acc_rows + s * p.dq_accum_split_stride + r * kD + c;
      CUTE_UNROLL
      for (int e = 0; e < kVec; e += 4) {
        float4 part = *reinterpret_cast<float4 const*>(src + e);
        sum[e] += part.x;
        sum[e + 1] += part.y;
        sum[e + 2] += part.z;
        sum[e + 3] += part.w;
      }
    }
    cutlass::Array<Element, kVec> out;
    CUTE_UNROLL
    for (int e = 0; e < kVec; ++e) out[e] = Element(sum[e] * p.scale);
    *reinterpret_cast<uint4*>(dq_rows + int64_t(m_begin + r) * p.dq_row_stride + c) =
        *reinterpret_cast<uint4 const*>(&out);
  }
}

}  // namespace ckfmha::kernel
