// What both consumer layouts of the Hopper backward main stage (bwd_dq_dk_dv
// on TMA + wgmma, warp-specialized) share: the feature scope, a producer
// warpgroup and two consumer warpgroups with their register split, K and V
// and the two-stage Q/dO ring in shared memory with their TMA copies, and
// the ring's barriers. The layouts: bwd_traits.cuh (keys split across
// the warpgroups, d64, d96 and d128) and bwd_head_split_traits.cuh (d256
// and d192x128).
#pragma once

#include "ckfmha/kernel/common/features.h"
#include "ckfmha/kernel/common/shared_storage.cuh"  // SharedStore64
#include "ckfmha/kernel/sm90/fwd_traits.cuh"  // GmmaRowMajorAtom

#include <cute/arch/copy_sm90.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/atom/copy_traits_sm90.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
// wgmma's shapes beyond CuTe's default set (64x48x16 for d96's dQ halves).
#include <cute/arch/mma_sm90_gmma_ext.hpp>
#include <cute/atom/mma_traits_sm90_gmma_ext.hpp>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include <cstdint>
#include <type_traits>

namespace ckfmha::kernel {

// A (Cols, Rows, ...) view of a (Rows, Cols, ...) shared-memory layout: the
// same bytes seen with the two first modes swapped, as a wgmma operand that
// reads the tile MN-major.
template <class Layout, int Rows, int Cols>
using GmmaTransposed = decltype(cute::composition(
    Layout{}, cute::make_ordered_layout(cute::Shape<cute::Int<Cols>, cute::Int<Rows>>{},
                                        cute::Step<cute::_2, cute::_1>{})));
template <class Layout, int Rows, int Cols, int Stages>
using GmmaTransposedStages = decltype(cute::composition(
    Layout{},
    cute::make_ordered_layout(cute::Shape<cute::Int<Cols>, cute::Int<Rows>, cute::Int<Stages>>{},
                              cute::Step<cute::_2, cute::_1, cute::_3>{})));

// A wgmma op whose one instruction spans all `Cols` columns of a warpgroup's
// share of a product split along N between the warpgroups. CuTe's selector
// takes 48 columns only with its extended shapes enabled, and otherwise picks
// 16: with two warpgroups along N the tiled product would then deal the
// columns out 16 at a time (warpgroup 0: 0-15, 32-47, 64-79), while the
// staging and the reduce-adds take each warpgroup's columns as one
// contiguous half.
template <class Element, int Rows, int Cols, int Depth, cute::GMMA::Major MajorA,
          cute::GMMA::Major MajorB>
constexpr auto gmma_ss_op_whole_cols() {
  if constexpr (Cols == 48 && std::is_same_v<Element, cutlass::bfloat16_t>) {
    return cute::SM90::GMMA::MMA_64x48x16_F32BF16BF16_SS<MajorA, MajorB>{};
  } else if constexpr (Cols == 48) {
    return cute::SM90::GMMA::MMA_64x48x16_F32F16F16_SS<MajorA, MajorB>{};
  } else {
    return cute::GMMA::ss_op_selector<
        Element, Element, float, cute::Shape<cute::Int<Rows>, cute::Int<Cols>, cute::Int<Depth>>,
        MajorA, MajorB>();
  }
}
template <class Element, int Rows, int Cols, int Depth,
          cute::GMMA::Major MajorA = cute::GMMA::Major::K,
          cute::GMMA::Major MajorB = cute::GMMA::Major::K>
using GmmaSsOpWholeCols =
    decltype(gmma_ss_op_whole_cols<Element, Rows, Cols, Depth, MajorA, MajorB>());

// Whether each warpgroup of a product tiled along N owns one contiguous run
// of `Cols` columns: its atom is that wide.
template <class TiledMma, int Cols>
inline constexpr bool kAtomSpansCols =
    int(cute::size<1>(typename TiledMma::AtomShape_MNK{})) == Cols;

// The parameter list is the sm80 backward's, so the generator writes every
// backward instance alike; what these templates do not implement is
// rejected by the generator's rules and asserted here. `SplitsHeadDim`:
// the layout splits the head dims of dK, dV and dQ between the consumer
// warpgroups, so each warpgroup reads half of Q's and dO's columns as an
// MN-major operand.
template <class Element_, int HeadDimQK, int HeadDimV, int BlockM, int BlockN, int Warps,
          int Stages, MaskMode Mask, BiasMode Bias, bool HasDropout, bool HasSoftcap,
          bool HasDbias, bool IsGroupMode, int MinCtasPerSm, bool SplitsHeadDim>
struct BwdSm90TraitsBase {
  using Element = Element_;
  static_assert(!HasDbias,
                "the sm90 backward covers masks, windows, GQA, ALiBi, soft-caps, dropout and a "
                "bias broadcast over the query rows, without its gradient");
  static_assert(MinCtasPerSm == 1, "one warp-specialized CTA fills an SM");
  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                    std::is_same_v<Element, cutlass::bfloat16_t>,
                "wgmma takes fp16 or bf16 operands here");
  static_assert(HeadDimQK % 32 == 0 && HeadDimV % 32 == 0, "head dims are multiples of 32");

