// The Q/dO ring of the Hopper backward main stage, shared by both of its
// consumer layouts (keys split across the warpgroups at d <= 128, the head
// dims split at d256 and d192x128): the walk over a key tile's query tiles, the ring's
// barriers, and the producer: one thread loads K and V once, then each
// query tile's Q and dO (TMA) and its rows' LSE and D (bulk copies from the
// workspace, written by dot_do_o) into the ring's stages; a stage is
// refilled when every consumer thread has released it.
#pragma once

#include "ckfmha/kernel/common/attention_mask.cuh"
#include "ckfmha/kernel/common/sequence_slice.cuh"
#include "ckfmha/kernel/params/bwd_params.h"
#include "ckfmha/kernel/params/bwd_workspace_rows.cuh"

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/fast_math.h>

#include <cstdint>

namespace ckfmha::kernel {

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

// The walk of the key tile starting at `n_begin` of KV head `head_k` over
// the queries of `seqlen_q` rows, and its length in `iters`.
template <class Traits, class Mask>
__device__ __forceinline__ BwdSm90QueryWalk bwd_sm90_query_walk(BwdParams const& p,
                                                                Mask const& mask, int seqlen_q,
                                                                int n_begin, int head_k,
                                                                int* iters) {
  int m_first, m_last;
  mask.query_block_range(n_begin, Traits::kBlockN, Traits::kBlockM, seqlen_q, &m_first,
                         &m_last);
  *iters = (m_last - m_first) * p.head_group;
  return {head_k * p.head_group, m_first, m_last - m_first};
}

// By one thread, before the CTA's first __syncthreads: the producer arrives
// once per fill (with the bytes to expect), every consumer thread once per
// release, each after its own last read of the stage.
template <class Traits>
__device__ __forceinline__ void bwd_sm90_init_barriers(typename Traits::Barriers& bar) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  Barrier::init(&bar.kv_full, 1);
  for (int s = 0; s < Traits::kStages; ++s) {
    Barrier::init(&bar.q_full[s], 1);
    Barrier::init(&bar.q_empty[s], Traits::kConsumerThreads);
  }
  for (int w = 0; w < Traits::kConsumerWarpgroups; ++w) {
    Barrier::init(&bar.dq_full[w], 128);
    Barrier::init(&bar.dq_empty[w], 1);
  }
  cutlass::arch::fence_barrier_init();
}

// What both layouts' kernels take: the problem and the TMA copies of the
// inputs and of the dQ accumulator.
template <class Traits>
struct BwdSm90Params {
  BwdParams p;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaDo tma_do;
  typename Traits::TmaK tma_k;
  typename Traits::TmaV tma_v;
  typename Traits::TmaDq tma_dq;
  // The rows and the batch extent the Q/dO and K/V descriptors were encoded
  // with: seqlen_q, seqlen_k and batch, or in group mode the packed token
  // counts as one view.
  int tma_rows_q;
  int tma_rows_k;
  int tma_views;
  // Causal launch order (bwd_sm90_key_tile; bwd_sm90_causal_chunks): a
  // one-dimensional grid over full_chunks chunks of chunk_pairs (KV head,
  // batch) pairs, then one of last_pairs; chunk_pairs 0 for grid order. The
  // divisors: a full chunk's CTAs, its pairs, the last chunk's pairs, and the
  // KV heads.
  int chunk_pairs;
  int full_chunks;
  int full_chunk_ctas_total;
  cutlass::FastDivmod full_chunk_ctas;
  cutlass::FastDivmod full_chunk_width;
  cutlass::FastDivmod last_chunk_width;
  cutlass::FastDivmod nhead_k;
};

