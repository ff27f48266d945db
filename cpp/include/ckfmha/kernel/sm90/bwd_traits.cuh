// Compile-time configuration of the Hopper backward main stage (bwd_dq_dk_dv
// on TMA + wgmma, warp-specialized) at head dims 64, 96 and 128: one producer
// warpgroup streams K and V once and then the query tiles' Q and dO through
// a two-stage ring; two consumer warpgroups own 64 of the CTA's 128 keys
// each and run all five products on the tensor cores. (Head dim 256 splits
// the head dim instead: bwd_head_split_traits.cuh.)
#pragma once

#include "ckfmha/kernel/sm90/bwd_traits_base.cuh"

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include <cstdint>
#include <type_traits>

namespace ckfmha::kernel {

template <class Element_, int HeadDimQK, int HeadDimV, int BlockM, int BlockN, int Warps,
          int Stages, MaskMode Mask, BiasMode Bias, bool HasDropout, bool HasSoftcap,
          bool HasDbias, bool IsGroupMode, int MinCtasPerSm = 1>
struct BwdSm90KeySplitTraits
    : BwdSm90TraitsBase<Element_, HeadDimQK, HeadDimV, BlockM, BlockN, Warps, Stages, Mask, Bias,
                        HasDropout, HasSoftcap, HasDbias, IsGroupMode, MinCtasPerSm, false> {
  using Base = BwdSm90TraitsBase<Element_, HeadDimQK, HeadDimV, BlockM, BlockN, Warps, Stages,
                                 Mask, Bias, HasDropout, HasSoftcap, HasDbias, IsGroupMode,
                                 MinCtasPerSm, false>;
  using typename Base::D;
  using typename Base::Element;
  using typename Base::M;
  using typename Base::N;
  using Base::kBlockM;
  using Base::kConsumerWarpgroups;
  using Base::kHeadDim;
  static_assert(HeadDimQK == 64 || HeadDimQK == 96 || HeadDimQK == 128, "head dims 64, 96 and 128");
  static_assert(HeadDimQK == HeadDimV, "one head dim for Q, K and V");
  static constexpr bool kSplitsHeadDim = false;
  // A wgmma covers 64 rows: each consumer warpgroup owns 64 keys.
  static_assert(BlockN == 64 * kConsumerWarpgroups, "128 keys over two consumer warpgroups");
  // Issue the next query tile's S^T and dP^T behind this tile's dQ (dK
  // then goes in before the dS^T barrier): their fp32 accumulators live
  // beside dK, dV and dQ, which fits the consumers' registers at d64 only.
  static constexpr bool kOverlapQueryTiles = kHeadDim <= 64;
  using AtomAlongM = cute::Layout<cute::Shape<cute::Int<kConsumerWarpgroups>, cute::_1, cute::_1>>;
  using typename Base::AtomAlongN;

  // Keys on M throughout, so each warpgroup's scores, dK and dV are its own
  // 64 keys' and P^T, dS^T pass from accumulator to A operand in registers:
  //   S^T = K Q^T, dP^T = V dO^T        (128 keys x 64 queries, K and V as A)
  //   dV += P^T dO, dK += dS^T Q         (128 keys x d, P^T and dS^T from registers;
  //                                       dO, Q read MN-major as B)
  // dQ = dS K needs every key: dS^T goes through shared memory and each
  // warpgroup computes half of dQ's columns over all 128 keys.
  using TiledMmaSdP = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, cute::Shape<cute::_64, M, D>>(),
      AtomAlongM{}));
  using TiledMmadKV = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, cute::Shape<cute::_64, D, M>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>(),
      AtomAlongM{}));
  using TiledMmadQ = decltype(cute::make_tiled_mma(
      GmmaSsOpWholeCols<Element, kBlockM, kHeadDim / kConsumerWarpgroups, BlockN,
                        cute::GMMA::Major::MN, cute::GMMA::Major::MN>{},
      AtomAlongN{}));

  // dS^T (keys, queries) and its (queries, keys) view for dQ's A operand.
  using SmemLayoutdS = typename Base::SmemLayoutKeysQueries;
  using SmemLayoutdSt = typename Base::SmemLayoutQueriesKeys;
  using SmemStoreAtomdS = typename Base::SmemStoreAtomKeysQueries;

  // The dQ tile in fp32, staged for one TMA reduce-add per warpgroup: each
  // warpgroup's half of the columns is its own (64, d/2) tile of 128-byte
  // swizzled rows, so the accumulator's column pairs store without bank
  // conflicts and each half is one contiguous TMA source.
  // At d96 a half is 48 columns, not whole 32-float (128-byte) swizzle
  // atoms: it takes 16-float (64-byte) atoms instead.
  static constexpr int kDqColsPerWarpgroup = kHeadDim / kConsumerWarpgroups;
  using DqAtom = std::conditional_t<kDqColsPerWarpgroup % 32 == 0,
                                    cute::GMMA::Layout_K_SW128_Atom<float>,
                                    cute::GMMA::Layout_K_SW64_Atom<float>>;
  using DqBox = cute::Shape<M, cute::Int<kDqColsPerWarpgroup>>;
  using SmemLayoutdQBox = decltype(cute::tile_to_shape(DqAtom{}, DqBox{}));
  // Both halves side by side: the (64, d) tile the dQ product partitions.
  using SmemLayoutdQ = decltype(cute::tile_to_shape(DqAtom{}, cute::Shape<M, D>{}));
  static_assert(cute::cosize_v<SmemLayoutdQ> == kConsumerWarpgroups *
                                                     cute::cosize_v<SmemLayoutdQBox>,
                "each warpgroup's columns are one contiguous half of the dQ tile");
  using TmaDq = typename Base::template TmaDqFor<SmemLayoutdQBox, DqBox>;
  // A warpgroup's reduce-add reads its half once that warpgroup alone has
  // staged it: no column of the half may come from the other warpgroup.
  static_assert(kAtomSpansCols<TiledMmadQ, kDqColsPerWarpgroup>,
                "each warpgroup's dQ product covers its own half of the columns");

  struct SharedStorage : Base::TileStorage {
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutdS>> ds;
    alignas(1024) cute::array_aligned<float, cute::cosize_v<SmemLayoutdQ>> dq;
    alignas(16) float lse_log2[Stages][kBlockM];
    alignas(16) float delta[Stages][kBlockM];
    typename Base::Barriers bar;
  };
  // Dynamic shared memory is only 16-byte aligned: one extra KiB lets the
  // kernel round its base up to 1024.
  static constexpr int kSmemBytes = int(sizeof(SharedStorage)) + Base::kDropoutBytes + 1024;
  static_assert(kSmemBytes <= 227 * 1024,
                "K, V, the Q/dO ring, dS and the dQ tile must fit shared memory");
};

}  // namespace ckfmha::kernel
