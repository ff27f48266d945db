// Compile-time configuration of the sm80-path forward kernel: one struct holds
// every type and constant the kernel body uses, so a generated instance is a
// single template argument list.
#pragma once

#include "ckfmha/kernel/common/features.h"
#include "ckfmha/kernel/common/smem_rows.cuh"

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include <type_traits>

namespace ckfmha::kernel {

template <class Element_, int HeadDimQK, int HeadDimV, int BlockM, int BlockN, int Warps,
          int Stages, MaskMode Mask, BiasMode Bias, bool HasLse, bool HasDropout, bool HasSoftcap,
          bool HasSink, bool IsGroupMode, bool VColMajor = false, int MinCtasPerSm = 1,
          bool SplitKv = false, bool PagedKv = false, bool KvFp8 = false>
struct FwdSm80Traits {
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
  // __launch_bounds__ occupancy: ptxas then caps registers per thread at
  // 64K / (kThreads * kMinCtasPerSm), trading spills for resident warps.
  static constexpr int kMinCtasPerSm = MinCtasPerSm;
  // The fwd_splitkv variant (common/splitkv_rows.cuh): GQA heads packed into the
  // tile rows, a key range per split, fp32 partials to the workspace.
  static constexpr bool kSplitKv = SplitKv;
  static_assert(!SplitKv || (Bias == BiasMode::kNone && !HasDropout && !HasSink &&
                             (!VColMajor || PagedKv)),
                "split-KV kernels take masks, soft-cap, LSE, GQA and group mode only");
  // The paged address mode of the split-KV body (common/paged_kv.cuh): key tile rows
  // gathered through a page table. K and V rows share one page lookup, so
  // they need one head dim, and are loaded together, so double-buffered.
  // With VColMajor the pages are vLLM's "vectorized" ones (V^T per page).
  static constexpr bool kPagedKv = PagedKv;
  static_assert(!PagedKv || (SplitKv && HeadDimQK == HeadDimV && (Stages == 2 || KvFp8)),
                "paged K/V runs on the split-KV body with hdim_q == hdim_v and 2 stages (fp8 K/V: "
                "its own byte stages)");

  // fp8 K/V (common/fp8_kv.cuh): K and V arrive as e4m3 bytes in byte stages
  // and are widened into one Element tile each before the products.
  static constexpr bool kKvFp8 = KvFp8;
  static_assert(!KvFp8 || (SplitKv && (Stages == 1 || Stages == 2) && !VColMajor),
                "fp8 K/V runs on the split-KV body, with 2 or 4 byte stages and V row-major");

  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                    std::is_same_v<Element, cutlass::bfloat16_t>,
                "the sm80 tensor-core path takes fp16 or bf16 operands");
  // 1: K and V single-buffered, the next K loading under the softmax and V
  // under S = QK^T. 2: both double-buffered, the next tile's K and V loading
  // under the whole of this tile's work (one barrier per tile instead of two).
  static_assert(Stages == 1 || Stages == 2, "K/V shared-memory stages are 1 or 2");
  static constexpr bool kDoubleBuffered = Stages == 2;
  static_assert(BlockM % (16 * Warps) == 0, "each warp owns whole 16-row MMA slices");
  static_assert(BlockN % 16 == 0, "key tiles are consumed 16 columns at a time");

  // Warps stack along M; the N extent of 16 lets one ldmatrix.x4 feed two
  // 8-wide MMAs with B, and makes pairs of S accumulators line up with one
  // 16-wide K step of the P*V product.
  // The products' operand type. fp8 K/V is widened to fp16 whatever the query
  // dtype: e4m3 -> fp16 is one instruction per pair where bf16 takes four, and
  // widening is what paces the fp8 body. bf16 queries are then rescaled into
  // fp16 by a power of two per CTA (kernel), and P is fp16.
  using MmaElement = std::conditional_t<KvFp8, cutlass::half_t, Element>;
  using MmaOp = std::conditional_t<std::is_same_v<MmaElement, cutlass::half_t>,
                                   cute::SM80_16x8x16_F32F16F16F32_TN,
                                   cute::SM80_16x8x16_F32BF16BF16F32_TN>;
  using TiledMma = cute::TiledMMA<cute::MMA_Atom<MmaOp>,
                                  cute::Layout<cute::Shape<cute::Int<Warps>, cute::_1, cute::_1>>,
                                  cute::Tile<cute::Int<16 * Warps>, cute::_16, cute::_16>>;

