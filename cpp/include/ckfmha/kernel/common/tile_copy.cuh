// Predicated global <-> shared tile copies. Row-major tiles can only lose
// whole rows past a sequence's end (the head dim is never padded), so one
// predicate per row suffices; out-of-sequence elements are zero-filled so the
// MMAs read defined values.
#pragma once

#include <cute/tensor.hpp>

namespace ckfmha::kernel {

// cp.async of 16 bytes, L1-bypassing like SM80_CP_ASYNC_CACHEGLOBAL, asking
// L2 to fetch the whole 256-byte block around it: for streams read once
// (decode K/V), fewer and larger DRAM requests.
struct CpAsyncCgPrefetch256 {
  using SRegisters = cute::uint128_t[1];
  using DRegisters = cute::uint128_t[1];
  CUTE_HOST_DEVICE static void copy(cute::uint128_t const& gmem_src, cute::uint128_t& smem_dst) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const uint32_t smem_addr = cute::cast_smem_ptr_to_uint(&smem_dst);
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(smem_addr),
                 "l"(&gmem_src));
#endif
  }
};

// The same partition of a tile held in another shared-memory stage; stages
// are laid out back to back, so only the base pointer moves.
template <class Partition>
__device__ __forceinline__ auto in_stage(Partition const& part, int stage, int stage_elems) {
  return cute::make_tensor(part.data() + stage * stage_elems, part.layout());
}

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
// V), where a sequence may end inside a 16-byte vector and, in group mode or
// for odd strides, vectors may not be 16-byte aligned at all.
// `vectors_aligned` (uniform over the CTA, so the branch never diverges on it)
// says every vector's global address is 16-byte aligned: whole vectors inside
// the sequence then go through cp.async and only the one straddling the end
// is read element by element. Otherwise every element is a predicated scalar
// load. Keys past the end are zero-filled and never read: they belong to the
// next packed sequence or lie past the allocation. The scalar path's shared
// stores are plain and synchronous, so the barrier that publishes the cp.async
// data (issued after cp_async_wait) publishes them too.
template <class TiledCopy, class Src, class Dst, class Coords>
__device__ __forceinline__ void load_cols(TiledCopy const& tiled_copy, Src const& src, Dst& dst,
                                          Coords const& coords, int cols_left,
                                          bool vectors_aligned) {
  using namespace cute;
  using Element = typename Dst::value_type;
  constexpr int kVec = decltype(size<0>(src))::value;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    CUTE_UNROLL
    for (int k = 0; k < size<2>(src); ++k) {
      const int keys_in_seq = cols_left - get<1>(coords(0, m, k));
      if (vectors_aligned && keys_in_seq >= kVec) {
        copy(tiled_copy, src(_, m, k), dst(_, m, k));
      } else {
        CUTE_UNROLL
        for (int i = 0; i < kVec; ++i) {
          Element value(0.f);
          if (i < keys_in_seq) value = src(i, m, k);
          dst(i, m, k) = value;
        }
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

// Stores a register fragment seen as (rows, cols) straight to global memory,
// two neighbouring columns (one 32-bit word) at a time, skipping rows at or
// past rows_left. For outputs with no shared memory to be staged in: the
// stores are narrower than staged ones, but nothing waits for shared memory.
template <class Element, class Values, class Coords>
__device__ __forceinline__ void store_fragment_rows(Values const& values, Coords const& coords,
                                                    Element* base, int64_t row_stride,
                                                    int rows_left) {
  using namespace cute;
  using Pair = cutlass::AlignedArray<Element, 2>;
  static_assert(decltype(size<1>(values))::value % 2 == 0, "columns come in neighbouring pairs");
  CUTE_UNROLL
  for (int i = 0; i < size<0>(values); ++i) {
    const int row = get<0>(coords(i, 0));
    if (row < rows_left) {
      Element* dst = base + row * row_stride;
      CUTE_UNROLL
      for (int j = 0; j < size<1>(values); j += 2) {
        Pair pair;
        pair[0] = values(i, j);
        pair[1] = values(i, j + 1);
        *reinterpret_cast<Pair*>(dst + get<1>(coords(i, j))) = pair;
      }
    }
  }
}

}  // namespace ckfmha::kernel

namespace cute {
template <>
struct Copy_Traits<ckfmha::kernel::CpAsyncCgPrefetch256>
    : Copy_Traits<SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>> {};
}  // namespace cute
