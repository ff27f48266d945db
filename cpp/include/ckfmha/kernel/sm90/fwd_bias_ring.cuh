// The elementwise bias of the Hopper forward through shared memory: a ring of
// bias tiles (one per key tile, all of the query tile's rows) that one thread
// of producer warp 1 fills with TMA copies, walking the same tiles as the
// consumers, so that a tile's bias lands a turn or more before its scores
// need it and no consumer register holds it in flight.
//
// A bias tile's bytes equal its scores', so at d64 the reads take about as
// long as the tile's products: held in registers a tile ahead, they spilled
// and ran at 0.28-0.37x the plain kernel (NOTES 90). One bulk copy per row
// (256 per tile) ran slower still, 0.14-0.18x: the copies' issue, not the
// bytes, set the pace (NOTES 97). A TMA tile is two requests.
//
// TMA needs 16-byte aligned rows: the bias pointer and its batch, head and
// row strides in multiples of 8 elements, and rows that are not broadcast.
// A bias broadcast over rows (a key-padding mask, [batch, 1 or heads, 1,
// keys]) takes row mode, a third kernel over the same storage: warp 1 reads
// each key tile's one row with plain loads (any alignment) into a ring of
// rows, and every consumer row adds it. Other biases read into registers as
// before (LogitTransform::load_bias); the launcher picks one of the three
// kernels per call (fwd_launch.cuh). One kernel with a run-time test for row
// mode spilled 2-4 times the bytes of the tile ring's kernel.
#pragma once

#include "ckfmha/kernel/common/features.h"
#include "ckfmha/kernel/common/persistent_tile_order.cuh"
#include "ckfmha/kernel/params/fwd_params.h"
#include "ckfmha/kernel/sm90/fwd_ring.cuh"  // RingSlot
#include "ckfmha/kernel/sm90/fwd_tile_work.cuh"

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/array.h>

#include <cstdint>

namespace ckfmha::kernel {

// The ring, placed after the kernel's storage struct (a whole number of KiB):
// 128-byte swizzled tiles as the TMA writes them, so that a warp's reads in
// the accumulator layout (8 rows, 4 key pairs of each) hit 32 distinct banks.
//
// Row mode keeps kBiasRowSlots rows of one key tile each at the start of
// `rows`, unswizzled: a warp's reads are 4 distinct
// words, each broadcast to the lanes of its key pair. More slots than tile
// stages because a row lands in a few hundred cycles and the consumers can
// then run that many tiles ahead of a slow load.
inline constexpr int kBiasRowSlots = 8;

template <class Element, class SmemLayout, int Stages>
struct FwdBiasRingStorage {
  alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayout>> rows;
  uint64_t full[Stages];   // the tile's TMA copy landed
  uint64_t empty[Stages];  // every consumer thread has added the tile
  uint64_t row_full[kBiasRowSlots];   // row mode: every lane of warp 1 stored its keys
  uint64_t row_empty[kBiasRowSlots];  // row mode: every consumer thread has added the row
};

// No ring: elementwise bias without room for one, or no elementwise bias.
struct NoBiasRing {};
struct NoBiasTma {};

// Whether a bias can come through the ring: TMA's 16-byte alignment of the
// base and of every stride, strides TMA can encode (none negative), and
// distinct rows (a row-broadcast bias takes row mode instead).
// Where an elementwise bias comes from, a kernel for each (fwd_kernel.cuh).
enum class BiasSource { kRegisters, kTileRing, kRowRing };

// Whether a bias is one row broadcast over the query rows (row mode; any
// alignment).
inline bool bias_rows_broadcast(void const* bias, int64_t const (&stride)[3]) {
  return bias != nullptr && stride[2] == 0;
}

template <class Element>
inline bool bias_fits_tma(void const* bias, int64_t const (&stride)[3]) {
  constexpr int64_t kVector = 16 / int64_t(sizeof(Element));
  bool fits = bias != nullptr && reinterpret_cast<uintptr_t>(bias) % 16 == 0 && stride[2] > 0;
  for (int64_t s : stride) fits = fits && s >= 0 && s % kVector == 0;
  return fits;
}

template <class Traits>
__device__ __forceinline__ void fwd_sm90_init_bias_ring(typename Traits::BiasRing& ring) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  for (int s = 0; s < Traits::kBiasStages; ++s) {
    Barrier::init(&ring.full[s], 1);
    Barrier::init(&ring.empty[s], Traits::kConsumerThreads);
  }
  for (int s = 0; s < kBiasRowSlots; ++s) {
    Barrier::init(&ring.row_full[s], 32);
    Barrier::init(&ring.row_empty[s], Traits::kConsumerThreads);
  }
  cutlass::arch::fence_barrier_init();
}

