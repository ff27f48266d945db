// Swizzled shared-memory rows and the 16-byte copies that fill and drain
// them: the sm80 path's Q, K, V and O tiles, and the staging buffers through
// which the Hopper kernels store O, dK and dV as whole row vectors.
#pragma once

#include "ckfmha/kernel/common/tile_copy.cuh"

#include <cute/tensor.hpp>

#include <type_traits>

namespace ckfmha::kernel {

// Shared-memory tile geometry for rows of `Cols` elements: stored in 64- or
// 32-element chunks XOR-swizzled at 16-byte granularity so that ldmatrix
// (8 rows x 16 B) hits 8 distinct bank groups; global loads are 16 bytes per
// thread with whole chunks per row.
// `Chunk` (64 where the columns allow, else 32) is set to 32 where the
// tile's writers own column ranges that are multiples of 32 only.
template <class Element, int Cols, int Threads, bool Stream = false,
          int Chunk = (Cols % 64 == 0 ? 64 : 32)>
struct SmemRows {
  static_assert(Cols % 32 == 0, "head dims are multiples of 32");
  static_assert((Chunk == 64 || Chunk == 32) && Cols % Chunk == 0, "whole 32- or 64-column chunks");
  static constexpr int kChunk = Chunk;
  static constexpr int kSwizzleBits = kChunk == 64 ? 3 : 2;
  using Atom = decltype(cute::composition(
      cute::Swizzle<kSwizzleBits, 3, 3>{},
      cute::Layout<cute::Shape<cute::_8, cute::Int<kChunk>>,
                   cute::Stride<cute::Int<kChunk>, cute::_1>>{}));

  static constexpr int kVecElems = 16 / int(sizeof(Element));
  static constexpr int kThreadsPerRow = kChunk / kVecElems;
  static_assert(Threads % kThreadsPerRow == 0, "threads must tile the chunk width");
  using ThreadLayout =
      cute::Layout<cute::Shape<cute::Int<Threads / kThreadsPerRow>, cute::Int<kThreadsPerRow>>,
                   cute::Stride<cute::Int<kThreadsPerRow>, cute::_1>>;
  using ValueLayout = cute::Layout<cute::Shape<cute::_1, cute::Int<kVecElems>>>;
  using Load = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<std::conditional_t<Stream, CpAsyncCgPrefetch256,
                                         cute::SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>>,
                      Element>{},
      ThreadLayout{}, ValueLayout{}));
  using Store = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::UniversalCopy<cute::uint128_t>, Element>{}, ThreadLayout{},
      ValueLayout{}));

  template <int Rows>
  using Layout = decltype(cute::tile_to_shape(Atom{},
                                              cute::Shape<cute::Int<Rows>, cute::Int<Cols>>{}));
};

}  // namespace ckfmha::kernel
