// Compile-time configuration of the grouped-convolution backward-weight
// kernel on sm_90a: the sm80 kernel's gathers (bwd_weight_loader.cuh) feeding
// wgmma. Both operands are read along their channels (dy's K, x's C), the
// GEMM's M and N, so their shared-memory tiles are M- and N-major, which
// wgmma reads as they are for 16-bit types (no transposing copy). Warpgroups
// stack along the output channels, 64 each.
#pragma once

#include "ckfmha/kernel/conv/gather.cuh"

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include <type_traits>

namespace ckfmha::kernel {

template <class Element_, int SpatialDims, int Vector, int TileM, int TileN, int TileK, int Warps,
          int Stages>
struct ConvBwdWeightSm90Traits {
  using Element = Element_;
  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                    std::is_same_v<Element, cutlass::bfloat16_t>,
                "wgmma reads MN-major operands of fp16 or bf16");
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
  static constexpr int kWarpgroups = Warps / 4;
  static_assert(Warps % 4 == 0 && kWarpgroups >= 1 && kWarpgroups <= 2, "1 or 2 warpgroups");
  static_assert(TileM == 64 * kWarpgroups, "each warpgroup owns one 64-channel wgmma tile");
  // The shared-memory atom is 64 channels wide (128 bytes).
  static_assert(TileN % 64 == 0 && TileN <= 256, "64 to 256 taps x channels (wgmma N)");
  static_assert(TileK == 32 || TileK == 64, "reduction steps of 32 or 64 positions");
  static_assert(Stages >= 3 && Stages <= 8, "3 to 8 shared-memory stages");
  // Loads run kStages - 1 tiles ahead: each k-tile's batch is waited for
  // before the next barrier, so only the stage being computed is not loading.
  static constexpr int kLoadsAhead = Stages - 1;

  // 64 channels x 8 positions, 128-byte rows swizzled: the layout a
  // channel-major wgmma operand takes.
  using SmemAtom = cute::GMMA::Layout_MN_SW128_Atom<Element>;
  using SmemLayoutA = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<TileM>, cute::Int<TileK>, cute::Int<Stages>>{}));
  using SmemLayoutB = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<TileN>, cute::Int<TileK>, cute::Int<Stages>>{}));
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, cute::Int<TileN>, cute::Int<TileK>>,
                                 cute::GMMA::Major::MN, cute::GMMA::Major::MN>(),
      cute::Layout<cute::Shape<cute::Int<kWarpgroups>, cute::_1, cute::_1>>{}));

  // The operand stages (1024-byte aligned, as swizzled wgmma tiles need),
  // then two slots of the positions table (one filled while the other's tile
  // is issued).
  static constexpr int kSmemBytes = Stages * (TileM + TileN) * TileK * int(sizeof(Element));
  static constexpr int kSmemTableBytes = 2 * TileK * int(sizeof(ConvRow));
  static constexpr int kSmemLaunchBytes = kSmemBytes + kSmemTableBytes;
  // Two CTAs an SM where their shared memory fits (ptxas then holds each
  // thread to 64K / (2 * kThreads) registers): one CTA's position tables,
  // split prologue and atomic epilogue run under the other's products.
  static constexpr int kMinCtasPerSm = 2 * kSmemLaunchBytes <= 220 * 1024 ? 2 : 1;
};

}  // namespace ckfmha::kernel
