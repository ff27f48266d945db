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
#include "ckfmha/kernel/common/fragment_layout.cuh"
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
// `rows`, as fp32 in the consumers' fragment order (BiasRowLayout). More
// slots than tile stages because a row lands in a few hundred cycles and
// the consumers can then run that many tiles ahead of a slow load.
inline constexpr int kBiasRowSlots = 8;

// A row slot's layout. A consumer thread's scores hold, for each 8-key chunk
// j of the tile, keys 8 j + 2 q and 8 j + 2 q + 1 with q = lane % 4 (the
// wgmma accumulator's columns, gmma_accum_as_rows_cols): its fragment column
// c is key 8 (c / 2) + 2 q + c % 2. The slot stores quad q's keys in
// fragment order, so that a thread's columns c to c + 3 are one 16-byte
// load, and pads each quad by four floats so that the four quads' loads fall
// in distinct banks.
template <int BlockN>
struct BiasRowLayout {
  static_assert(BlockN % 16 == 0, "a quad's keys are whole 16-byte loads");
  static constexpr int kQuadFloats = BlockN / 4 + 4;
  static constexpr int kSlotFloats = 4 * kQuadFloats;
  __host__ __device__ static constexpr int offset(int key) {
    return (key % 8) / 2 * kQuadFloats + key / 8 * 2 + key % 2;
  }
};

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

// Where an elementwise bias comes from, a kernel for each (fwd_kernel.cuh).
enum class BiasSource { kRegisters, kTileRing, kRowRing };

// Whether a bias is one row broadcast over the query rows (row mode; any
// alignment).
inline bool bias_rows_broadcast(void const* bias, int64_t const (&stride)[3]) {
  return bias != nullptr && stride[2] == 0;
}

// Whether a bias can come through the ring as tiles: TMA's 16-byte alignment
// of the base and of every stride, strides TMA can encode (none negative),
// and distinct rows (a row-broadcast bias takes row mode instead).
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

// Whether row mode's consumers start their S product from the row (one
// 16-byte load per four scores, no instruction a score): where the bias is
// added in raw score units, that is without a soft-cap, which must act on
// the product alone (LogitTransform::kBiasInScoreUnits).
template <class Traits>
__host__ __device__ constexpr bool bias_rows_init_scores() {
  return Traits::kBias == BiasMode::kElementwise && !Traits::kHasSoftcap;
}

// Row mode, run by every lane of warp 1: each key tile's row of the bias
// (keys past the sequence as zeros), in the consumers' order, as fp32 in
// raw score units (over the softmax scale) where the consumers start their
// S product from it (bias_rows_init_scores), else as read. A lane's keys are
// lane + 32 j, read as single elements so that any alignment and stride
// serves; the next tile's keys are read before waiting for a free slot, so
// that their latency overlaps the wait.
template <class Traits, class Params>
__device__ __forceinline__ void fwd_sm90_load_bias_rows(Params const& params,
                                                        typename Traits::BiasRing& ring,
                                                        int lane) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using Element = typename Traits::Element;
  using Work = Sm90TileWork<Traits>;
  using Layout = BiasRowLayout<Traits::kBlockN>;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kPerLane = kBlockN / 32;
  static_assert(kBlockN % 32 == 0, "a key tile is whole warps of keys");
  static_assert(kBiasRowSlots * Layout::kSlotFloats * 4 <= int(sizeof(ring.rows)),
                "the row slots fit the ring's tile stages");
  FwdParams const& p = params.p;
  const float unit = bias_rows_init_scores<Traits>() ? 1.f / p.scale : 1.f;
  float* slots = reinterpret_cast<float*>(ring.rows.data());
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
      float* slot_row = slots + slot.stage * Layout::kSlotFloats;
      CUTE_UNROLL
      for (int j = 0; j < kPerLane; ++j) {
        slot_row[Layout::offset(lane + 32 * j)] = float(keys[j]) * unit;
      }
      Barrier::arrive(&ring.row_full[slot.stage]);
      CUTE_UNROLL
      for (int j = 0; j < kPerLane; ++j) keys[j] = next[j];
    }
    count += n_tiles;
  });
}

// The consumers' side: a tile's bias added to its scores from the ring, or
// in row mode (`RowMode`) the tile's one row, for every row of scores.
template <class Traits, bool RowMode>
struct FwdBiasRingReader {
  using Element = typename Traits::Element;
  using RowLayout = BiasRowLayout<Traits::kBlockN>;
  // Row mode without a soft-cap: init_scores() before the S product takes
  // the place of add() after it.
  static constexpr bool kInitsScores = RowMode && bias_rows_init_scores<Traits>();
  typename Traits::BiasRing* ring;

