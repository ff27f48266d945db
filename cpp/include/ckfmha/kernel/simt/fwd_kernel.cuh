// Forward attention in fp32 on CUDA cores (plain FFMA from shared memory),
// one CTA per (query tile, head, batch or sequence). Tensor cores would mean
// tf32 and its 10-bit mantissa; this path keeps full fp32 products.
//
// Per key tile, with K and V each single-buffered in shared memory:
//   wait K -> start loading V -> S = Q K^T -> logit transforms, mask
//   -> online softmax -> dropout -> P to shared memory -> wait V
//   -> start loading the next K -> O += P V
// P goes through shared memory because the P*V product of a thread needs the
// probabilities of keys other lanes own. Key tiles are visited from the last
// to the first, as on the sm80 path, so the masked tiles come first.
#pragma once

#include "ckfmha/kernel/common/attention_mask.cuh"
#include "ckfmha/kernel/common/logit_transform.cuh"
#include "ckfmha/kernel/common/online_softmax.cuh"
#include "ckfmha/kernel/common/philox_dropout.cuh"
#include "ckfmha/kernel/common/sequence_slice.cuh"
#include "ckfmha/kernel/common/tile_copy.cuh"
#include "ckfmha/kernel/params/fwd_params.h"

#include <cute/tensor.hpp>

namespace ckfmha::kernel {

__device__ __forceinline__ float4 load_float4(float const* ptr) {
  return *reinterpret_cast<float4 const*>(ptr);
}

// acc(i, j) += Q row (i) . K row (j) over the whole head dim. q_rows points
// at the thread's first row (later rows are row_step floats apart), k_rows at
// its first key (later keys key_step floats apart).
template <int HeadDim, int RowStep, int KeyStep, class Acc>
__device__ __forceinline__ void scores_from_smem(Acc& acc, float const* q_rows,
                                                 float const* k_rows) {
  using namespace cute;
  constexpr int kRows = decltype(size<0>(acc))::value;
  constexpr int kKeys = decltype(size<1>(acc))::value;
#pragma unroll 2
  for (int k = 0; k < HeadDim; k += 4) {
    float4 q[kRows];
    float4 kv[kKeys];
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) q[i] = load_float4(q_rows + i * RowStep + k);
    CUTE_UNROLL
    for (int j = 0; j < kKeys; ++j) kv[j] = load_float4(k_rows + j * KeyStep + k);
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      CUTE_UNROLL
      for (int j = 0; j < kKeys; ++j) {
        float s = acc(i, j);
        s = fmaf(q[i].x, kv[j].x, s);
        s = fmaf(q[i].y, kv[j].y, s);
        s = fmaf(q[i].z, kv[j].z, s);
        s = fmaf(q[i].w, kv[j].w, s);
        acc(i, j) = s;
      }
    }
  }
}

