// Compile-time configuration of the grouped-convolution forward kernel on the
// sm80 path (cp.async + mma.sync): the implicit GEMM's tile, warp grid,
// pipeline depth and the shared-memory layouts its operands use.
#pragma once

#include "ckfmha/kernel/conv/gather.cuh"

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include <cstdint>
#include <type_traits>

namespace ckfmha::kernel {


template <class Element_, int SpatialDims, int Vector, int TileM, int TileN, int TileK, int Warps,
          int Stages>
struct ConvFwdSm80Traits {
  using Element = Element_;
  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                    std::is_same_v<Element, cutlass::bfloat16_t>,
                "the sm80 tensor-core path takes fp16 or bf16 operands");
  static_assert(SpatialDims == 2 || SpatialDims == 3, "2D or 3D convolution");
  static_assert(Vector == 8 || Vector == 4 || Vector == 2 || Vector == 1,
                "channel vectors of 16, 8, 4 or 2 bytes");
  static constexpr int kSpatialDims = SpatialDims;
  static constexpr int kVector = Vector;
  static constexpr int kTileM = TileM;
  static constexpr int kTileN = TileN;
  static constexpr int kTileK = TileK;
  static constexpr int kStages = Stages;
  static constexpr int kThreads = Warps * 32;
  // Two warps across the output channels from 64 of them, else one: a warp's
  // N extent stays a multiple of 16 (one ldmatrix.x4 feeds two 8-wide MMAs).
  static constexpr int kWarpsN = TileN >= 64 ? 2 : 1;
  static constexpr int kWarpsM = Warps / kWarpsN;
  static_assert(Warps == 4 || Warps == 8, "4 or 8 warps");
  static_assert(TileM % (16 * kWarpsM) == 0 && TileN % (16 * kWarpsN) == 0,
                "each warp owns whole 16x16 MMA slices");
  static_assert(TileK == 32 || TileK == 64, "reduction steps of 32 or 64 channels");
  static_assert(Stages >= 2 && Stages <= 4, "2 to 4 shared-memory stages");


  using MmaOp = std::conditional_t<std::is_same_v<Element, cutlass::half_t>,
                                   cute::SM80_16x8x16_F32F16F16F32_TN,
                                   cute::SM80_16x8x16_F32BF16BF16F32_TN>;
  using TiledMma =
      cute::TiledMMA<cute::MMA_Atom<MmaOp>,
                     cute::Layout<cute::Shape<cute::Int<kWarpsM>, cute::Int<kWarpsN>, cute::_1>>,
                     cute::Tile<cute::Int<16 * kWarpsM>, cute::Int<16 * kWarpsN>, cute::_16>>;

  // Rows of TileK elements, their 16-byte chunks XOR-swizzled so that the
  // eight rows one ldmatrix reads fall in distinct bank groups.
  static constexpr int kSwizzleBits = TileK == 64 ? 3 : 2;
  using SmemAtom = decltype(cute::composition(
      cute::Swizzle<kSwizzleBits, 3, 3>{},
      cute::Layout<cute::Shape<cute::_8, cute::Int<TileK>>,
                   cute::Stride<cute::Int<TileK>, cute::_1>>{}));
  using SmemLayoutA = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<TileM>, cute::Int<TileK>, cute::Int<Stages>>{}));
  using SmemLayoutB = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<TileN>, cute::Int<TileK>, cute::Int<Stages>>{}));
  using SmemLoadAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>;
  using Loader = ConvTileLoader<Element, SpatialDims, Vector, TileM, TileN, TileK, Warps * 32,
                                SmemLayoutA, SmemLayoutB>;

  // The operand stages, then the row table.
  static constexpr int kSmemBytes = Stages * (TileM + TileN) * TileK * int(sizeof(Element));
  static constexpr int kSmemRowBytes = TileM * int(sizeof(ConvRow));
  static constexpr int kSmemLaunchBytes = kSmemBytes + kSmemRowBytes;
};

}  // namespace ckfmha::kernel