// The key tile a CTA owns, if any. In grid order the grid is (key tiles, KV
// heads, batch); it launches in order of the linear block index, each SM
// taking the next CTA when its own ends. Under a causal mask a key tile's
// work falls with its index (later keys see fewer queries), and in grid
// order the last heads' longest tiles started last and ran on with most
// SMs idle (93% busy at d128 s2048, traced). Causal grids therefore launch
// their (KV head, batch) pairs in chunks, and within a chunk key tile by key
// tile over its pairs, the longest first (bwd_sm90_causal_chunks sizes
// them): a one-dimensional grid, read back with multiply-shift divisions
// (three integer divisions here delayed every CTA's start by 0.2 us,
// traced). Chunks of about one wave of CTAs keep the Q, dO and dQ rows in
// use at a time as few as grid order does; against grid order they gained
// 1.5-2.5% at d128 and d256, s2048 (three interleaved rounds, three runs),
// and lost at d64 (3.5% at s512, 0.5% at s2048) and on grids of fewer than
// kBwdSm90MinWaveChunkKeyTiles key tiles (d256 s512, 1.5%), which take one
// pair a chunk.
template <class Traits>
constexpr bool kBwdSm90ChunkedCausalOrder = Traits::kMask == MaskMode::kCausal;
constexpr int kBwdSm90MinWaveChunkKeyTiles = 16;

// A CTA's key tile and the sequence it lies in. In group mode a CTA owns
// nothing past its sequence's keys: the grid is sized for the longest
// sequence, and a sequence whose cu_seqlens range is rejected has none.
template <class Traits>
struct BwdSm90KeyTile {
  int n_block;
  int head_k;
  int batch;
  SequenceSlice seq;
  bool owned;

  __device__ __forceinline__ int n_begin() const { return n_block * Traits::kBlockN; }
  // Positions are the sequence's own; bottom-right alignment follows its lengths.
  __device__ __forceinline__ AttentionMask<Traits::kMask> mask(BwdParams const& p) const {
    return AttentionMask<Traits::kMask>::for_sequence(p, seq.seqlen_q, seq.seqlen_k);
  }
};

template <class Traits>
__device__ __forceinline__ BwdSm90KeyTile<Traits> bwd_sm90_key_tile(
    BwdSm90Params<Traits> const& params) {
  int n_block = int(blockIdx.x), head_k = int(blockIdx.y), batch = int(blockIdx.z);
  if constexpr (kBwdSm90ChunkedCausalOrder<Traits>) {
    if (params.chunk_pairs > 0) {
      const int cta = int(blockIdx.x);
      int chunk, in_chunk, column;
      if (cta < params.full_chunk_ctas_total) {
        params.full_chunk_ctas(chunk, in_chunk, cta);
        params.full_chunk_width(n_block, column, in_chunk);
      } else {
        chunk = params.full_chunks;
        params.last_chunk_width(n_block, column, cta - params.full_chunk_ctas_total);
      }
      params.nhead_k(batch, head_k, chunk * params.chunk_pairs + column);
    }
  }
  const SequenceSlice seq = locate_sequence<Traits::kIsGroupMode>(params.p, batch);
  return {n_block, head_k, batch, seq, n_block * Traits::kBlockN < seq.seqlen_k};
}

