// Compile-time configuration of the fp32 SIMT forward kernel (plain FFMA, no
// tensor cores, so results are fp32-exact up to summation order).
//
// Thread mapping: 128 threads as 16 row groups x 8 lanes. Thread (ty, tx),
// tid = 8 * ty + tx, owns query rows ty + 16 i, keys tx + 8 j of the score
// tile and output columns 4 tx + 32 c + {0..3}. A row's 8 lanes are
// consecutive lanes of one warp, so row reductions are 3 xor-shuffles.
#pragma once

#include "ckfmha/kernel/common/features.h"

#include <cute/tensor.hpp>

#include <type_traits>

namespace ckfmha::kernel {

template <class Element_, int HeadDimQK, int HeadDimV, int BlockM, int BlockN, int Warps,
          int Stages, MaskMode Mask, BiasMode Bias, bool HasLse, bool HasDropout, bool HasSoftcap,
          bool HasSink, bool IsGroupMode, bool VColMajor = false>
struct FwdSimtTraits {
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
  static constexpr bool kHasLse = HasLse;
  static constexpr bool kHasDropout = HasDropout;
  static constexpr bool kHasSoftcap = HasSoftcap;
  static constexpr bool kHasSink = HasSink;
  static constexpr bool kIsGroupMode = IsGroupMode;
  static constexpr bool kVColMajor = VColMajor;

  static constexpr int kRowGroups = 16;
  static constexpr int kLanes = 8;
  static constexpr int kVec = 4;  // floats per 16-byte vector
  static constexpr int kRowsPerThread = BlockM / kRowGroups;
  static constexpr int kKeysPerThread = BlockN / kLanes;
  static constexpr int kOutVecsPerRow = HeadDimV / (kLanes * kVec);
  static constexpr int kOutColsPerThread = kOutVecsPerRow * kVec;

  static_assert(std::is_same_v<Element, float>, "the SIMT path computes fp32 in, fp32 out");
  static_assert(Warps == 4, "128 threads map to 16 row groups x 8 lanes");
  static_assert(Stages == 1, "K and V are single-buffered; the next K loads under P*V");
  static_assert(!VColMajor, "column-major V is not implemented on the SIMT path");
  static_assert(BlockM % kRowGroups == 0, "each row group owns every 16th query row");
  // Keys tx + 16 m and tx + 16 m + 8 share one 16-key Philox block.
  static_assert(BlockN % 16 == 0, "key tiles are whole 16-key dropout blocks");
  static_assert(HeadDimQK % 32 == 0 && HeadDimV % 32 == 0,
                "global rows load as 8 lanes x 16 bytes; output columns as 8 lanes x 4 floats");

  // Row pitches in floats. Eight lanes read eight different K rows at once
  // (one 16-byte vector each) and a warp's four row groups read four Q rows:
  // a pitch of 4 mod 32 puts them in distinct banks. All 32 lanes of a warp
  // write P for 4 rows x 8 keys: a pitch of 8 mod 32 separates the rows (and
  // the four P rows a warp reads back). V is read as one contiguous 128-byte
  // row per 8 lanes and needs no padding. Pitches stay multiples of 4 floats
  // for the 16-byte cp.async stores.
  static constexpr int kPitchQ = HeadDimQK + 4;
  static constexpr int kPitchK = HeadDimQK + 4;
  static constexpr int kPitchV = HeadDimV;
  static constexpr int kPitchP = BlockN + 8;

  using SmemLayoutQ = cute::Layout<cute::Shape<cute::Int<BlockM>, cute::Int<HeadDimQK>>,
                                   cute::Stride<cute::Int<kPitchQ>, cute::_1>>;
  using SmemLayoutK = cute::Layout<cute::Shape<cute::Int<BlockN>, cute::Int<HeadDimQK>>,
                                   cute::Stride<cute::Int<kPitchK>, cute::_1>>;
  using SmemLayoutV = cute::Layout<cute::Shape<cute::Int<BlockN>, cute::Int<HeadDimV>>,
                                   cute::Stride<cute::Int<kPitchV>, cute::_1>>;

  static constexpr int kSmemQFloats = BlockM * kPitchQ;
  static constexpr int kSmemKFloats = BlockN * kPitchK;
  static constexpr int kSmemVFloats = BlockN * kPitchV;
  static constexpr int kSmemPFloats = BlockM * kPitchP;
  // generator/rules/simt_fwd.py computes it too (simt_smem_bytes); each
  // instance asserts that the two agree.
  static constexpr int kSmemBytes =
      int(sizeof(float)) * (kSmemQFloats + kSmemKFloats + kSmemVFloats + kSmemPFloats);

  // Global -> shared: 16 rows x (8 lanes x 16 bytes) per step, so every head
  // dim that is a multiple of 32 tiles evenly.
  using Load = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{},
      cute::Layout<cute::Shape<cute::Int<kRowGroups>, cute::Int<kLanes>>,
                   cute::Stride<cute::Int<kLanes>, cute::_1>>{},
      cute::Layout<cute::Shape<cute::_1, cute::Int<kVec>>>{}));
  // (ty, tx) of a thread id, for partitioning the score tile.
  using ThreadGrid = cute::Layout<cute::Shape<cute::Int<kRowGroups>, cute::Int<kLanes>>,
                                  cute::Stride<cute::Int<kLanes>, cute::_1>>;
};

}  // namespace ckfmha::kernel
