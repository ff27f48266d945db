// Compile-time configuration of the grouped-convolution backward-weight on
// TMA and wgmma (sm_90a): one producer warpgroup whose elected thread asks
// the copy engine for each k-tile of positions (dy's output channels and x's
// channels of one filter tap, both in im2col mode), and consumer warpgroups
// that only multiply. Both tiles land channel-major, 64 channels (one
// 128-byte swizzled row) a position, which wgmma reads as MN-major operands.
// A 64-column chunk of the N tile is 64 channels of one tap, so the (packed)
// group's input channels must be a multiple of 64 (the runtime checks it,
// conv_plan.cpp).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include <type_traits>

namespace ckfmha::kernel {

template <class Element_, int SpatialDims, int Vector, int TileM, int TileN, int TileK, int Warps,
          int Stages>
struct ConvBwdWeightTmaTraits {
  using Element = Element_;
  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                    std::is_same_v<Element, cutlass::bfloat16_t>,
                "wgmma reads MN-major operands of fp16 or bf16");
  static_assert(SpatialDims == 2 || SpatialDims == 3, "2D or 3D convolution");
  static_assert(Vector == 8, "tensor copies need 16-byte channel runs");
  static constexpr int kSpatialDims = SpatialDims;
  static constexpr int kVector = Vector;
  static constexpr int kTileM = TileM;  // output channels (K)
  static constexpr int kTileN = TileN;  // filter taps x input channels
  static constexpr int kTileK = TileK;  // batch x output positions
  static constexpr int kStages = Stages;
  static constexpr int kThreads = Warps * 32;
  static constexpr int kConsumerWarpgroups = Warps / 4 - 1;
  static constexpr int kConsumerThreads = kConsumerWarpgroups * 128;
  static_assert(Warps % 4 == 0 && kConsumerWarpgroups >= 1 && kConsumerWarpgroups <= 2,
                "one producer warpgroup and one or two consumer warpgroups");
  static_assert(TileM == 64 * kConsumerWarpgroups,
                "each consumer warpgroup owns one 64-channel wgmma tile");
  // A copy moves 64 channels (128 bytes) a position: the swizzle span.
  static constexpr int kChunk = 64;
  static_assert(TileN % kChunk == 0 && TileN <= 256, "whole 64-channel chunks, wgmma N <= 256");
  static_assert(TileK == 32 || TileK == 64, "32 or 64 positions a copy (whole wgmma k-steps)");
  static_assert(Stages >= 2 && Stages <= 8, "2 to 8 shared-memory stages");
  static constexpr int kChunksA = TileM / kChunk;
  static constexpr int kChunksB = TileN / kChunk;

  // 64 channels x 8 positions, 128-byte rows swizzled: a channel-major wgmma
  // operand. The positions of a 64-channel chunk come first (Step<_2, _1>),
  // so that each copy's TileK rows of 128 bytes are one contiguous run.
  using SmemAtom = cute::GMMA::Layout_MN_SW128_Atom<Element>;
  using SmemLayoutA = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<TileM>, cute::Int<TileK>, cute::Int<Stages>>{},
      cute::Step<cute::_2, cute::_1, cute::_3>{}));
  using SmemLayoutB = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<TileN>, cute::Int<TileK>, cute::Int<Stages>>{},
      cute::Step<cute::_2, cute::_1, cute::_3>{}));
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, cute::Int<TileN>, cute::Int<TileK>>,
                                 cute::GMMA::Major::MN, cute::GMMA::Major::MN>(),
      cute::Layout<cute::Shape<cute::Int<kConsumerWarpgroups>, cute::_1, cute::_1>>{}));

  static constexpr int kChunkBytes = kChunk * TileK * int(sizeof(Element));
  static constexpr int kStageBytesA = TileM * TileK * int(sizeof(Element));
  static constexpr int kStageBytesB = TileN * TileK * int(sizeof(Element));
  // The operand stages (1024-byte aligned, as swizzled tiles need), then each
  // stage's two barriers.
  static constexpr int kSmemBytes = Stages * (kStageBytesA + kStageBytesB);
  static constexpr int kSmemBarrierBytes = 2 * Stages * 8;
  static constexpr int kSmemLaunchBytes = kSmemBytes + kSmemBarrierBytes;
  // Two CTAs an SM where both fit in its 228 KiB (1 KiB of each is the
  // system's) and have one consumer warpgroup: one CTA's prologue and atomic
  // epilogue run under the other's products. Two CTAs of three warpgroups
  // would leave a thread 80 registers, fewer than a 64 x 128 accumulator
  // tile needs (ptxas refuses).
  static constexpr int kMinCtasPerSm =
      Warps == 8 && 2 * (kSmemLaunchBytes + 1024) <= 228 * 1024 ? 2 : 1;

  // The producer keeps a handful of registers and the consumers take the rest
  // of the CTA's share, as the TMA forward's (fwd_tma_traits.cuh).
  static constexpr int kProducerRegisters = 40;
  static constexpr int kShare = cute::min(65536 / (kMinCtasPerSm * kThreads), 255) / 8 * 8;
  static constexpr int kConsumerRegisters =
      cute::min(256, (kShare * kThreads - 128 * kProducerRegisters) / kConsumerThreads / 8 * 8);
};

}  // namespace ckfmha::kernel
