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

// Column-predicated variant for tiles whose columns are keys (column-major
// V). Callers guarantee the key count is a multiple of the 16-byte vector, so
// each vector is wholly inside or wholly outside the sequence.
template <class TiledCopy, class Src, class Dst, class Coords>
__device__ __forceinline__ void load_cols(TiledCopy const& tiled_copy, Src const& src, Dst& dst,
                                          Coords const& coords, int cols_left) {
  using namespace cute;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    CUTE_UNROLL
    for (int k = 0; k < size<2>(src); ++k) {
      if (get<1>(coords(0, m, k)) < cols_left) {
        copy(tiled_copy, src(_, m, k), dst(_, m, k));
      } else {
        clear(dst(_, m, k));
      }
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
