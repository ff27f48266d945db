// The elementwise bias of the Hopper forward through shared memory: a ring of
// bias tiles (one per key tile, all of the query tile's rows) that warp 1 of
// the producer warpgroup fills with one bulk copy per row, walking the same
// tiles as the consumers, so that a tile's bias lands a turn or more before
// its scores need it and no consumer register holds it in flight.
//
// A bias tile's bytes equal its scores', so at d64 the reads take about as
// long as the tile's products: held in registers a tile ahead, they spilled
// and ran at 0.28-0.37x the plain kernel (NOTES 90).
//
// Bulk copies need 16-byte aligned rows whose byte count is a multiple of 16:
// the bias pointer, its batch, head and row strides and the sequence's key
// count in multiples of 8 elements. Sequences that miss it read their bias
// into registers as before (LogitTransform::load_bias), decided per query
// tile alike by the producer and the consumers.
#pragma once

#include "ckfmha/kernel/common/features.h"
#include "ckfmha/kernel/common/logit_transform.cuh"
#include "ckfmha/kernel/params/fwd_params.h"
#include "ckfmha/kernel/sm90/fwd_ring.cuh"
#include "ckfmha/kernel/sm90/fwd_tile_work.cuh"

#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/array.h>

#include <cstdint>

namespace ckfmha::kernel {

// The ring, placed after the kernel's storage struct (a whole number of KiB).
// A row's 16-byte chunks are rotated by its index mod 8 (chunk k of row r
// lies at chunk (k + r % 8) mod the row's chunks): a warp reads 8 rows and
// 4 key pairs of each at once in the accumulator layout, and the rotation
// puts those on 32 distinct banks, where padding each row by 16 bytes would
// cost the 2 KiB that d128 lacks beside staged O.
template <class Element, int BlockM, int BlockN, int Stages>
struct FwdBiasRingStorage {
  static constexpr int kRowBytes = BlockN * int(sizeof(Element));
  static_assert(kRowBytes % 128 == 0 && (kRowBytes & (kRowBytes - 1)) == 0,
                "rows of whole 128-byte lines, a power of two long");
  alignas(128) Element rows[Stages][BlockM * BlockN];
  uint64_t full[Stages];   // the producer warp's copies of a tile landed
  uint64_t empty[Stages];  // every consumer thread has added the tile
  // Where byte `offset` of row `row` lies within the row.
  __device__ __forceinline__ static uint32_t rotated(int row, uint32_t offset) {
    return (offset + uint32_t(row % 8) * 16u) & uint32_t(kRowBytes - 1);
  }
};

// No ring: elementwise bias without room for one, or no elementwise bias.
struct NoBiasRing {};

// Whether this sequence's bias rows can be bulk-copied (see above).
template <class Element>
__device__ __forceinline__ bool bias_rows_bulk_copyable(FwdParams const& p, int seqlen_k) {
  constexpr int kVector = 16 / int(sizeof(Element));
  return reinterpret_cast<uintptr_t>(p.bias) % 16 == 0 && p.bias_batch_stride % kVector == 0 &&
         p.bias_head_stride % kVector == 0 && p.bias_row_stride % kVector == 0 &&
         seqlen_k % kVector == 0;
}

template <class Traits>
__device__ __forceinline__ void fwd_sm90_init_bias_ring(typename Traits::BiasRing& ring) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  for (int s = 0; s < Traits::kBiasStages; ++s) {
    Barrier::init(&ring.full[s], 1);
    Barrier::init(&ring.empty[s], Traits::kConsumerThreads);
  }
  cutlass::arch::fence_barrier_init();
}