// Run by one thread: every key tile's bias of every query tile this CTA runs,
// in the consumers' order. Rows and keys past the bias come in as zeros (the
// mask overwrites those keys, and those rows are never stored).
template <class Traits, class Params>
__device__ __forceinline__ void fwd_sm90_load_bias_tiles(Params const& params,
                                                         typename Traits::BiasRing& ring) {
  using namespace cute;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using Work = Sm90TileWork<Traits>;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  FwdParams const& p = params.p;
  Tensor sB = make_tensor(make_smem_ptr(ring.rows.data()), typename Traits::SmemLayoutBiasRing{});
  // The descriptor's view (fwd_launch.cuh): the bias is [batch, heads,
  // seqlen_q, seqlen_k] (the longest sequences in group mode).
  Tensor mB = params.tma_bias.get_tma_tensor(make_shape(
      p.seqlen_q, p.seqlen_k, p.bias_head_stride != 0 ? p.nhead_q : 1,
      p.bias_batch_stride != 0 ? params.order.num_batches : 1));
  int count = 0;  // ring tiles so far: the stage and its barriers' phase
  for_each_tile(params.order, [&](QueryTile query_tile) {
    const Work work(p, query_tile);
    if (!work.has_rows()) return;
    const int head = p.bias_head_stride != 0 ? work.tile.head : 0;
    const int batch = p.bias_batch_stride != 0 ? work.tile.batch : 0;
    Tensor gB = local_tile(mB(_, _, head, batch), Shape<Int<kBlockM>, Int<kBlockN>>{},
                           make_coord(work.tile.m_block, _));
    auto [tBgB, tBsB] = tma_partition(params.tma_bias, Int<0>{}, Layout<_1>{},
                                      group_modes<0, 2>(sB), group_modes<0, 2>(gB));
    const int n_tiles = work.n_tiles();
    for (int i = 0; i < n_tiles; ++i) {
      const RingSlot slot = ring_slot_of<Traits::kBiasStages>(count + i);
      Barrier::wait(&ring.empty[slot.stage], slot.phase ^ 1);
      Barrier::arrive_and_expect_tx(&ring.full[slot.stage], Traits::kTmaBytesBias);
      copy(params.tma_bias.with(ring.full[slot.stage]), tBgB(_, work.n_last - 1 - i),
           tBsB(_, slot.stage));
    }
    count += n_tiles;
  });
}

// Row mode, run by every lane of warp 1: each key tile's row of the bias
// (keys past the sequence as zeros), in the consumers' order. A lane's keys
// are lane + 32 j, read as single elements so that any alignment and stride
// serves; the next tile's keys are read before waiting for a free slot, so
// that their latency overlaps the wait.
template <class Traits, class Params>
__device__ __forceinline__ void fwd_sm90_load_bias_rows(Params const& params,
                                                        typename Traits::BiasRing& ring,
                                                        int lane) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using Element = typename Traits::Element;
  using Work = Sm90TileWork<Traits>;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kPerLane = kBlockN / 32;
  static_assert(kBlockN % 32 == 0, "a key tile is whole warps of keys");
  FwdParams const& p = params.p;
  int count = 0;  // rows so far: the slot and its barriers' phase
  for_each_tile(params.order, [&](QueryTile query_tile) {
    const Work work(p, query_tile);
    if (!work.has_rows()) return;
    Element const* row = static_cast<Element const*>(p.bias) +
                         int64_t(work.tile.batch) * p.bias_batch_stride +
                         int64_t(work.tile.head) * p.bias_head_stride;
    const int seqlen_k = work.seq.seqlen_k;
    auto read = [&](int i, Element (&keys)[kPerLane]) {
      const int first = (work.n_last - 1 - i) * kBlockN + lane;
      CUTE_UNROLL
      for (int j = 0; j < kPerLane; ++j) {
        const int key = first + 32 * j;
        keys[j] = key < seqlen_k ? row[key] : Element(0.f);
      }
    };
    const int n_tiles = work.n_tiles();
    Element keys[kPerLane];
    if (n_tiles > 0) read(0, keys);
    for (int i = 0; i < n_tiles; ++i) {
      Element next[kPerLane];
      if (i + 1 < n_tiles) read(i + 1, next);
      const RingSlot slot = ring_slot_of<kBiasRowSlots>(count + i);
      Barrier::wait(&ring.row_empty[slot.stage], slot.phase ^ 1);
      Element* slot_row = ring.rows.data() + slot.stage * kBlockN;
      CUTE_UNROLL
      for (int j = 0; j < kPerLane; ++j) slot_row[lane + 32 * j] = keys[j];
      Barrier::arrive(&ring.row_full[slot.stage]);
      CUTE_UNROLL
      for (int j = 0; j < kPerLane; ++j) keys[j] = next[j];
    }
    count += n_tiles;
  });
}

