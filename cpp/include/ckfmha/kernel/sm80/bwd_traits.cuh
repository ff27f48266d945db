// Compile-time configuration of the sm80-path backward kernels (dot_do_o,
// dq_dk_dv, convert_dq): one struct per stage holds every type and constant
// its body uses, so a generated instance is one template argument list.
#pragma once

#include "ckfmha/kernel/common/features.h"
#include "ckfmha/kernel/sm80/fwd_traits.cuh"

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include <type_traits>

namespace ckfmha::kernel {

// The warp grid (warps_m x warps / warps_m) of an M x N product whose warp
// tiles are the most nearly square: an mma.sync warp tile of wm x wn loads
// (wm + wn) * 16 operand elements from shared memory per 16-deep step for
// wm * wn * 16 multiply-adds, so the smallest perimeter moves the fewest bytes.
// Each warp must own whole 16 x 16 steps (the N extent 16 lets one ldmatrix.x4
// feed two 8-wide MMAs).
constexpr int squarest_warps_m(int m, int n, int warps) {
  int best = 0;
  int best_perimeter = 0;
  for (int wm = 1; wm <= warps; ++wm) {
    if (warps % wm != 0) continue;
    int wn = warps / wm;
    if (m % (16 * wm) != 0 || n % (16 * wn) != 0) continue;
    int perimeter = m / wm + n / wn;
    if (best == 0 || perimeter < best_perimeter) {
      best = wm;
      best_perimeter = perimeter;
    }
  }
  return best;
}

template <class Element, int WarpsM, int WarpsN>
struct Sm80WarpGrid {
  static_assert(WarpsM > 0 && WarpsN > 0, "no warp grid tiles this product in 16x16 steps");
  using MmaOp = std::conditional_t<std::is_same_v<Element, cutlass::half_t>,
                                   cute::SM80_16x8x16_F32F16F16F32_TN,
                                   cute::SM80_16x8x16_F32BF16BF16F32_TN>;
  using TiledMma =
      cute::TiledMMA<cute::MMA_Atom<MmaOp>,
                     cute::Layout<cute::Shape<cute::Int<WarpsM>, cute::Int<WarpsN>, cute::_1>>,
                     cute::Tile<cute::Int<16 * WarpsM>, cute::Int<16 * WarpsN>, cute::_16>>;
};

// A (Cols, Rows) view of a (Rows, Cols) shared-memory layout: element (c, r)
// of the view is element (r, c) of the tile. Operands that need the
// transpose read it with ldmatrix.trans.
template <class Layout, int Rows, int Cols>
using TransposedSmem = decltype(cute::composition(
    Layout{},
    cute::make_layout(cute::Shape<cute::Int<Cols>, cute::Int<Rows>>{}, cute::GenRowMajor{})));

// dq_dk_dv: one CTA per key tile of BlockN keys (and KV head, batch); it
// walks query tiles of BlockM rows. Stages: 1 or 2 shared-memory buffers of
// the Q and dO tiles (2: the next tile's loads run under this tile's work).
template <class Element_, int HeadDimQK, int HeadDimV, int BlockM, int BlockN, int Warps,
          int Stages, MaskMode Mask, BiasMode Bias, bool HasDropout, bool HasSoftcap,
          bool HasDbias, bool IsGroupMode, int MinCtasPerSm = 1>
struct BwdSm80Traits {
  using Element = Element_;

  static constexpr int kHeadDimQK = HeadDimQK;
  static constexpr int kHeadDimV = HeadDimV;
  static constexpr int kBlockM = BlockM;
  static constexpr int kBlockN = BlockN;
  static constexpr int kWarps = Warps;
  static constexpr int kThreads = Warps * 32;
  static constexpr int kStages = Stages;
  static constexpr MaskMode kMask = Mask;
  static constexpr BiasMode kBias = Bias;
  static constexpr bool kHasDropout = HasDropout;
  static constexpr bool kHasSoftcap = HasSoftcap;
  static constexpr bool kHasDbias = HasDbias;
  static constexpr bool kIsGroupMode = IsGroupMode;
  static constexpr int kMinCtasPerSm = MinCtasPerSm;

  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                    std::is_same_v<Element, cutlass::bfloat16_t>,
                "the sm80 tensor-core path takes fp16 or bf16 operands");
  static_assert(Stages == 1 || Stages == 2, "Q/dO shared-memory stages are 1 or 2");
  static_assert(!HasDbias || Bias == BiasMode::kElementwise, "dbias needs an elementwise bias");
  static_assert(BlockN % 32 == 0, "P and dS rows are swizzled in 32- or 64-element chunks");