  // Row mode: `visit(c, v)` with v the row's values at fragment columns c to
  // c + 3 of this thread's scores (coords as for add()), then the slot
  // released.
  template <class Coords, class Visit>
  __device__ __forceinline__ void for_row(Coords const& coords, int columns, int index,
                                          Visit&& visit) const {
    using namespace cute;
    using Barrier = cutlass::arch::ClusterTransactionBarrier;
    const RingSlot slot = ring_slot_of<kBiasRowSlots>(index);
    Barrier::wait(&ring->row_full[slot.stage], slot.phase);
    // Column 0 is key 2 q of the tile: quad q's keys start the thread's run.
    float const* quad = reinterpret_cast<float const*>(ring->rows.data()) +
                        slot.stage * RowLayout::kSlotFloats +
                        RowLayout::offset(get<1>(coords(0, 0)));
    CUTE_UNROLL
    for (int c = 0; c < columns; c += 4) visit(c, *reinterpret_cast<float4 const*>(quad + c));
    Barrier::arrive(&ring->row_empty[slot.stage]);
  }

  // Row mode without a soft-cap: the S accumulator `acc_s` (wgmma layout)
  // set to the row in raw score units, for the product to add to.
  template <class AccS, class Coords>
  __device__ __forceinline__ void init_scores(AccS& acc_s, Coords const& coords,
                                              int index) const {
    using namespace cute;
    static_assert(kInitsScores);
    Tensor scores = make_tensor(acc_s.data(), gmma_accum_as_rows_cols(acc_s.layout()));
    for_row(coords, size<1>(scores), index, [&](int c, float4 v) {
      CUTE_UNROLL
      for (int r = 0; r < size<0>(scores); ++r) {
        scores(r, c) = v.x;
        scores(r, c + 1) = v.y;
        scores(r, c + 2) = v.z;
        scores(r, c + 3) = v.w;
      }
    });
  }

  // The ring's tile `index` (one per key tile, in the K/V ring's order, so
  // the consumers' K/V tile count): scores(r, c) becomes the raw score plus
  // the bias at the tile's (row, key) coords(r, c), in the units
  // LogitTransform::bias_for_softmax gives; the stage is released at once.
  // Tiles: fragment columns 2k and 2k + 1 are neighbouring keys, one word.
  template <class Transform, class Scores, class Coords>
  __device__ __forceinline__ void add(Transform const& transform, Scores& scores,
                                      Coords const& coords, int index) const {
    using namespace cute;
    using Barrier = cutlass::arch::ClusterTransactionBarrier;
    if constexpr (RowMode) {
      static_assert(!kInitsScores, "the row is already in the scores");
      for_row(coords, size<1>(scores), index, [&](int c, float4 v) {
        const float values[4] = {v.x, v.y, v.z, v.w};
        CUTE_UNROLL
        for (int r = 0; r < size<0>(scores); ++r) {
          CUTE_UNROLL
          for (int e = 0; e < 4; ++e) {
            scores(r, c + e) = transform.bias_for_softmax(scores(r, c + e), values[e]);
          }
        }
      });
    } else {
      using Layout = typename Traits::SmemLayoutBiasRing;
      // Byte offsets: the layout without its swizzle, then the swizzle,
      // which acts on byte addresses.
      constexpr auto kLinear = get_nonswizzle_portion(Layout{});
      constexpr auto kSwizzle = get_swizzle_portion(Layout{});
      const RingSlot slot = ring_slot_of<Traits::kBiasStages>(index);
      Barrier::wait(&ring->full[slot.stage], slot.phase);
      const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(ring->rows.data()));
      CUTE_UNROLL
      for (int r = 0; r < size<0>(scores); ++r) {
        const int row = get<0>(coords(r, 0));
        CUTE_UNROLL
        for (int c = 0; c < size<1>(scores); c += 2) {
          const int linear = kLinear(row, get<1>(coords(r, c)), slot.stage);
          const uint32_t address = base + uint32_t(kSwizzle(linear * int(sizeof(Element))));
          uint32_t word;
          asm volatile("ld.shared.u32 %0, [%1];" : "=r"(word) : "r"(address));
          const auto pair = reinterpret_cast<cutlass::Array<Element, 2> const&>(word);
          scores(r, c) = transform.bias_for_softmax(scores(r, c), float(pair[0]));
          scores(r, c + 1) = transform.bias_for_softmax(scores(r, c + 1), float(pair[1]));
        }
      }
      Barrier::arrive(&ring->empty[slot.stage]);
    }
  }
};

}  // namespace ckfmha::kernel
