// Compile-time configuration of the Hopper backward main stage at head dims
// 256 and 192x128 (q/k x v), where one warpgroup cannot hold dK and dV of 64
// keys (2 x 64 x 256 fp32 is 256 registers a thread at d256): both consumer
// warpgroups share the CTA's 64 keys and split the head dims of dK, dV and
// dQ between them (half of the columns each), and the queries of S^T and
// dP^T (32 of the 64 each). P^T and dS^T pass through shared memory, so
// every product reads both operands from there. The producer warpgroup and
// the Q/dO ring are as at d <= 128 (bwd_traits_base.cuh).
#pragma once

#include "ckfmha/kernel/sm90/bwd_traits_base.cuh"

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include <cstddef>
#include <type_traits>

namespace ckfmha::kernel {

template <class Element_, int HeadDimQK, int HeadDimV, int BlockM, int BlockN, int Warps,
          int Stages, MaskMode Mask, BiasMode Bias, bool HasDropout, bool HasSoftcap,
          bool HasDbias, bool IsGroupMode, int MinCtasPerSm = 1>
struct BwdSm90HeadSplitTraits
    : BwdSm90TraitsBase<Element_, HeadDimQK, HeadDimV, BlockM, BlockN, Warps, Stages, Mask, Bias,
                        HasDropout, HasSoftcap, HasDbias, IsGroupMode, MinCtasPerSm, true> {
  using Base = BwdSm90TraitsBase<Element_, HeadDimQK, HeadDimV, BlockM, BlockN, Warps, Stages,
                                 Mask, Bias, HasDropout, HasSoftcap, HasDbias, IsGroupMode,
                                 MinCtasPerSm, true>;
  using typename Base::AtomAlongN;
  using typename Base::D;
  using typename Base::DV;
  using typename Base::Element;
  using typename Base::M;
  using typename Base::N;
  using Base::kBlockM;
  using Base::kConsumerWarpgroups;
  using Base::kHeadDim;
  using Base::kHeadDimV;
  static_assert((HeadDimQK == 256 && HeadDimV == 256) || (HeadDimQK == 192 && HeadDimV == 128),
                "head dims 256 and 192x128");
  static_assert(BlockN == 64, "64 keys, one wgmma's rows, shared by both consumer warpgroups");
  static constexpr bool kSplitsHeadDim = true;
  static constexpr int kColsPerWarpgroup = kHeadDim / kConsumerWarpgroups;    // dK and dQ
  static constexpr int kColsPerWarpgroupV = kHeadDimV / kConsumerWarpgroups;  // dV
  static constexpr int kQueriesPerWarpgroup = kBlockM / kConsumerWarpgroups;

  // Keys on M for S^T, dP^T, dK and dV, as at d <= 128:
  //   S^T = K Q^T, dP^T = V dO^T   (64 keys x 64 queries; warpgroup w takes
  //                                 queries [32w, 32w + 32))
  //   dV += P^T dO, dK += dS^T Q   (64 keys x d; warpgroup w takes half of
  //                                 the columns; P^T, dS^T from shared memory,
  //                                 dO and Q read MN-major)
  //   dQ = dS K                    (64 queries x d, split the same way)
  // (The products' K extent only picks the instruction: one TiledMma serves
  // S^T over d_qk and dP^T over d_v.)
  using TiledMmaSdP = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<N, cute::Int<kQueriesPerWarpgroup>, D>>(),
      AtomAlongN{}));
  using TiledMmadK = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<N, cute::Int<kColsPerWarpgroup>, M>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>(),
      AtomAlongN{}));
  using TiledMmadV = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<N, cute::Int<kColsPerWarpgroupV>, M>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>(),
      AtomAlongN{}));
  using TiledMmadQ = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<M, cute::Int<kColsPerWarpgroup>, N>,
                                 cute::GMMA::Major::MN, cute::GMMA::Major::MN>(),
      AtomAlongN{}));
  // Each warpgroup's queries and columns are one contiguous run, as the dS^T
  // hand-off, the dQ pieces and the dK/dV epilogue take them.
  static_assert(kAtomSpansCols<TiledMmaSdP, kQueriesPerWarpgroup> &&
                    kAtomSpansCols<TiledMmadK, kColsPerWarpgroup> &&
                    kAtomSpansCols<TiledMmadV, kColsPerWarpgroupV> &&
                    kAtomSpansCols<TiledMmadQ, kColsPerWarpgroup>,
                "one wgmma spans each warpgroup's share of every product");

  // P^T and dS^T (keys, queries); dS^T also as (queries, keys) for dQ.
  using SmemLayoutPt = typename Base::SmemLayoutKeysQueries;
  using SmemLayoutdSt = typename Base::SmemLayoutQueriesKeys;
  using SmemStoreAtomPt = typename Base::SmemStoreAtomKeysQueries;

  // dQ leaves through TMA reduce-adds of (64, 64) fp32 pieces at d256 and
  // (64, 32) at d192x128 (DqBox), kDqPieces per warpgroup.
  static constexpr int kDqPieceCols = kHeadDim == kHeadDimV ? 64 : 32;
  static constexpr int kDqPieces = kColsPerWarpgroup / kDqPieceCols;
  using DqBox = cute::Shape<M, cute::Int<kDqPieceCols>>;
  using SmemLayoutdQBox =
      decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<float>{}, DqBox{}));
  // Where a stage's dQ is staged. At d256 a tile of its own (64 x 256 fp32,
  // 64 KiB) would not fit beside the ring, so each warpgroup stages its 128
  // columns in the bytes of the query tile's stage that only it reads once
  // the tile's products are done: columns [128w, 128w + 128) of Q (dK's B)
  // and of dO (dV's B), 16 KiB in each, one piece in each. At d192x128 those
  // bytes (12 + 8 KiB) hold less than a warpgroup's 24 KiB of dQ, and a tile
  // of its own (48 KiB) fits: one for both stages.
  static constexpr bool kDqInRing = kHeadDim == kHeadDimV;
  static_assert(!kDqInRing || cute::cosize_v<SmemLayoutdQBox> * sizeof(float) ==
                                  kBlockM * kColsPerWarpgroup * sizeof(Element),
                "a piece fills a warpgroup's columns of a Q or dO stage");
  // Where the pieces lie in the ring, in floats from the Q ring's start: a
  // warpgroup's columns of a stage are one contiguous run of each tile, and
  // dO's ring follows Q's.
  using SmemLayoutQ = typename Base::SmemLayoutQ;
  static_assert(SmemLayoutQ{}(cute::_0{}, cute::Int<kColsPerWarpgroup>{}, cute::_0{}) ==
                        kBlockM * kColsPerWarpgroup &&
                    SmemLayoutQ{}(cute::_0{}, cute::_0{}, cute::_1{}) == kBlockM * kHeadDim,
                "Q's stages and each stage's column halves are contiguous runs");
  static constexpr int kFloatsPerElement = int(sizeof(float) / sizeof(Element));
  static constexpr int kDqRingStride = cute::cosize_v<SmemLayoutQ> / kFloatsPerElement;  // Q to dO
  static constexpr int kDqWarpgroupStride = kBlockM * kColsPerWarpgroup / kFloatsPerElement;
  static constexpr int kDqStageStride = kBlockM * kHeadDim / kFloatsPerElement;
  // A stage's (64, 256) dQ tile over its ring pieces: column 128w + 64h + j
  // is column j of warpgroup w's piece h; the swizzle repeats every 1 KiB,
  // so it applies to each piece alike.
  using DqBoxCols = decltype(SmemLayoutdQBox{}.layout_b());
  using SmemLayoutdQStages = decltype(cute::make_composed_layout(
      SmemLayoutdQBox{}.layout_a(), SmemLayoutdQBox{}.offset(),
      cute::make_layout(
          cute::make_shape(cute::get<0>(DqBoxCols{}.shape()),
                           cute::make_shape(cute::get<1>(DqBoxCols{}.shape()), cute::_2{},
                                            cute::Int<kConsumerWarpgroups>{}),
                           cute::Int<Stages>{}),
          cute::make_stride(cute::get<0>(DqBoxCols{}.stride()),
                            cute::make_stride(cute::get<1>(DqBoxCols{}.stride()),
                                              cute::Int<kDqRingStride>{},
                                              cute::Int<kDqWarpgroupStride>{}),
                            cute::Int<kDqStageStride>{}))));
  // The staging tile of its own (d192x128): (64, d) in pieces of 32
  // columns, atoms column-major, so warpgroup w's piece h is the
  // (kDqPieces * w + h)-th contiguous run.
  using SmemLayoutdQTile = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<float>{},
                                                        cute::Shape<M, D>{}));
  using TmaDq = typename Base::template TmaDqFor<SmemLayoutdQBox, DqBox>;

  struct SharedStorageRing : Base::TileStorage {
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutPt>> pt;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutPt>> ds;
    alignas(16) float lse_log2[Stages][kBlockM];
    alignas(16) float delta[Stages][kBlockM];
    typename Base::Barriers bar;
  };
  struct SharedStorageTile : Base::TileStorage {
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutPt>> pt;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutPt>> ds;
    alignas(1024) cute::array_aligned<float, cute::cosize_v<SmemLayoutdQTile>> dq;
    alignas(16) float lse_log2[Stages][kBlockM];
    alignas(16) float delta[Stages][kBlockM];
    typename Base::Barriers bar;
  };
  using SharedStorage = std::conditional_t<kDqInRing, SharedStorageRing, SharedStorageTile>;
  // The ring's dQ pieces count on dO's ring right after Q's.
  static_assert(offsetof(typename Base::TileStorage, dout) ==
                    offsetof(typename Base::TileStorage, q) + kDqRingStride * sizeof(float),
                "dO's ring follows Q's");
  // Dynamic shared memory is only 16-byte aligned: one extra KiB lets the
  // kernel round its base up to 1024.
  static constexpr int kSmemBytes = int(sizeof(SharedStorage)) + Base::kDropoutBytes + 1024;
  static_assert(kSmemBytes <= 227 * 1024,
                "K, V, the Q/dO ring, P^T, dS^T and the dQ staging must fit shared memory");
};

}  // namespace ckfmha::kernel