  static constexpr int kHeadDim = HeadDimQK;  // Q, K, dQ and dK
  static constexpr int kHeadDimV = HeadDimV;  // V, dO and dV
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kBlockM = BlockM;
  static constexpr int kBlockN = BlockN;
  static_assert(BlockM == 64, "64 query rows per step: one wgmma's rows of dQ");
  static_assert(Warps == 4 * (1 + kConsumerWarpgroups),
                "a producer warpgroup and two consumer warpgroups");
  static_assert(Stages == 2, "the Q/dO ring has two stages");
  static constexpr int kStages = Stages;
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kThreads = 128 + kConsumerThreads;  // producer warpgroup first
  static constexpr MaskMode kMask = Mask;
  static constexpr bool kIsGroupMode = IsGroupMode;
  static constexpr BiasMode kBias = Bias;
  // An elementwise bias is read as one value a key (BwdSm90KeyBias): it must be
  // broadcast over the query rows, which the launcher checks.
  static constexpr bool kBiasRowsOnly = Bias == BiasMode::kElementwise;
  static constexpr bool kHasSoftcap = HasSoftcap;
  static constexpr bool kHasDropout = HasDropout;
  // Dropout's random words (bwd_dropout.cuh): a tile per consumer warpgroup
  // of 16 words per query row, in the dynamic shared memory right after the
  // layout's storage struct (whose size is a whole number of KiB), so that
  // kernels without dropout keep their layout.
  static constexpr int kDropoutQueries = BlockM / (SplitsHeadDim ? kConsumerWarpgroups : 1);
  static constexpr int kDropoutBytes =
      HasDropout ? kConsumerWarpgroups * kDropoutQueries * 16 * int(sizeof(uint32_t)) : 0;
  template <class Storage>
  __device__ __forceinline__ static uint32_t* dropout_words(Storage* storage, int warpgroup) {
    return reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(storage) + sizeof(Storage)) +
           warpgroup * kDropoutQueries * 16;
  }
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  static_assert(kProducerRegisters * 128 + kConsumerRegisters * kConsumerThreads <= 65536,
                "the register split must fit the SM's register file");

  using D = cute::Int<kHeadDim>;
  using DV = cute::Int<kHeadDimV>;
  using M = cute::Int<kBlockM>;
  using N = cute::Int<kBlockN>;
  using AtomAlongN = cute::Layout<cute::Shape<cute::_1, cute::Int<kConsumerWarpgroups>, cute::_1>>;

  // K and V: the swizzle atom is at most half a row wide, so that each
  // warpgroup's half of K^T's columns (dQ's B) is whole atoms.
  using SmemLayoutK = decltype(cute::tile_to_shape(
      GmmaRowMajorAtom<Element, kHeadDim / kConsumerWarpgroups>{}, cute::Shape<N, D>{}));
  using SmemLayoutKt = GmmaTransposed<SmemLayoutK, kBlockN, kHeadDim>;  // (d, keys)
  using SmemLayoutV = decltype(cute::tile_to_shape(
      GmmaRowMajorAtom<Element, kHeadDimV / kConsumerWarpgroups>{}, cute::Shape<N, DV>{}));
  // Q and dO: with the head dim split, each warpgroup's half of the columns
  // (an MN-major operand of dK or dV) is whole atoms.
  static constexpr int kOperandSplit = SplitsHeadDim ? kConsumerWarpgroups : 1;
  using SmemLayoutQ =
      decltype(cute::tile_to_shape(GmmaRowMajorAtom<Element, kHeadDim / kOperandSplit>{},
                                   cute::Shape<M, D, cute::Int<Stages>>{}));
  using SmemLayoutQt = GmmaTransposedStages<SmemLayoutQ, kBlockM, kHeadDim, Stages>;
  using SmemLayoutdO =
      decltype(cute::tile_to_shape(GmmaRowMajorAtom<Element, kHeadDimV / kOperandSplit>{},
                                   cute::Shape<M, DV, cute::Int<Stages>>{}));
  using SmemLayoutdOt = GmmaTransposedStages<SmemLayoutdO, kBlockM, kHeadDimV, Stages>;
  // (keys, queries) tiles that leave the registers for shared memory (dS^T,
  // and P^T at d256), queries contiguous, two buffers each: one query
  // tile's is written while the other warpgroup may still read the
  // previous one's.
  using SmemLayoutKeysQueries = decltype(cute::tile_to_shape(
      GmmaRowMajorAtom<Element, kBlockM>{}, cute::Shape<N, M, cute::_2>{}));
  using SmemLayoutQueriesKeys =
      GmmaTransposedStages<SmemLayoutKeysQueries, kBlockN, kBlockM, 2>;  // (q, keys)
  // stmatrix: a warp stores four 8x8 blocks of 16-bit values from the
  // accumulator's own register layout, one instruction per 16 bytes of a
  // thread's values.
  using SmemStoreAtomKeysQueries = cute::Copy_Atom<cute::SM90_U32x4_STSM_N, Element>;

  // Global views the TMA descriptors are built from: (rows, head dim, heads,
  // batch) with 64-bit strides and a unit head-dim stride.
  using GmemStride = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;
  using GmemTensor = decltype(cute::make_tensor(
      cute::make_gmem_ptr(static_cast<Element const*>(nullptr)),
      cute::Shape<int, int, int, int>{}, GmemStride{}));
  using TmaQ = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensor{},
                                            cute::take<0, 2>(SmemLayoutQ{}),
                                            cute::Shape<M, D>{}, cute::_1{}));
  using TmaDo = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensor{},
                                             cute::take<0, 2>(SmemLayoutdO{}),
                                             cute::Shape<M, DV>{}, cute::_1{}));
  using TmaK = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutK{},
                                            cute::Shape<N, D>{}, cute::_1{}));
  using TmaV = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutV{},
                                            cute::Shape<N, DV>{}, cute::_1{}));

  // The fp32 accumulator as (rows, head dim, batch x heads), rows padded to
  // whole 64-row blocks per head (params/bwd_workspace.h).
  using DqGmemTensor = decltype(cute::make_tensor(
      cute::make_gmem_ptr(static_cast<float*>(nullptr)), cute::Shape<int, int, int>{},
      cute::Stride<int64_t, cute::_1, int64_t>{}));
  // A TMA reduce-add of one staged fp32 dQ box into it; each layout names
  // its box (DqBox) and the box's shared-memory layout (SmemLayoutdQBox).
  template <class SmemLayoutBox, class Box>
  using TmaDqFor = decltype(cute::make_tma_copy(cute::SM90_TMA_REDUCE_ADD{}, DqGmemTensor{},
                                                SmemLayoutBox{}, Box{}, cute::_1{}));
  // Register-to-shared stores of the fp32 dQ accumulator's column pairs.
  using SmemStoreAtomdQ = cute::Copy_Atom<SharedStore64, float>;

  // A query tile's Q and dO, and the CTA's K and V.
  static constexpr int kTmaBytesQdO = kBlockM * (kHeadDim + kHeadDimV) * int(sizeof(Element));
  static constexpr int kTmaBytesKV = kBlockN * (kHeadDim + kHeadDimV) * int(sizeof(Element));
  // A query tile's LSE (log2 domain) and D rows, bulk-copied with Q and dO.
  static constexpr int kBulkBytesRows = kBlockM * int(sizeof(float));

  struct Barriers {
    uint64_t kv_full;
    uint64_t q_full[Stages];   // Q and dO of a query tile landed
    uint64_t q_empty[Stages];  // both consumer warpgroups are done with them
    // A consumer warpgroup's dQ half is staged (its 128 threads), and the
    // reduce-add of it has read the staging buffer (the dQ thread). Used by
    // the key-split layout, whose dQ reduce-adds leave from the producer
    // warpgroup.
    uint64_t dq_full[kConsumerWarpgroups];
    uint64_t dq_empty[kConsumerWarpgroups];
  };
  // The tiles every layout keeps in shared memory, each a multiple of 1 KiB
  // (swizzled GMMA/TMA tiles need 1024-byte alignment); a layout's storage
  // adds its own tiles, then each stage's LSE (log2 domain) and D rows (read
  // where used instead of held in registers) and the barriers.
  struct TileStorage {
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutV>> v;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutdO>> dout;
  };
};

}  // namespace ckfmha::kernel