// Two neighbouring keys' bias, one shared-memory word.
template <class Element>
__device__ __forceinline__ cutlass::Array<Element, 2> load_bias_pair(uint32_t address) {
  uint32_t word;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(word) : "r"(address));
  return reinterpret_cast<cutlass::Array<Element, 2> const&>(word);
}

// Scores (r, c) and (r, c + 1) with the pair added, in the units
// LogitTransform::bias_for_softmax gives.
template <class Transform, class Scores, class Element>
__device__ __forceinline__ void add_bias_pair(Transform const& transform, Scores& scores, int r,
                                              int c, cutlass::Array<Element, 2> const& pair) {
  scores(r, c) = transform.bias_for_softmax(scores(r, c), float(pair[0]));
  scores(r, c + 1) = transform.bias_for_softmax(scores(r, c + 1), float(pair[1]));
}

// The consumers' side: a tile's bias added to its scores from the ring, or
// in row mode (`RowMode`) the tile's one row added to every row's scores.
template <class Traits, bool RowMode>
struct FwdBiasRingReader {
  using Element = typename Traits::Element;
  typename Traits::BiasRing* ring;

  // The ring's tile `index` (one per key tile, in the K/V ring's order, so
  // the consumers' K/V tile count): scores(r, c) becomes the raw score plus
  // the bias at the tile's (row, key) coords(r, c), in the units
  // LogitTransform::bias_for_softmax gives; the stage is released at once.
  // Fragment columns 2k and 2k + 1 are neighbouring keys, one word; in row
  // mode each word is read once for all of a thread's rows.
  template <class Transform, class Scores, class Coords>
  __device__ __forceinline__ void add(Transform const& transform, Scores& scores,
                                      Coords const& coords, int index) const {
    using namespace cute;
    using Barrier = cutlass::arch::ClusterTransactionBarrier;
    const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(ring->rows.data()));
    if constexpr (RowMode) {
      const RingSlot slot = ring_slot_of<kBiasRowSlots>(index);
      Barrier::wait(&ring->row_full[slot.stage], slot.phase);
      const uint32_t row = base + uint32_t(slot.stage * Traits::kBlockN * int(sizeof(Element)));
      CUTE_UNROLL
      for (int c = 0; c < size<1>(scores); c += 2) {
        const uint32_t address = row + uint32_t(get<1>(coords(0, c)) * int(sizeof(Element)));
        const auto pair = load_bias_pair<Element>(address);
        CUTE_UNROLL
        for (int r = 0; r < size<0>(scores); ++r) add_bias_pair(transform, scores, r, c, pair);
      }
      Barrier::arrive(&ring->row_empty[slot.stage]);
    } else {
      using Layout = typename Traits::SmemLayoutBiasRing;
      // Byte offsets: the layout without its swizzle, then the swizzle,
      // which acts on byte addresses.
      constexpr auto kLinear = get_nonswizzle_portion(Layout{});
      constexpr auto kSwizzle = get_swizzle_portion(Layout{});
      const RingSlot slot = ring_slot_of<Traits::kBiasStages>(index);
      Barrier::wait(&ring->full[slot.stage], slot.phase);
      CUTE_UNROLL
      for (int r = 0; r < size<0>(scores); ++r) {
        const int row = get<0>(coords(r, 0));
        CUTE_UNROLL
        for (int c = 0; c < size<1>(scores); c += 2) {
          const int linear = kLinear(row, get<1>(coords(r, c)), slot.stage);
          const uint32_t address = base + uint32_t(kSwizzle(linear * int(sizeof(Element))));
          add_bias_pair(transform, scores, r, c, load_bias_pair<Element>(address));
        }
      }
      Barrier::arrive(&ring->empty[slot.stage]);
    }
  }
};

}  // namespace ckfmha::kernel
