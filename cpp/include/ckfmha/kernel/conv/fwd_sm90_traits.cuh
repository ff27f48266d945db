// Compile-time configuration of the grouped-convolution forward kernel on the
// sm90 path: the sm80 kernel's gathers (cp.async, any channel vector) feeding
// wgmma from 128- or 64-byte swizzled shared memory. Warpgroups stack along
// the output positions, 64 or more rows each.
#pragma once

#include "ckfmha/kernel/conv/gather.cuh"
#include "ckfmha/kernel/conv/gather_viewed_filter.cuh"

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include <type_traits>

namespace ckfmha::kernel {

template <class Element_, int SpatialDims, int Vector, int TileM, int TileN, int TileK, int Warps,
          int Stages>
struct ConvFwdSm90Traits {
  using Element = Element_;
  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                    std::is_same_v<Element, cutlass::bfloat16_t>,
                "wgmma takes fp16 or bf16 operands here");
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
  static constexpr int kWarpgroups = Warps / 4;
  static_assert(Warps % 4 == 0 && kWarpgroups >= 1 && kWarpgroups <= 3, "1 to 3 warpgroups");
  static_assert(TileM % (64 * kWarpgroups) == 0, "each warpgroup owns whole 64-row wgmma tiles");
  static_assert(TileN % 16 == 0 && TileN >= 16 && TileN <= 256, "wgmma N of 16 to 256");
  static_assert(TileK == 32 || TileK == 64, "reduction steps of 32 or 64 channels");
  // Loads run kStages - 2 tiles ahead: one more stage is still being read by
  // the wgmma batch left in flight.
  static_assert(Stages >= 3 && Stages <= 8, "3 to 8 shared-memory stages");
  static constexpr int kLoadsAhead = Stages - 2;
  // w is dense (ConvFwdSm90ViewedFilterTraits reads it through a view).
  static constexpr bool kFilterViewed = false;

  using SmemAtom = std::conditional_t<TileK * int(sizeof(Element)) == 128,
                                      cute::GMMA::Layout_K_SW128_Atom<Element>,
                                      cute::GMMA::Layout_K_SW64_Atom<Element>>;
  using SmemLayoutA = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<TileM>, cute::Int<TileK>, cute::Int<Stages>>{}));
  using SmemLayoutB = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<TileN>, cute::Int<TileK>, cute::Int<Stages>>{}));
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, cute::Int<TileN>, cute::Int<TileK>>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::K>(),
      cute::Layout<cute::Shape<cute::Int<kWarpgroups>, cute::_1, cute::_1>>{}));
  using Loader = ConvTileLoader<Element, SpatialDims, Vector, TileM, TileN, TileK, Warps * 32,
                                SmemLayoutA, SmemLayoutB>;

  // The operand stages (1024-byte aligned, as swizzled wgmma tiles need), then
  // the row table.
  static constexpr int kSmemBytes = Stages * (TileM + TileN) * TileK * int(sizeof(Element));
  static constexpr int kSmemRowBytes = TileM * int(sizeof(ConvRow));
  static constexpr int kSmemLaunchBytes = kSmemBytes + kSmemRowBytes;
  // Two CTAs an SM where their shared memory fits (ptxas then holds each
  // thread to 64K / (2 * kThreads) registers): one CTA's gathers, prologue
  // and epilogue run under the other's products. Not with 2- and 4-byte
  // vectors: their many copies per thread need the registers.
  static constexpr int kMinCtasPerSm = 2 * kSmemLaunchBytes <= 220 * 1024 && Vector >= 4 ? 2 : 1;
};

// The same kernel reading w through the problem's filter view
// (backward-data's phases, in place): B's 16-byte vectors run along the
// output channels, so it is stored MN-major, in the widest swizzle the tile's
// N fills, and wgmma reads it so. Same tiles, stages and shared memory.
template <class Base>
struct ConvFwdSm90ViewedFilterTraits : Base {
  using Element = typename Base::Element;
  static constexpr bool kFilterViewed = true;
  static_assert(Base::kVector == 8, "the view's channels in 16-byte runs");
  static constexpr int kTileN = Base::kTileN;
  using SmemAtomB = std::conditional_t<
      kTileN % 64 == 0, cute::GMMA::Layout_MN_SW128_Atom<Element>,
      std::conditional_t<kTileN % 32 == 0, cute::GMMA::Layout_MN_SW64_Atom<Element>,
                         cute::GMMA::Layout_MN_SW32_Atom<Element>>>;
  using SmemLayoutB = decltype(cute::tile_to_shape(
      SmemAtomB{},
      cute::Shape<cute::Int<kTileN>, cute::Int<Base::kTileK>, cute::Int<Base::kStages>>{},
      cute::Step<cute::_2, cute::_1, cute::_3>{}));
  static_assert(cute::cosize_v<SmemLayoutB> == cute::cosize_v<typename Base::SmemLayoutB>,
                "the dense kernel's shared-memory budget");
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<
          Element, Element, float,
          cute::Shape<cute::_64, cute::Int<kTileN>, cute::Int<Base::kTileK>>,
          cute::GMMA::Major::K, cute::GMMA::Major::MN>(),
      cute::Layout<cute::Shape<cute::Int<Base::kWarpgroups>, cute::_1, cute::_1>>{}));
  using Loader = ConvViewedFilterTileLoader<Element, Base::kSpatialDims, Base::kVector,
                                            Base::kTileM, kTileN, Base::kTileK, Base::kThreads,
                                            typename Base::SmemLayoutA, SmemLayoutB>;
};

}  // namespace ckfmha::kernel
