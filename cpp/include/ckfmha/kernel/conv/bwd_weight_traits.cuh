// Compile-time configuration of the grouped-convolution backward-weight
// kernel (cp.async + mma.sync, sm80 and later). Per group it computes
// dw[K, taps * C] = dy[P, K]^T * x_gathered[P, taps * C], the reduction running
// over the P = batch x output positions. Both operands are read along their
// channels (dy's K, x's C), which are the GEMM's M and N: their shared-memory
// tiles are M- resp. N-major, and ldmatrix.trans turns them into mma.sync's
// K-major fragments.
#pragma once

#include "ckfmha/kernel/conv/gather.cuh"

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include <cstdint>
#include <type_traits>

namespace ckfmha::kernel {

template <class Element_, int SpatialDims, int Vector, int TileM, int TileN, int TileK, int Warps,
          int Stages>
struct ConvBwdWeightSm80Traits {
  using Element = Element_;
  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                    std::is_same_v<Element, cutlass::bfloat16_t>,
                "the tensor-core path takes fp16 or bf16 operands");
  static_assert(SpatialDims == 2 || SpatialDims == 3, "2D or 3D convolution");
  static_assert(Vector == 8 || Vector == 4 || Vector == 2 || Vector == 1,
                "channel vectors of 16, 8, 4 or 2 bytes");
  static constexpr int kSpatialDims = SpatialDims;
  static constexpr int kVector = Vector;
  static constexpr int kTileM = TileM;  // output channels (K)
  static constexpr int kTileN = TileN;  // filter taps x input channels
  static constexpr int kTileK = TileK;  // batch x output positions
  static constexpr int kStages = Stages;
  static constexpr int kThreads = Warps * 32;
  static constexpr int kWarpsN = 2;
  static constexpr int kWarpsM = Warps / kWarpsN;
  static_assert(Warps == 4 || Warps == 8, "4 or 8 warps");
  // The shared-memory atom is 64 channels wide.
  static_assert(TileM % 64 == 0 && TileN % 64 == 0, "tiles of 64 or 128 channels");
  static_assert(TileM % (16 * kWarpsM) == 0 && TileN % (16 * kWarpsN) == 0,
                "each warp owns whole 16x16 MMA slices");
  static_assert(TileK == 32 || TileK == 64, "reduction steps of 32 or 64 positions");
  static_assert(Stages >= 2 && Stages <= 4, "2 to 4 shared-memory stages");

  using MmaOp = std::conditional_t<std::is_same_v<Element, cutlass::half_t>,
                                   cute::SM80_16x8x16_F32F16F16F32_TN,
                                   cute::SM80_16x8x16_F32BF16BF16F32_TN>;
  using TiledMma =
      cute::TiledMMA<cute::MMA_Atom<MmaOp>,
                     cute::Layout<cute::Shape<cute::Int<kWarpsM>, cute::Int<kWarpsN>, cute::_1>>,
                     cute::Tile<cute::Int<16 * kWarpsM>, cute::Int<16 * kWarpsN>, cute::_16>>;

  // Channel-major atoms of 64 channels x 8 positions, their 16-byte chunks
  // XOR-swizzled by position so that the eight positions one transposing
  // ldmatrix reads fall in distinct bank groups.
  using SmemAtom = decltype(cute::composition(
      cute::Swizzle<3, 3, 3>{},
      cute::Layout<cute::Shape<cute::_64, cute::_8>, cute::Stride<cute::_1, cute::_64>>{}));
  using SmemLayoutA = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<TileM>, cute::Int<TileK>, cute::Int<Stages>>{}));
  using SmemLayoutB = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<TileN>, cute::Int<TileK>, cute::Int<Stages>>{}));
  using SmemLoadAtom = cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, Element>;

  // The operand stages, then two slots of the positions table (one filled
  // while the other's tile is issued).
  static constexpr int kSmemBytes = Stages * (TileM + TileN) * TileK * int(sizeof(Element));
  static constexpr int kSmemTableBytes = 2 * TileK * int(sizeof(ConvRow));
  static constexpr int kSmemLaunchBytes = kSmemBytes + kSmemTableBytes;
};

}  // namespace ckfmha::kernel
