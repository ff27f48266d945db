// Compile-time configuration of the Hopper backward main stage (bwd_dq_dk_dv
// on TMA + wgmma, warp-specialized): one producer warpgroup streams K and V
// once and then the query tiles' Q and dO through a two-stage ring; two
// consumer warpgroups own 64 of the CTA's 128 keys each and run all five
// products on the tensor cores.
#pragma once

#include "ckfmha/kernel/fwd_features.h"
#include "ckfmha/kernel/fwd_sm90_traits.cuh"  // GmmaRowMajorAtom
#include "ckfmha/kernel/shared_storage.cuh"  // SharedStore64

#include <cute/arch/copy_sm90.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/atom/copy_traits_sm90.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

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

// The parameter list is the sm80 backward's, so the generator writes both
// alike; what this template does not implement is rejected by the
// generator's rules and asserted here.
template <class Element_, int HeadDimQK, int HeadDimV, int BlockM, int BlockN, int Warps,
          int Stages, MaskMode Mask, BiasMode Bias, bool HasDropout, bool HasSoftcap,
          bool HasDbias, bool IsGroupMode, int MinCtasPerSm = 1>
struct BwdSm90Traits {
  using Element = Element_;
  static_assert(Bias == BiasMode::kNone && !HasDropout && !HasSoftcap && !HasDbias,
                "the sm90 backward covers plain attention with masks and GQA");
  static_assert(Mask == MaskMode::kNone || Mask == MaskMode::kCausal,
                "the sm90 backward covers no mask and causal masks");
  static_assert(!IsGroupMode, "the sm90 backward covers batch mode");
  static_assert(MinCtasPerSm == 1, "one warp-specialized CTA fills an SM");
  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                    std::is_same_v<Element, cutlass::bfloat16_t>,
                "wgmma takes fp16 or bf16 operands here");

  static constexpr int kHeadDim = HeadDimQK;
  static_assert(HeadDimQK == HeadDimV, "one head dim for Q, K and V");
  static_assert(HeadDimQK == 64 || HeadDimQK == 128, "head dims 64 and 128");
  static constexpr int kConsumerWarpgroups = 2;
  // A wgmma covers 64 rows: each consumer warpgroup owns 64 keys.
  static constexpr int kBlockN = 64 * kConsumerWarpgroups;
  static constexpr int kBlockM = 64;
  static_assert(BlockN == kBlockN && BlockM == kBlockM && Warps == 4 * (1 + kConsumerWarpgroups),
                "tiles are 128 keys over two consumer warpgroups and 64 query rows per step, "
                "with a producer warpgroup");
  static_assert(Stages == 2, "the Q/dO ring has two stages");
  static constexpr int kStages = Stages;
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kThreads = 128 + kConsumerThreads;  // producer warpgroup first
  static constexpr MaskMode kMask = Mask;
  // Issue the next query tile's S^T and dP^T behind this tile's dQ (dK
  // then goes in before the dS^T barrier): their fp32 accumulators live
  // beside dK, dV and dQ, which fits the consumers' registers at d64 only.
  static constexpr bool kOverlapQueryTiles = kHeadDim <= 64;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  static_assert(kProducerRegisters * 128 + kConsumerRegisters * kConsumerThreads <= 65536,
                "the register split must fit the SM's register file");

  using D = cute::Int<kHeadDim>;
  using M = cute::Int<kBlockM>;
  using N = cute::Int<kBlockN>;
  using AtomAlongM = cute::Layout<cute::Shape<cute::Int<kConsumerWarpgroups>, cute::_1, cute::_1>>;
  using AtomAlongN = cute::Layout<cute::Shape<cute::_1, cute::Int<kConsumerWarpgroups>, cute::_1>>;

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
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<M, cute::Int<kHeadDim / kConsumerWarpgroups>, N>,
                                 cute::GMMA::Major::MN, cute::GMMA::Major::MN>(),
      AtomAlongN{}));

  // K and V: the swizzle atom is at most half a row wide, so that each
  // warpgroup's half of K^T's columns (dQ's B) is whole atoms.
  using SmemLayoutK = decltype(cute::tile_to_shape(
      GmmaRowMajorAtom<Element, kHeadDim / kConsumerWarpgroups>{}, cute::Shape<N, D>{}));
  using SmemLayoutKt = GmmaTransposed<SmemLayoutK, kBlockN, kHeadDim>;  // (d, keys)
  using SmemLayoutQ = decltype(cute::tile_to_shape(GmmaRowMajorAtom<Element, kHeadDim>{},
                                                   cute::Shape<M, D, cute::Int<Stages>>{}));
  using SmemLayoutQt = GmmaTransposedStages<SmemLayoutQ, kBlockM, kHeadDim, Stages>;
  // dS^T (keys, queries), queries contiguous, in two buffers so that one
  // query tile's dS^T is written while the other warpgroup may still read
  // the previous one in its dQ product.
  using SmemLayoutdS = decltype(cute::tile_to_shape(GmmaRowMajorAtom<Element, kBlockM>{},
                                                    cute::Shape<N, M, cute::_2>{}));
  using SmemLayoutdSt = GmmaTransposedStages<SmemLayoutdS, kBlockN, kBlockM, 2>;  // (q, keys)
  // stmatrix: a warp stores four 8x8 blocks of 16-bit values from the
  // accumulator's own register layout, one instruction per 16 bytes of a
  // thread's values.
  using SmemStoreAtomdS = cute::Copy_Atom<cute::SM90_U32x4_STSM_N, Element>;

  // Global views the TMA descriptors are built from: (rows, head dim, heads,
  // batch) with 64-bit strides and a unit head-dim stride.
  using GmemStride = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;
  using GmemTensor = decltype(cute::make_tensor(
      cute::make_gmem_ptr(static_cast<Element const*>(nullptr)),
      cute::Shape<int, int, int, int>{}, GmemStride{}));
  using TmaQ = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensor{},
                                            cute::take<0, 2>(SmemLayoutQ{}),
                                            cute::Shape<M, D>{}, cute::_1{}));
  using TmaK = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutK{},
                                            cute::Shape<N, D>{}, cute::_1{}));

  // The dQ tile in fp32, staged for one TMA reduce-add per warpgroup: each
  // warpgroup's half of the columns is its own (64, d/2) tile of 128-byte
  // swizzled rows, so the accumulator's column pairs store without bank
  // conflicts and each half is one contiguous TMA source.
  static constexpr int kDqColsPerWarpgroup = kHeadDim / kConsumerWarpgroups;
  using DqHalf = cute::Shape<M, cute::Int<kDqColsPerWarpgroup>>;
  using SmemLayoutdQHalf =
      decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<float>{}, DqHalf{}));
  // Both halves side by side: the (64, d) tile the dQ product partitions.
  using SmemLayoutdQ = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<float>{},
                                                    cute::Shape<M, D>{}));
  static_assert(cute::cosize_v<SmemLayoutdQ> == kConsumerWarpgroups *
                                                     cute::cosize_v<SmemLayoutdQHalf>,
                "each warpgroup's columns are one contiguous half of the dQ tile");
  using SmemStoreAtomdQ = cute::Copy_Atom<SharedStore64, float>;
  // The fp32 accumulator as (rows, head dim, batch x heads), rows padded to
  // whole 64-row blocks per head (bwd_workspace.h).
  using DqGmemTensor = decltype(cute::make_tensor(
      cute::make_gmem_ptr(static_cast<float*>(nullptr)), cute::Shape<int, int, int>{},
      cute::Stride<int64_t, cute::_1, int64_t>{}));
  using TmaDq = decltype(cute::make_tma_copy(cute::SM90_TMA_REDUCE_ADD{}, DqGmemTensor{},
                                             SmemLayoutdQHalf{}, DqHalf{}, cute::_1{}));

  static constexpr int kTmaBytesQ = kBlockM * kHeadDim * int(sizeof(Element));
  // A query tile's LSE (log2 domain) and D rows, bulk-copied with Q and dO.
  static constexpr int kBulkBytesRows = kBlockM * int(sizeof(float));
  static constexpr int kTmaBytesK = kBlockN * kHeadDim * int(sizeof(Element));

  struct Barriers {
    uint64_t kv_full;
    uint64_t q_full[Stages];   // Q and dO of a query tile landed
    uint64_t q_empty[Stages];  // both consumer warpgroups are done with them
  };
  // Swizzled GMMA/TMA tiles need 1024-byte alignment.
  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>> v;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>> dout;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutdS>> ds;
    alignas(1024) cute::array_aligned<float, cute::cosize_v<SmemLayoutdQ>> dq;
    // Each stage's LSE (log2 domain) and D rows: read where used instead of
    // held in registers next to dK, dV, S^T and dP^T.
    alignas(16) float lse_log2[Stages][kBlockM];
    alignas(16) float delta[Stages][kBlockM];
    Barriers bar;
  };
  // Dynamic shared memory is only 16-byte aligned: one extra KiB lets the
  // kernel round its base up to 1024.
  static constexpr int kSmemBytes = int(sizeof(SharedStorage)) + 1024;
  static_assert(kSmemBytes <= 227 * 1024,
                "K, V, the Q/dO ring, dS and the dQ tile must fit shared memory");
};

}  // namespace ckfmha::kernel