// Run by all 32 lanes of one producer warp: every key tile's bias of every
// query tile this CTA runs, in the consumers' order, lane l copying rows
// l, l + 32, ... (a rotated row takes two copies: the chunks before and
// after the row's end). Rows past the sequence copy its last row (never
// stored); keys past it are not copied (the mask overwrites their scores).
template <class Traits>
__device__ __forceinline__ void fwd_sm90_load_bias_tiles(FwdSm90Params<Traits> const& params,
                                                         typename Traits::BiasRing& ring,
                                                         int lane) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using Element = typename Traits::Element;
  using Work = Sm90TileWork<Traits>;
  using Transform = LogitTransform<Element, Traits::kBias, Traits::kHasSoftcap>;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  using Ring = typename Traits::BiasRing;
  constexpr int kRowBytes = Ring::kRowBytes;
  FwdParams const& p = params.p;
  int count = 0;  // ring tiles so far: the stage and its barriers' phase
  for_each_tile(params.order, [&](QueryTile query_tile) {
    const Work work(p, query_tile);
    if (!work.has_rows() || !bias_rows_bulk_copyable<Element>(p, work.seq.seqlen_k)) return;
    const int n_tiles = work.n_tiles();
    const Transform transform = Transform::for_sequence(p, work.seq.seqlen_q, work.seq.seqlen_k,
                                                        work.tile.batch, work.tile.head);
    for (int i = 0; i < n_tiles; ++i) {
      const RingSlot slot = ring_slot_of<Traits::kBiasStages>(count + i);
      const int n_begin = (work.n_last - 1 - i) * kBlockN;
      const int row_bytes = min(kBlockN, work.seq.seqlen_k - n_begin) * int(sizeof(Element));
      if (lane == 0) {
        Barrier::wait(&ring.empty[slot.stage], slot.phase ^ 1);
        Barrier::arrive_and_expect_tx(&ring.full[slot.stage], uint32_t(row_bytes * kBlockM));
      }
      __syncwarp();
      for (int r = lane; r < kBlockM; r += 32) {
        const int row = min(work.m_begin + r, work.seq.seqlen_q - 1);
        char const* src = reinterpret_cast<char const*>(
            transform.bias_rows + int64_t(row) * transform.bias_row_stride + n_begin);
        char* dst = reinterpret_cast<char*>(&ring.rows[slot.stage][r * kBlockN]);
        const int shift = int(Ring::rotated(r, 0));
        const int head_bytes = min(row_bytes, kRowBytes - shift);
        cute::SM90_BULK_COPY_G2S::copy(src, &ring.full[slot.stage], dst + shift, head_bytes);
        if (row_bytes > head_bytes) {
          cute::SM90_BULK_COPY_G2S::copy(src + head_bytes, &ring.full[slot.stage], dst,
                                         row_bytes - head_bytes);
        }
      }
    }
    count += n_tiles;
  });
}

// The consumers' side: a tile's bias added to its scores from the ring.
template <class Traits>
struct FwdBiasRingReader {
  using Element = typename Traits::Element;
  typename Traits::BiasRing* ring;
  int count = 0;  // ring tiles so far, as the producer warp counts them

  // Key tile `i` of the query tile whose first ring tile is `count`:
  // scores(r, c) becomes the log2-domain logit of the raw score plus the
  // bias at the tile's (row, key) coords(r, c); the stage is released at
  // once. Fragment columns 2k and 2k + 1 are neighbouring keys, one word.
  template <class Transform, class Scores, class Coords>
  __device__ __forceinline__ void add(Transform const& transform, Scores& scores,
                                      Coords const& coords, int i) const {
    using namespace cute;
    using Barrier = cutlass::arch::ClusterTransactionBarrier;
    using Ring = typename Traits::BiasRing;
    constexpr int kRowBytes = Ring::kRowBytes;
    const RingSlot slot = ring_slot_of<Traits::kBiasStages>(count + i);
    Barrier::wait(&ring->full[slot.stage], slot.phase);
    const uint32_t stage_base =
        static_cast<uint32_t>(__cvta_generic_to_shared(ring->rows[slot.stage]));
    CUTE_UNROLL
    for (int r = 0; r < size<0>(scores); ++r) {
      const int row = get<0>(coords(r, 0));
      const uint32_t row_base = stage_base + uint32_t(row * kRowBytes);
      CUTE_UNROLL
      for (int c = 0; c < size<1>(scores); c += 2) {
        const uint32_t offset = uint32_t(get<1>(coords(r, c)) * int(sizeof(Element)));
        uint32_t word;
        asm volatile("ld.shared.u32 %0, [%1];"
                     : "=r"(word)
                     : "r"(row_base + Ring::rotated(row, offset)));
        const auto pair = reinterpret_cast<cutlass::Array<Element, 2> const&>(word);
        float cap_grad;
        scores(r, c) = transform.biased_logit_log2(scores(r, c), float(pair[0]), cap_grad);
        scores(r, c + 1) = transform.biased_logit_log2(scores(r, c + 1), float(pair[1]), cap_grad);
      }
    }
    Barrier::arrive(&ring->empty[slot.stage]);
  }
};

}  // namespace ckfmha::kernel
