// Compile-time configuration of the sm80-path forward kernel: one struct holds
// every type and constant the kernel body uses, so a generated instance is a
// single template argument list.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include <type_traits>

namespace ckfmha::kernel {

template <class Element_, int HeadDim, int BlockM, int BlockN, int Warps, int Stages, bool IsCausal,
          bool HasLse>
struct FwdSm80Traits {
  using Element = Element_;
  using Accum = float;

  static constexpr int kHeadDim = HeadDim;
  static constexpr int kBlockM = BlockM;
  static constexpr int kBlockN = BlockN;
  static constexpr int kWarps = Warps;
  static constexpr int kThreads = Warps * 32;
  static constexpr int kStages = Stages;
  static constexpr bool kIsCausal = IsCausal;
  static constexpr bool kHasLse = HasLse;

  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                    std::is_same_v<Element, cutlass::bfloat16_t>,
                "the sm80 tensor-core path takes fp16 or bf16 operands");
  static_assert(Stages == 1, "K and V are single-buffered; the next tile loads under the softmax");
  static_assert(HeadDim % 32 == 0, "head dim must be a multiple of 32 (swizzled 64-byte rows)");
  static_assert(BlockM % (16 * Warps) == 0, "each warp owns whole 16-row MMA slices");
  static_assert(BlockN % 16 == 0, "key tiles are consumed 16 columns at a time");

  // Warps stack along M; the N extent of 16 lets one ldmatrix.x4 feed two
  // 8-wide MMAs with B, and makes pairs of S accumulators line up with one
  // 16-wide K step of the P*V product.
  using MmaOp = std::conditional_t<std::is_same_v<Element, cutlass::half_t>,
                                   cute::SM80_16x8x16_F32F16F16F32_TN,
                                   cute::SM80_16x8x16_F32BF16BF16F32_TN>;
  using TiledMma = cute::TiledMMA<cute::MMA_Atom<MmaOp>,
                                  cute::Layout<cute::Shape<cute::Int<Warps>, cute::_1, cute::_1>>,
                                  cute::Tile<cute::Int<16 * Warps>, cute::_16, cute::_16>>;

  // Shared memory rows are stored in 64- or 32-element chunks XOR-swizzled at
  // 16-byte granularity so that ldmatrix (8 rows x 16 B) hits 8 distinct banks.
  static constexpr int kSmemChunk = HeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzleBits = kSmemChunk == 64 ? 3 : 2;
  using SmemAtom = decltype(cute::composition(
      cute::Swizzle<kSwizzleBits, 3, 3>{},
      cute::Layout<cute::Shape<cute::_8, cute::Int<kSmemChunk>>,
                   cute::Stride<cute::Int<kSmemChunk>, cute::_1>>{}));
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<BlockM>, cute::Int<HeadDim>>{}));
  using SmemLayoutKV = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<BlockN>, cute::Int<HeadDim>>{}));
  // V seen as (HeadDim, BlockN) over the same bytes: the B operand of O += P V.
  using SmemLayoutVt = decltype(cute::composition(
      SmemLayoutKV{},
      cute::make_layout(cute::Shape<cute::Int<HeadDim>, cute::Int<BlockN>>{}, cute::GenRowMajor{})));

  static constexpr int kSmemQBytes = int(cute::cosize_v<SmemLayoutQ>) * int(sizeof(Element));
  static constexpr int kSmemKVBytes = int(cute::cosize_v<SmemLayoutKV>) * int(sizeof(Element));
  static constexpr int kSmemBytes = kSmemQBytes + 2 * kSmemKVBytes;

  // Global loads: 16 bytes per thread per copy, whole chunks per row.
  static constexpr int kVecElems = 16 / int(sizeof(Element));
  static constexpr int kThreadsPerRow = kSmemChunk / kVecElems;
  static_assert(kThreads % kThreadsPerRow == 0, "threads must tile the chunk width");
  using GmemThreadLayout =
      cute::Layout<cute::Shape<cute::Int<kThreads / kThreadsPerRow>, cute::Int<kThreadsPerRow>>,
                   cute::Stride<cute::Int<kThreadsPerRow>, cute::_1>>;
  using GmemValueLayout = cute::Layout<cute::Shape<cute::_1, cute::Int<kVecElems>>>;
  using GmemLoad = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{},
      GmemThreadLayout{}, GmemValueLayout{}));
  using GmemStore = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::UniversalCopy<cute::uint128_t>, Element>{}, GmemThreadLayout{},
      GmemValueLayout{}));

  using SmemLoadAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>;
  using SmemLoadAtomTransposed = cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, Element>;
  using SmemStoreAtom = cute::Copy_Atom<cute::UniversalCopy<uint32_t>, Element>;
};

}  // namespace ckfmha::kernel
