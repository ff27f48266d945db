// Compile-time configuration of the grouped-convolution forward on TMA and
// wgmma (sm_90a): one producer warpgroup whose elected thread issues a tensor
// copy per operand and k-tile (x's tile in the copy engine's im2col mode, w's
// as a plain 3D box), and consumer warpgroups that only multiply. A k-tile is
// TileK channels of one filter tap, so the group's channel count must divide
// by TileK (the runtime checks it, conv_plan.cpp).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include <type_traits>

namespace ckfmha::kernel {

template <class Element_, int SpatialDims, int Vector, int TileM, int TileN, int TileK, int Warps,
          int Stages>
struct ConvFwdTmaTraits {
  using Element = Element_;
  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                    std::is_same_v<Element, cutlass::bfloat16_t>,
                "wgmma takes fp16 or bf16 operands here");
  static_assert(SpatialDims == 2 || SpatialDims == 3, "2D or 3D convolution");
  // The copy engine moves whole 16-byte channel runs: the same condition as
  // the 8-channel vector of the gathering kernels.
  static_assert(Vector == 8, "tensor copies need 16-byte channel runs");
  static constexpr int kSpatialDims = SpatialDims;
  static constexpr int kVector = Vector;
  static constexpr int kTileM = TileM;
  static constexpr int kTileN = TileN;
  static constexpr int kTileK = TileK;
  static constexpr int kStages = Stages;
  static constexpr int kThreads = Warps * 32;
  static constexpr int kConsumerWarpgroups = Warps / 4 - 1;
  static constexpr int kConsumerThreads = kConsumerWarpgroups * 128;
  static_assert(Warps % 4 == 0 && kConsumerWarpgroups >= 1 && kConsumerWarpgroups <= 2,
                "one producer warpgroup and one or two consumer warpgroups");
  static_assert(TileM % (64 * kConsumerWarpgroups) == 0,
                "each consumer warpgroup owns whole 64-row wgmma tiles");
  static_assert(TileM <= 256, "the im2col copy's pixels per column");
  static_assert(TileN % 16 == 0 && TileN >= 16 && TileN <= 256, "wgmma N of 16 to 256");
  static_assert(TileK == 32 || TileK == 64, "one 64- or 128-byte swizzled row per position");
  static_assert(Stages >= 2 && Stages <= 8, "2 to 8 shared-memory stages");


  // The copy engine writes 64- or 128-byte rows with the matching swizzle,
  // which is the layout wgmma reads as K-major.
  using SmemAtom = std::conditional_t<TileK * int(sizeof(Element)) == 128,
                                      cute::GMMA::Layout_K_SW128_Atom<Element>,
                                      cute::GMMA::Layout_K_SW64_Atom<Element>>;
  static constexpr int kSwizzleBytes = TileK * int(sizeof(Element));
  using SmemLayoutA = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<TileM>, cute::Int<TileK>, cute::Int<Stages>>{}));
  using SmemLayoutB = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<TileN>, cute::Int<TileK>, cute::Int<Stages>>{}));
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, cute::Int<TileN>, cute::Int<TileK>>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::K>(),
      cute::Layout<cute::Shape<cute::Int<kConsumerWarpgroups>, cute::_1, cute::_1>>{}));

  // w's tile is a K-major (TileN, TileK) box of the dense filter; the
  // transposed variant below reads it MN-major instead.
  static constexpr bool kFilterTransposed = false;

  static constexpr int kStageBytesA = TileM * TileK * int(sizeof(Element));
  static constexpr int kStageBytesB = TileN * TileK * int(sizeof(Element));
  // The epilogue stages each consumer warpgroup's rows through shared memory
  // in chunks of 8 KiB of output (64 channels of 64 rows, 32 of 128), so that
  // threads store whole 16-byte runs of a row; rows are padded by 16 bytes,
  // which spreads a warp's fragment writes over all banks.
  static constexpr int kRowsPerConsumer = TileM / kConsumerWarpgroups;
  static constexpr int kEpilogueCols =
      cute::min(TileN, 8192 / (kRowsPerConsumer * int(sizeof(Element))));
  static constexpr int kEpiloguePitch = kEpilogueCols * int(sizeof(Element)) + 16;
  static_assert(TileN % kEpilogueCols == 0 && kEpilogueCols % 8 == 0, "whole chunks of runs");
  // The operand stages (1024-byte aligned, as swizzled tiles need), the
  // epilogue's chunks, the row table the epilogue stores through, then each
  // stage's two barriers.
  static constexpr int kSmemBytes = Stages * (kStageBytesA + kStageBytesB);
  static constexpr int kSmemEpilogueBytes = TileM * kEpiloguePitch;
  static constexpr int kSmemRowBytes = TileM * 32;
  static constexpr int kSmemBarrierBytes = 2 * Stages * 8;
  static constexpr int kSmemLaunchBytes =
      kSmemBytes + kSmemEpilogueBytes + kSmemRowBytes + kSmemBarrierBytes;
  // Two CTAs an SM where both fit in its 228 KiB (1 KiB of each is the
  // system's): one CTA's tile start and epilogue then run under the other's
  // products, which pays where a layer has few tiles.
  static constexpr int kMinCtasPerSm = 2 * (kSmemLaunchBytes + 1024) <= 228 * 1024 ? 2 : 1;

  // The producer keeps a handful of registers and the consumers take the rest
  // of the CTA's share of the register file (ptxas sizes every thread to the
  // share, at most 255, in steps of 8): one CTA of 384 threads 128 x 40 +
  // 256 x 232, two CTAs of 256 threads 128 x 40 + 128 x 216 each.
  static constexpr int kProducerRegisters = 40;
  static constexpr int kShare = cute::min(65536 / (kMinCtasPerSm * kThreads), 255) / 8 * 8;
  static constexpr int kConsumerRegisters =
      cute::min(256, (kShare * kThreads - 128 * kProducerRegisters) / kConsumerThreads / 8 * 8);
};

// The same kernel reading the filter in place where the backward-data plan
// hands it a transposed, flipped view (ConvFilterView): its output channels
// are then the filter's contiguous input channels, so each stage's w tile
// lands as TileK rows of 64-channel runs (128-byte swizzled), one copy a run,
// and wgmma reads it MN-major. The runs of one 64-channel block are
// contiguous in shared memory (atoms along k first), as a copy writes them.
template <class Base>
struct ConvFwdTmaTransposedFilterTraits : Base {
  using Element = typename Base::Element;
  static constexpr bool kFilterTransposed = true;
  static constexpr int kFilterRun = 64;  // channels of one 128-byte row
  static_assert(Base::kTileN % kFilterRun == 0, "whole 64-channel runs of the filter");
  using SmemLayoutB = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_MN_SW128_Atom<Element>{},
      cute::Shape<cute::Int<Base::kTileN>, cute::Int<Base::kTileK>, cute::Int<Base::kStages>>{},
      cute::Step<cute::_2, cute::_1, cute::_3>{}));
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<
          Element, Element, float,
          cute::Shape<cute::_64, cute::Int<Base::kTileN>, cute::Int<Base::kTileK>>,
          cute::GMMA::Major::K, cute::GMMA::Major::MN>(),
      cute::Layout<cute::Shape<cute::Int<Base::kConsumerWarpgroups>, cute::_1, cute::_1>>{}));
};

}  // namespace ckfmha::kernel
