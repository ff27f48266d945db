// The work of the Hopper forward's persistent CTAs: query tiles (128 or 192
// rows of one head and sequence) taken unit by unit in PersistentTileOrder
// (causal: pairs of tiles of equal total work), and what each tile's rows see
// of the keys. The producer and the consumers walk the tiles apart, each
// deriving the same work from a tile, so that both agree on every load and
// barrier phase without exchanging anything.
#pragma once

#include "ckfmha/kernel/common/attention_mask.cuh"
#include "ckfmha/kernel/common/persistent_tile_order.cuh"
#include "ckfmha/kernel/common/sequence_slice.cuh"
#include "ckfmha/kernel/params/fwd_params.h"

namespace ckfmha::kernel {

template <class Traits>
using Sm90TileOrder = PersistentTileOrder<Traits::kMask == MaskMode::kCausal>;

// What one query tile needs, computed alike by the producer and consumers so
// that both walk the same tiles and barrier phases.
template <class Traits>
struct Sm90TileWork {
  QueryTile tile;
  SequenceSlice seq;
  int m_begin;
  AttentionMask<Traits::kMask> mask;
  int n_first, n_last;

  __device__ __forceinline__ Sm90TileWork(FwdParams const& p, QueryTile t)
      : tile(t), seq(locate_sequence<Traits::kIsGroupMode>(p, t.batch)),
        m_begin(t.m_block * Traits::kBlockM),
        mask(AttentionMask<Traits::kMask>::for_sequence(p, seq.seqlen_q, seq.seqlen_k)) {
    mask.key_block_range(m_begin, Traits::kBlockM, Traits::kBlockN, &n_first, &n_last);
  }
  // Group mode sizes the tile grid for the longest sequence; skipped
  // sequences keep whatever their outputs held.
  __device__ __forceinline__ bool has_rows() const { return !seq.skip && m_begin < seq.seqlen_q; }
  __device__ __forceinline__ int n_tiles() const { return n_last - n_first; }
};

}  // namespace ckfmha::kernel
