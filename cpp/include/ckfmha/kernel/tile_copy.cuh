// Row-predicated global <-> shared tile copies. Only whole rows can fall
// outside a sequence (the head dim is never padded), so one predicate per row
// suffices; rows past the end are zero-filled so the MMAs read defined values.
#pragma once

#include <cute/tensor.hpp>

namespace ckfmha::kernel {

// src/dst: (CPY, CPY_ROWS, CPY_COLS) partitions; coords: the same partition of
// an identity tensor over the tile; rows_left: valid rows in this tile.
template <class TiledCopy, class Src, class Dst, class Coords>
__device__ __forceinline__ void load_rows(TiledCopy const& tiled_copy, Src const& src, Dst& dst,
                                          Coords const& coords, int rows_left) {
  using namespace cute;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    if (get<0>(coords(0, m, 0)) < rows_left) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(src); ++k) copy(tiled_copy, src(_, m, k), dst(_, m, k));
    } else {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(src); ++k) clear(dst(_, m, k));
    }
  }
}

template <class TiledCopy, class Src, class Dst, class Coords>
__device__ __forceinline__ void store_rows(TiledCopy const& tiled_copy, Src const& src, Dst& dst,
                                           Coords const& coords, int rows_left) {
  using namespace cute;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    if (get<0>(coords(0, m, 0)) < rows_left) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(src); ++k) copy(tiled_copy, src(_, m, k), dst(_, m, k));
    }
  }
}

}  // namespace ckfmha::kernel