  // Three products, three warp grids:
  //   S = Q K^T and dP = dO V^T       (BlockM x BlockN)
  //   dK += dS^T Q                    (BlockN x HeadDimQK)
  //   dV += P^T dO                    (BlockN x HeadDimV)
  //   dQ = dS K                       (BlockM x HeadDimQK)
  static constexpr int kWarpsMSdP = squarest_warps_m(BlockM, BlockN, Warps);
  static constexpr int kWarpsMdK = squarest_warps_m(BlockN, HeadDimQK, Warps);
  static constexpr int kWarpsMdV = squarest_warps_m(BlockN, HeadDimV, Warps);
  static constexpr int kWarpsMdQ = squarest_warps_m(BlockM, HeadDimQK, Warps);
  template <int WarpsM>
  using Grid = typename Sm80WarpGrid<Element, WarpsM, (WarpsM > 0 ? Warps / WarpsM : 0)>::TiledMma;
  using TiledMmaSdP = Grid<kWarpsMSdP>;
  using TiledMmadK = Grid<kWarpsMdK>;
  using TiledMmadV = Grid<kWarpsMdV>;
  using TiledMmadQ = Grid<kWarpsMdQ>;

  using RowsQK = SmemRows<Element, HeadDimQK, kThreads>;
  using RowsV = SmemRows<Element, HeadDimV, kThreads>;
  using RowsS = SmemRows<Element, BlockN, kThreads>;
  static_assert(BlockM % (kThreads / RowsQK::kThreadsPerRow) == 0 &&
                    BlockM % (kThreads / RowsV::kThreadsPerRow) == 0 &&
                    BlockN % (kThreads / RowsQK::kThreadsPerRow) == 0 &&
                    BlockN % (kThreads / RowsV::kThreadsPerRow) == 0,
                "every tile must be a whole number of the threads' 16-byte load rows");

  using SmemLayoutQ = typename RowsQK::template Layout<BlockM>;
  using SmemLayoutdO = typename RowsV::template Layout<BlockM>;
  using SmemLayoutK = typename RowsQK::template Layout<BlockN>;
  using SmemLayoutV = typename RowsV::template Layout<BlockN>;
  using SmemLayoutS = typename RowsS::template Layout<BlockM>;  // P and dS
  using SmemLayoutQt = TransposedSmem<SmemLayoutQ, BlockM, HeadDimQK>;
  using SmemLayoutdOt = TransposedSmem<SmemLayoutdO, BlockM, HeadDimV>;
  using SmemLayoutKt = TransposedSmem<SmemLayoutK, BlockN, HeadDimQK>;
  using SmemLayoutSt = TransposedSmem<SmemLayoutS, BlockM, BlockN>;

  static constexpr int kSmemQElems = int(cute::cosize_v<SmemLayoutQ>);
  static constexpr int kSmemdOElems = int(cute::cosize_v<SmemLayoutdO>);
  static constexpr int kSmemKElems = int(cute::cosize_v<SmemLayoutK>);
  static constexpr int kSmemVElems = int(cute::cosize_v<SmemLayoutV>);
  static constexpr int kSmemSElems = int(cute::cosize_v<SmemLayoutS>);
  // Q and dO stages, then K, V, P and dS. dK and dV are staged over K and V.
  static constexpr int kSmemBytes =
      (Stages * (kSmemQElems + kSmemdOElems) + kSmemKElems + kSmemVElems + 2 * kSmemSElems) *
      int(sizeof(Element));

  using SmemLoadAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>;
  using SmemLoadAtomTransposed = cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, Element>;
  using SmemStoreAtom = cute::Copy_Atom<cute::UniversalCopy<uint32_t>, Element>;
};

// dot_do_o and convert_dq: row-wise passes with 16-byte vectors; BlockM rows
// per CTA, each row spread over a group of lanes.
template <class Element_, int HeadDim, int BlockM, int Warps, bool IsGroupMode>
struct BwdRowwiseTraits {
  using Element = Element_;
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kBlockM = BlockM;
  static constexpr int kThreads = Warps * 32;
  static constexpr bool kIsGroupMode = IsGroupMode;
  static constexpr int kVecElems = 16 / int(sizeof(Element));
  static constexpr int kVecsPerRow = HeadDim / kVecElems;
  // Lanes sharing one row: the largest power of two up to 8 that divides the
  // row's vectors, so a row's partial sums reduce with at most three shuffles.
  static constexpr int kLanesPerRow = kVecsPerRow % 8 == 0 ? 8 : kVecsPerRow % 4 == 0 ? 4 : 2;
  static constexpr int kRowsPerPass = kThreads / kLanesPerRow;
  static_assert(HeadDim % (2 * kVecElems) == 0, "head dims are multiples of 32");
  static_assert(kVecsPerRow % kLanesPerRow == 0, "lanes split a row's vectors evenly");
};

}  // namespace ckfmha::kernel