  using RowsQK = SmemRows<Element, HeadDimQK, kThreads, SplitKv>;
  using RowsV = SmemRows<Element, HeadDimV, kThreads, SplitKv>;
  using SmemLayoutQ = typename RowsQK::template Layout<BlockM>;
  using SmemLayoutK = typename RowsQK::template Layout<BlockN>;
  using SmemLayoutV = typename RowsV::template Layout<BlockN>;
  using SmemLayoutO = typename RowsV::template Layout<BlockM>;
  // Column-major V arrives as (HeadDimV, BlockN) rows of keys: it is stored
  // that way, swizzled along the keys, and read with plain ldmatrix. Other
  // kernels never use it, and rows of 32 keys stand in for theirs (16-key
  // tiles, the fp8 K/V decode's, have no 32-element rows).
  using RowsVt = SmemRows<Element, VColMajor ? BlockN : 32, kThreads>;
  // V^T as (HeadDimV, BlockN), the B operand of O += P V: a transposed view of
  // row-major V, or the stored layout of column-major V.
  using SmemLayoutVt = std::conditional_t<
      VColMajor, typename RowsVt::template Layout<HeadDimV>,
      decltype(cute::composition(
          SmemLayoutV{}, cute::make_layout(cute::Shape<cute::Int<HeadDimV>, cute::Int<BlockN>>{},
                                           cute::GenRowMajor{})))>;

  // O is staged over Q's space once the main loop is done.
  static constexpr int kSmemQOBytes =
      int(sizeof(Element)) * (cute::cosize_v<SmemLayoutQ> > cute::cosize_v<SmemLayoutO>
                                  ? int(cute::cosize_v<SmemLayoutQ>)
                                  : int(cute::cosize_v<SmemLayoutO>));
  // One stage each; stage s of K (V) starts s * kSmemKElems (kSmemVElems) in.
  static constexpr int kSmemKElems = int(cute::cosize_v<SmemLayoutK>);
  static constexpr int kSmemVElems =
      int(VColMajor ? cute::cosize_v<SmemLayoutVt> : cute::cosize_v<SmemLayoutV>);
  // Element K/V tiles: one per stage, or the one widened tile of fp8 K/V,
  // whose byte stages (K then V, kFp8StageBytes each) follow them.
  // fp8 tiles are half the bytes: twice the stages in the budget of `Stages`
  // element stages keep as many bytes in flight, i.e. twice the keys
  // (Stages = 1: the next tile loads while one is widened and used).
  static constexpr int kElementKvStages = KvFp8 ? 1 : Stages;
  static constexpr int kFp8Stages = KvFp8 ? 2 * Stages : 0;
  static constexpr int kFp8StageBytes = KvFp8 ? BlockN * (HeadDimQK + HeadDimV) : 0;
  static constexpr int kSmemBytes =
      kSmemQOBytes + kElementKvStages * (kSmemKElems + kSmemVElems) * int(sizeof(Element)) +
      kFp8Stages * kFp8StageBytes;

  using SmemLoadAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, MmaElement>;
  using SmemLoadAtomTransposed = cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, MmaElement>;
  // ldmatrix flavour for the V^T operand: transposing unless V is column-major.
  using SmemLoadAtomVt = std::conditional_t<VColMajor, SmemLoadAtom, SmemLoadAtomTransposed>;
  using SmemStoreAtom = cute::Copy_Atom<cute::UniversalCopy<uint32_t>, Element>;
};

}  // namespace ckfmha::kernel