// out(i, 4 c + e) += sum over keys n of P(row i, n) * V(n, 4 tx + 32 c + e).
// p_rows: the thread's first P row (later rows row_step floats apart);
// v_cols: V row 0 at the thread's first output column.
template <int BlockN, int RowStep, int PitchV, class Out>
__device__ __forceinline__ void accumulate_pv(Out& out, float const* p_rows,
                                              float const* v_cols) {
  using namespace cute;
  constexpr int kRows = decltype(size<0>(out))::value;
  constexpr int kVecs = decltype(size<1>(out))::value / 4;
#pragma unroll 2
  for (int n = 0; n < BlockN; n += 4) {
    float4 p4[kRows];
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) p4[i] = load_float4(p_rows + i * RowStep + n);
    CUTE_UNROLL
    for (int t = 0; t < 4; ++t) {
      CUTE_UNROLL
      for (int c = 0; c < kVecs; ++c) {
        float4 v = load_float4(v_cols + (n + t) * PitchV + 32 * c);
        CUTE_UNROLL
        for (int i = 0; i < kRows; ++i) {
          float p = t == 0 ? p4[i].x : t == 1 ? p4[i].y : t == 2 ? p4[i].z : p4[i].w;
          out(i, 4 * c + 0) = fmaf(p, v.x, out(i, 4 * c + 0));
          out(i, 4 * c + 1) = fmaf(p, v.y, out(i, 4 * c + 1));
          out(i, 4 * c + 2) = fmaf(p, v.z, out(i, 4 * c + 2));
          out(i, 4 * c + 3) = fmaf(p, v.w, out(i, 4 * c + 3));
        }
      }
    }
  }
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    fwd_simt_kernel(__grid_constant__ const FwdParams p) {
  using namespace cute;
  using Element = typename Traits::Element;
  using TileQ = Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDimQK>>;
  using TileK = Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDimQK>>;
  using TileV = Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDimV>>;
  using TileS = Shape<Int<Traits::kBlockM>, Int<Traits::kBlockN>>;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kRows = Traits::kRowsPerThread;
  constexpr int kKeys = Traits::kKeysPerThread;
  constexpr int kRowGroups = Traits::kRowGroups;
  constexpr int kLanes = Traits::kLanes;
  constexpr bool kGroup = Traits::kIsGroupMode;
  using Transform = LogitTransform<Element, Traits::kBias, Traits::kHasSoftcap>;

  const int tid = threadIdx.x;
  const int ty = tid / kLanes;
  const int tx = tid % kLanes;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  // Longest causal query tiles first, as on the sm80 path.
  const int m_block = Traits::kMask == MaskMode::kCausal ? int(gridDim.x) - 1 - int(blockIdx.x)
                                                          : int(blockIdx.x);
  const int m_begin = m_block * kBlockM;
  const SequenceSlice seq = locate_sequence<kGroup>(p, batch);
  if (seq.skip || m_begin >= seq.seqlen_q) return;

  const int head_k = head / p.head_group;
  const int64_t q_origin = kGroup ? seq.q_token0 * p.q_row_stride : batch * p.q_batch_stride;
  const int64_t o_origin = kGroup ? seq.q_token0 * p.o_row_stride : batch * p.o_batch_stride;
  const int64_t k_origin = kGroup ? seq.k_token0 * p.k_row_stride : batch * p.k_batch_stride;
  const int64_t v_origin = kGroup ? seq.k_token0 * p.v_row_stride : batch * p.v_batch_stride;

  auto const* q_base = static_cast<Element const*>(p.q) + q_origin + head * p.q_head_stride +
                       m_begin * p.q_row_stride;
  auto const* k_base = static_cast<Element const*>(p.k) + k_origin + head_k * p.k_head_stride;
  auto const* v_base = static_cast<Element const*>(p.v) + v_origin + head_k * p.v_head_stride;
  auto* o_base = static_cast<Element*>(p.o) + o_origin + head * p.o_head_stride +
                 m_begin * p.o_row_stride;

  Tensor gQ = make_tensor(make_gmem_ptr(q_base), TileQ{}, make_stride(p.q_row_stride, _1{}));
  auto key_tile = [](Element const* base, int64_t row_stride, int n_block, auto tile_shape) {
    return make_tensor(make_gmem_ptr(base + int64_t(n_block) * kBlockN * row_stride), tile_shape,
                       make_stride(row_stride, _1{}));
  };

  extern __shared__ __align__(128) char smem_bytes[];
  auto* smem_q = reinterpret_cast<float*>(smem_bytes);
  float* smem_k = smem_q + Traits::kSmemQFloats;
  float* smem_v = smem_k + Traits::kSmemKFloats;
  float* smem_p = smem_v + Traits::kSmemVFloats;
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(smem_v), typename Traits::SmemLayoutV{});

  // ---- global -> shared
  typename Traits::Load load;
  auto load_thr = load.get_thread_slice(tid);
  Tensor tQsQ = load_thr.partition_D(sQ);
  Tensor tKsK = load_thr.partition_D(sK);
  Tensor tVsV = load_thr.partition_D(sV);
  Tensor tQcQ = load_thr.partition_S(make_identity_tensor(TileQ{}));
  Tensor tKcK = load_thr.partition_S(make_identity_tensor(TileK{}));
  Tensor tVcV = load_thr.partition_S(make_identity_tensor(TileV{}));
  auto load_k = [&](int n_block) {
    load_rows(load, load_thr.partition_S(key_tile(k_base, p.k_row_stride, n_block, TileK{})),
              tKsK, tKcK, seq.seqlen_k - n_block * kBlockN);
  };
  auto load_v = [&](int n_block) {
    load_rows(load, load_thr.partition_S(key_tile(v_base, p.v_row_stride, n_block, TileV{})),
              tVsV, tVcV, seq.seqlen_k - n_block * kBlockN);
  };

  // Element (i, j) of the thread's score fragment is tile entry
  // (ty + 16 i, tx + 8 j).
  Tensor cS = local_partition(make_identity_tensor(TileS{}), typename Traits::ThreadGrid{}, tid);
  Tensor acc_o = make_tensor<float>(Shape<Int<kRows>, Int<Traits::kOutColsPerThread>>{});
  float const* q_rows = smem_q + ty * Traits::kPitchQ;
  float const* k_rows = smem_k + tx * Traits::kPitchK;
  float* p_rows = smem_p + ty * Traits::kPitchP;
  float const* v_cols = smem_v + 4 * tx;

  // ---- per-sequence features
  const auto mask = AttentionMask<Traits::kMask>::for_sequence(p, seq.seqlen_q, seq.seqlen_k);
  const Transform transform =
      Transform::for_sequence(p, seq.seqlen_q, seq.seqlen_k, batch, head);
  PhiloxDropout dropout{};
  if constexpr (Traits::kHasDropout) {
    dropout = PhiloxDropout::for_sequence(p, seq.seqlen_q, seq.seqlen_k, batch, head);
  }
  const float exp2_scale = Transform::kActive ? 1.f : p.scale_log2;

  int n_first, n_last;
  mask.key_block_range(m_begin, kBlockM, kBlockN, &n_first, &n_last);

  load_rows(load, load_thr.partition_S(gQ), tQsQ, tQcQ, seq.seqlen_q - m_begin);
  if (n_last > n_first) load_k(n_last - 1);
  cp_async_fence();

  clear(acc_o);
  OnlineSoftmax<kRows, kLanes> softmax;
  softmax.reset();

  for (int n_block = n_last - 1; n_block >= n_first; --n_block) {
    const int n_begin = n_block * kBlockN;
    Tensor acc_s = make_tensor<float>(Shape<Int<kRows>, Int<kKeys>>{});
    clear(acc_s);

    cp_async_wait<0>();
    __syncthreads();  // K tile landed; every thread is done with the previous P and V
    load_v(n_block);
    cp_async_fence();

    scores_from_smem<Traits::kHeadDimQK, kRowGroups * Traits::kPitchQ, kLanes * Traits::kPitchK>(
        acc_s, q_rows, k_rows);
    if constexpr (Transform::kActive) transform.apply(acc_s, cS, m_begin, n_begin);
    if (mask.tile_needs_mask(m_begin, n_begin, kBlockM, kBlockN)) {
      mask.apply(acc_s, cS, m_begin, n_begin);
    }
    if (n_block == n_last - 1) {
      softmax.template update<true>(acc_s, acc_o, exp2_scale);
    } else {
      softmax.template update<false>(acc_s, acc_o, exp2_scale);
    }
    // Keys tx + 16 m and tx + 16 m + 8 (fragment columns 2m, 2m+1) share a
    // Philox block.
    if constexpr (Traits::kHasDropout) dropout.template apply<2>(acc_s, cS, m_begin, n_begin);
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      CUTE_UNROLL
      for (int j = 0; j < kKeys; ++j) {
        p_rows[i * kRowGroups * Traits::kPitchP + j * kLanes + tx] = acc_s(i, j);
      }
    }

    cp_async_wait<0>();
    __syncthreads();  // V landed and P complete; nobody reads this K any more
    if (n_block > n_first) {
      load_k(n_block - 1);
      cp_async_fence();
    }
    accumulate_pv<kBlockN, kRowGroups * Traits::kPitchP, Traits::kPitchV>(acc_o, p_rows, v_cols);
  }

  // ---- epilogue
  float lse[kRows];
  constexpr float kLog2e = 1.4426950408889634f;
  const float sink_log2 = Traits::kHasSink ? p.sink[head] * kLog2e : 0.f;
  const float rescale = Traits::kHasDropout ? p.dropout_rescale : 1.f;
  softmax.template finalize<Traits::kHasSink>(acc_o, exp2_scale, sink_log2, rescale, lse);

  if constexpr (Traits::kHasLse) {
    if (p.lse != nullptr && tx == 0) {  // lane 0 of each row's 8 lanes writes it
      float* lse_out = p.lse + (kGroup ? seq.q_token0 : batch * p.lse_batch_stride) +
                       head * p.lse_head_stride;
      CUTE_UNROLL
      for (int i = 0; i < kRows; ++i) {
        int row = m_begin + ty + kRowGroups * i;
        if (row < seq.seqlen_q) lse_out[row] = lse[i];
      }
    }
  }

  // Eight lanes store one row's 128 contiguous bytes per vector: coalesced
  // without staging through shared memory.
  CUTE_UNROLL
  for (int i = 0; i < kRows; ++i) {
    int row = ty + kRowGroups * i;
    if (m_begin + row < seq.seqlen_q) {
      float* o_row = o_base + int64_t(row) * p.o_row_stride + 4 * tx;
      CUTE_UNROLL
      for (int c = 0; c < Traits::kOutVecsPerRow; ++c) {
        *reinterpret_cast<float4*>(o_row + 32 * c) =
            make_float4(acc_o(i, 4 * c), acc_o(i, 4 * c + 1), acc_o(i, 4 * c + 2),
                        acc_o(i, 4 * c + 3));
      }
    }
  }
  cp_async_wait<0>();  // with no visible key the Q load may still be in flight
}

}  // namespace ckfmha::kernel