// Run by one thread.
template <class Traits>
__device__ __forceinline__ void bwd_sm90_load_tiles(BwdSm90Params<Traits> const& params,
                                                    typename Traits::SharedStorage* storage,
                                                    BwdSm90QueryWalk const& walk, int iters,
                                                    BwdSm90KeyTile<Traits> const& tile) {
  using namespace cute;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using M = typename Traits::M;
  using N = typename Traits::N;
  using D = typename Traits::D;
  using DV = typename Traits::DV;
  constexpr int kD = Traits::kHeadDim;
  constexpr int kDV = Traits::kHeadDimV;
  constexpr int kStages = Traits::kStages;
  BwdParams const& p = params.p;
  auto& bar = storage->bar;
  Tensor sK = make_tensor(make_smem_ptr(storage->k.data()), typename Traits::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(storage->v.data()), typename Traits::SmemLayoutV{});
  Tensor sQ = make_tensor(make_smem_ptr(storage->q.data()), typename Traits::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(storage->dout.data()), typename Traits::SmemLayoutdO{});

  const int nhead_k = p.nhead_q / p.head_group;
  const int batch = tile.batch;
  // Coordinate tensors over the shapes the descriptors were encoded with.
  const int rows_q = params.tma_rows_q, rows_k = params.tma_rows_k, views = params.tma_views;
  Tensor mQ = params.tma_q.get_tma_tensor(make_shape(rows_q, kD, p.nhead_q, views));
  Tensor mdO = params.tma_do.get_tma_tensor(make_shape(rows_q, kDV, p.nhead_q, views));
  Tensor mK = params.tma_k.get_tma_tensor(make_shape(rows_k, kD, nhead_k, views));
  Tensor mV = params.tma_v.get_tma_tensor(make_shape(rows_k, kDV, nhead_k, views));
  // Group mode: one view whose rows are the packed tokens, the sequence's
  // starting at its first token. Rows past the sequence then hold the next
  // sequence's tokens rather than zeros: its keys are masked like keys past
  // seqlen_k, and its query rows meet the workspace's padding rows (LSE
  // +inf, so P = 0 and dS = 0: dot_do_o writes them in both modes).
  const int view = Traits::kIsGroupMode ? 0 : batch;
  auto sequence_rows = [&](auto const& rows, int64_t token0) __attribute__((always_inline)) {
    return domain_offset(make_coord(int(token0), 0), rows);
  };
  {
    Tensor gK = local_tile(sequence_rows(mK(_, _, tile.head_k, view), tile.seq.k_token0),
                           Shape<N, D>{}, make_coord(_, 0));
    Tensor gV = local_tile(sequence_rows(mV(_, _, tile.head_k, view), tile.seq.k_token0),
                           Shape<N, DV>{}, make_coord(_, 0));
    auto [tKgK, tKsK] = tma_partition(params.tma_k, Int<0>{}, Layout<_1>{},
                                      group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto [tVgV, tVsV] = tma_partition(params.tma_v, Int<0>{}, Layout<_1>{},
                                      group_modes<0, 2>(sV), group_modes<0, 2>(gV));
    // Rows past the packed rows fall outside the tensor: TMA fills them with
    // zeros and still counts the whole box's bytes.
    Barrier::arrive_and_expect_tx(&bar.kv_full, Traits::kTmaBytesKV);
    copy(params.tma_k.with(bar.kv_full), tKgK(_, tile.n_block), tKsK);
    copy(params.tma_v.with(bar.kv_full), tVgV(_, tile.n_block), tVsV);
  }
  for (int it = 0; it < iters; ++it) {
    const int stage = it % kStages;
    // The first pass finds every stage free: waiting on the parity before
    // a barrier's initial phase returns at once.
    Barrier::wait(&bar.q_empty[stage], ((it / kStages) & 1) ^ 1);
    const int head = walk.head(it);
    Tensor gQ = local_tile(sequence_rows(mQ(_, _, head, view), tile.seq.q_token0),
                           Shape<M, D>{}, make_coord(_, 0));
    Tensor gdO = local_tile(sequence_rows(mdO(_, _, head, view), tile.seq.q_token0),
                            Shape<M, DV>{}, make_coord(_, 0));
    auto [tQgQ, tQsQ] = tma_partition(params.tma_q, Int<0>{}, Layout<_1>{},
                                      group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    auto [tdOgdO, tdOsdO] = tma_partition(params.tma_do, Int<0>{}, Layout<_1>{},
                                          group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
    Barrier::arrive_and_expect_tx(&bar.q_full[stage],
                                  Traits::kTmaBytesQdO + 2 * Traits::kBulkBytesRows);
    copy(params.tma_q.with(bar.q_full[stage]), tQgQ(_, walk.m_block(it)), tQsQ(_, stage));
    copy(params.tma_do.with(bar.q_full[stage]), tdOgdO(_, walk.m_block(it)), tdOsdO(_, stage));
    // The workspace pads every (sequence, head) to whole 64-row blocks, so
    // these rows are in bounds and 16-byte aligned.
    const int64_t row0 = bwd_workspace_row0(p, batch, head) + walk.m_block(it) * Traits::kBlockM;
    SM90_BULK_COPY_G2S::copy(p.lse_log2 + row0, &bar.q_full[stage], storage->lse_log2[stage],
                             Traits::kBulkBytesRows);
    SM90_BULK_COPY_G2S::copy(p.delta + row0, &bar.q_full[stage], storage->delta[stage],
                             Traits::kBulkBytesRows);
  }
}

}  // namespace ckfmha::kernel
