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
// tile m_blocks-1-j with tile j (the heaviest first) and every pair costs the
// same; otherwise a unit is one tile.
template <bool PairTiles>
struct PersistentTileOrder {
  int num_m_blocks;
  int nhead;
  int num_batches;

  __host__ __device__ int units_per_head() const {
    return PairTiles ? (num_m_blocks + 1) / 2 : num_m_blocks;
  }
  __host__ __device__ int num_units() const { return units_per_head() * nhead * num_batches; }

  __device__ __forceinline__ int tiles_in_unit(int unit) const {
    if constexpr (PairTiles) {
      const int j = unit % units_per_head();
      return 2 * j + 1 == num_m_blocks ? 1 : 2;  // the middle tile of an odd count is alone
    } else {
      return 1;
    }
  }

  __device__ __forceinline__ QueryTile tile(int unit, int which) const {
    const int j = unit % units_per_head();
    const int rest = unit / units_per_head();
    const int m_block = PairTiles && which == 0 ? num_m_blocks - 1 - j : j;
    return {m_block, rest % nhead, rest / nhead};
  }
};

// Calls body(tile) for every tile of this CTA's units, in order. One loop
// with the unit advanced by hand: the consumers' code came out without
// spills this way where two nested loops spilled (NOTES 72).
template <class Order, class Body>
__device__ __forceinline__ void for_each_tile(Order const& order, Body&& body) {
  int unit = blockIdx.x;
  int which = 0;
  while (unit < order.num_units()) {
    const QueryTile tile = order.tile(unit, which);
    if (++which == order.tiles_in_unit(unit)) {
      which = 0;
      unit += gridDim.x;
    }
    body(tile);
  }
}

}  // namespace ckfmha::kernel
