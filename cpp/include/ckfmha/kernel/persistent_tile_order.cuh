// The order in which a persistent grid walks the forward's query tiles. Tiles
// are grouped into units of equal work; CTA c takes units c, c + gridDim.x,
// ..., so with equal units every CTA gets the same share and consecutive
// units (running at about the same time) are query tiles of one head, whose
// K/V stay in L2 across them.
#pragma once

namespace ckfmha::kernel {

struct QueryTile {
  int m_block;
  int head;
  int batch;  // the sequence, in group mode
};

// PairTiles: causal work grows linearly with the query tile, so a unit pairs
// tile m_blocks-1-j with tile j of one head (the heaviest first) and every
// pair costs the same. With an odd count, each head's middle tile costs half
// a pair: the middle tiles of two heads make one unit, after all the pairs.
// (Alone, they would make every CTA whose units fall on them in step with
// the grid's width do half the work of the others.) Otherwise a unit is one
// tile.
template <bool PairTiles>
struct PersistentTileOrder {
  int num_m_blocks;
  int nhead;
  int num_batches;

  __host__ __device__ int heads() const { return nhead * num_batches; }
  __host__ __device__ int pairs_per_head() const { return num_m_blocks / 2; }
  __host__ __device__ int pair_units() const { return pairs_per_head() * heads(); }
  __host__ __device__ int num_units() const {
    if constexpr (PairTiles) {
      return pair_units() + (num_m_blocks % 2 == 1 ? (heads() + 1) / 2 : 0);
    } else {
      return num_m_blocks * heads();
    }
  }

  __device__ __forceinline__ int tiles_in_unit(int unit) const {
    if constexpr (PairTiles) {
      if (unit < pair_units()) return 2;
      return 2 * (unit - pair_units()) + 1 < heads() ? 2 : 1;  // an odd head count leaves one
    } else {
      return 1;
    }
  }

  __device__ __forceinline__ QueryTile tile(int unit, int which) const {
    int m_block, rest;  // rest: the (batch, head) index
    if (!PairTiles) {
      m_block = unit % num_m_blocks;
      rest = unit / num_m_blocks;
    } else if (unit < pair_units()) {
      const int j = unit % pairs_per_head();
      m_block = which == 0 ? num_m_blocks - 1 - j : j;
      rest = unit / pairs_per_head();
    } else {
      m_block = num_m_blocks / 2;
      rest = 2 * (unit - pair_units()) + which;
    }
    return {m_block, rest % nhead, rest / nhead};
  }
};

// Calls body(tile) for every tile of this CTA's units, in order.
template <class Order, class Body>
__device__ __forceinline__ void for_each_tile(Order const& order, Body&& body) {
  for (int unit = blockIdx.x; unit < order.num_units(); unit += gridDim.x) {
    for (int which = 0; which < order.tiles_in_unit(unit); ++which) body(order.tile(unit, which));
  }
}

}  // namespace ckfmha::kernel
