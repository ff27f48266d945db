// Compile-time configuration of the Hopper forward kernel (TMA + wgmma,
// warp-specialized, persistent): one producer warpgroup streams Q, K and V
// with the tensor-memory accelerator into a ring of shared-memory stages; two
// consumer warpgroups own 64 query rows each and run both products on the
// tensor cores.
#pragma once

#include "ckfmha/kernel/common/features.h"
#include "ckfmha/kernel/common/smem_rows.cuh"  // the O staging layout
#include "ckfmha/kernel/sm90/fwd_bias_ring.cuh"

#include <cute/arch/copy_sm90.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/atom/copy_traits_sm90.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include <type_traits>

namespace ckfmha::kernel {

// The widest GMMA swizzle whose atom (8 rows x 128/64/32 bytes) divides a
// row of `row_bytes`: the atom's width in bytes.
constexpr int gmma_row_major_atom_bytes(int row_bytes) {
  return row_bytes % 128 == 0 ? 128 : (row_bytes % 64 == 0 ? 64 : 32);
}

// That atom for a row of `Cols` elements.
template <class Element, int Cols>
using GmmaRowMajorAtom = std::conditional_t<
    gmma_row_major_atom_bytes(Cols * int(sizeof(Element))) == 128,
    cute::GMMA::Layout_K_SW128_Atom<Element>,
    std::conditional_t<gmma_row_major_atom_bytes(Cols * int(sizeof(Element))) == 64,
                       cute::GMMA::Layout_K_SW64_Atom<Element>,
                       cute::GMMA::Layout_K_SW32_Atom<Element>>>;

enum class Sm90OutputPath { kTmaStore, kSmemRows, kRegisters };

// The parameter list is every forward pipeline's, so the generator writes all
// instances alike; features this template does not implement (column-major
// V, split-KV, paged K/V) are rejected by the generator's rules and asserted
// here. The logit features (bias, ALiBi, soft-cap), dropout and sinks run in
// the consumers' softmax (fwd_mma.cuh) and epilogue.
//
// KvFp8 here means Q, K and V are all e4m3 (the fp8 forward, fwd_fp8.cuh):
// both products run in e4m3, P is quantised to e4m3, O leaves in Element.
// fp8 wgmma reads both operands K-major, so V (head dim contiguous) lands
// in a staging ring and the producer warpgroup writes it transposed into
// the ring the P V product reads.
template <class Element_, int HeadDimQK, int HeadDimV, int BlockM, int BlockN, int Warps,
          int Stages, MaskMode Mask, BiasMode Bias, bool HasLse, bool HasDropout, bool HasSoftcap,
          bool HasSink, bool IsGroupMode, bool VColMajor = false, int MinCtasPerSm = 1,
          bool SplitKv = false, bool PagedKv = false, bool KvFp8 = false>
struct FwdSm90Traits {
  using Element = Element_;  // O's type (and Q/K/V's unless fp8)
  static constexpr bool kQkvFp8 = KvFp8;
  // Q, K and V as they are loaded and multiplied.
  using InputElement = std::conditional_t<KvFp8, cutlass::float_e4m3_t, Element>;
  static_assert(!VColMajor, "column-major V runs on the sm80 template");
  static_assert(!KvFp8 || (Bias == BiasMode::kNone && !HasDropout && !HasSoftcap && !HasSink),
                "the fp8 forward takes masks and LSE only");
  static_assert(MinCtasPerSm == 1, "one warp-specialized CTA fills an SM");
  static_assert(!SplitKv && !PagedKv, "split-KV and paged K/V run on the sm80 template");

  static constexpr int kHeadDimQK = HeadDimQK;
  static constexpr int kHeadDimV = HeadDimV;
  // A wgmma covers 64 rows: a consumer warpgroup per 64 query rows, two or
  // three of them taking turns on the tensor cores.
  static constexpr int kConsumerWarpgroups = BlockM / 64;
  static constexpr int kBlockM = BlockM;
  static_assert(BlockM % 64 == 0 && (kConsumerWarpgroups == 2 || kConsumerWarpgroups == 3) &&
                    Warps == 4 * (1 + kConsumerWarpgroups),
                "tiles are 128 or 192 query rows over a producer warpgroup and a consumer "
                "warpgroup per 64 rows");
  static constexpr int kBlockN = BlockN;
  static constexpr int kStages = Stages;
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kThreads = 128 + kConsumerThreads;  // producer warpgroup first
  static constexpr MaskMode kMask = Mask;
  static constexpr bool kHasLse = HasLse;
  static constexpr bool kIsGroupMode = IsGroupMode;
  static constexpr BiasMode kBias = Bias;
  static constexpr bool kHasDropout = HasDropout;
  static constexpr bool kHasSoftcap = HasSoftcap;
  static constexpr bool kHasSink = HasSink;
  // Register split after setmaxnreg: the producer only issues TMA copies.
  // setmaxnreg moves registers within what the CTA was launched with (the
  // launch bound's per-thread count for every thread), so the split must
  // fit that pool, not the whole register file: 24 + 2 x 240 fills 168 x 384
  // exactly, 32 + 3 x 160 fills 128 x 512. A split over the pool leaves the
  // consumers' setmaxnreg waiting forever.
  // The fp8 producer transposes V and needs more: 64 + 2 x 216 fills the pool,
  // 56 + 3 x 144 nearly (three warpgroups: head dim 64 only, by the rules).
  static constexpr int kProducerRegisters =
      KvFp8 ? (kConsumerWarpgroups == 2 ? 64 : 56) : (kConsumerWarpgroups == 2 ? 24 : 32);
  static constexpr int kConsumerRegisters =
      KvFp8 ? (kConsumerWarpgroups == 2 ? 216 : 144) : (kConsumerWarpgroups == 2 ? 240 : 160);
  // Producer warps 1-3 transpose V (fp8); warp 0's first lane issues the TMA copies.
  static constexpr int kTransposeThreads = 96;
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;

  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                    std::is_same_v<Element, cutlass::bfloat16_t>,
                "wgmma takes fp16 or bf16 operands here");
  static_assert(HeadDimQK % 16 == 0 && HeadDimV % 16 == 0, "wgmma K steps are 16 deep");
  static_assert(!KvFp8 || (HeadDimQK % 32 == 0 && BlockN % 64 == 0 && HeadDimV % 16 == 0),
                "fp8 wgmma K steps are 32 deep; V^T rows are whole 64-byte swizzle atoms");
  static_assert(BlockN % 16 == 0 && BlockN <= 256, "wgmma N is a multiple of 16 up to 256");
  static_assert(Stages >= 2, "the K/V ring needs two stages to overlap loads with math");
  static_assert(kProducerRegisters * 128 + kConsumerRegisters * kConsumerThreads <=
                    kLaunchRegisters * kThreads,
                "the register split must fit the registers the CTA is launched with");

  using TileShapeQK = cute::Shape<cute::Int<kBlockM>, cute::Int<BlockN>, cute::Int<HeadDimQK>>;
  using TileShapePV = cute::Shape<cute::Int<kBlockM>, cute::Int<HeadDimV>, cute::Int<BlockN>>;
  // Warpgroups stack along M; S = Q K^T reads both operands from shared
  // memory, O += P V takes P from registers and V (head dim contiguous, i.e.
  // MN-major as the B operand) from shared memory.
  using AtomLayout = cute::Layout<cute::Shape<cute::Int<kConsumerWarpgroups>, cute::_1, cute::_1>>;
  // fp8: V^T is K-major (keys contiguous) in a buffer of its own.
  static constexpr cute::GMMA::Major kMajorV = KvFp8 ? cute::GMMA::Major::K : cute::GMMA::Major::MN;
  using TiledMmaQK = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<InputElement, InputElement, float,
                                 cute::Shape<cute::_64, cute::Int<BlockN>, cute::Int<HeadDimQK>>>(),
      AtomLayout{}));
  using TiledMmaPV = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<InputElement, InputElement, float,
                                 cute::Shape<cute::_64, cute::Int<HeadDimV>, cute::Int<BlockN>>,
                                 cute::GMMA::Major::K, kMajorV>(),
      AtomLayout{}));

  // One Q tile, as the TMA copies it; SmemLayoutQRing stacks kQStages of them.
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      GmmaRowMajorAtom<InputElement, HeadDimQK>{},
      cute::Shape<cute::Int<kBlockM>, cute::Int<HeadDimQK>>{}));
  using SmemLayoutK = decltype(cute::tile_to_shape(
      GmmaRowMajorAtom<InputElement, HeadDimQK>{},
      cute::Shape<cute::Int<BlockN>, cute::Int<HeadDimQK>, cute::Int<Stages>>{}));
  // V as the TMA copies it (fp8: the staging ring the producer transposes).
  using SmemLayoutV = decltype(cute::tile_to_shape(
      GmmaRowMajorAtom<InputElement, HeadDimV>{},
      cute::Shape<cute::Int<BlockN>, cute::Int<HeadDimV>, cute::Int<Stages>>{}));
  // V^T (HeadDimV, BlockN, Stages) as the PV product's B: the same bytes as V
  // seen MN-major, or (fp8) a K-major ring of its own whose key order inside
  // each 32-key step is the one P's registers hold (fwd_fp8.cuh).
  using SmemLayoutVt = std::conditional_t<
      KvFp8,
      decltype(cute::tile_to_shape(
          GmmaRowMajorAtom<InputElement, BlockN>{},
          cute::Shape<cute::Int<HeadDimV>, cute::Int<BlockN>, cute::Int<Stages>>{})),
      decltype(cute::composition(
          SmemLayoutV{},
          cute::make_ordered_layout(
              cute::Shape<cute::Int<HeadDimV>, cute::Int<BlockN>, cute::Int<Stages>>{},
              cute::Step<cute::_2, cute::_1, cute::_3>{})))>;
  static constexpr int kVtElements = KvFp8 ? int(cute::cosize_v<SmemLayoutVt>) : 1;
  // The swizzle atoms' widths in bytes of V's and V^T's rows (the fp8
  // transposer's address arithmetic, fwd_fp8.cuh).
  static constexpr int kVAtomBytes =
      gmma_row_major_atom_bytes(HeadDimV * int(sizeof(InputElement)));
  static constexpr int kVtAtomBytes = gmma_row_major_atom_bytes(BlockN * int(sizeof(InputElement)));
  // How O leaves the CTA. Batch mode stages it in shared memory and writes
  // it out with TMA stores (asynchronous: the next tile starts while they
  // drain; rows past seqlen_q fall outside the tensor and are clipped). Each
  // consumer warpgroup stores its own 64 rows, so one warpgroup's epilogue
  // runs under the other's last products, through a buffer of its own of at
  // most 128 columns: d256 goes out in two column chunks, which keeps its
  // buffers (32 KiB) beside Q and the K/V ring, where a whole O tile would
  // not fit. Group mode cannot clip at a sequence's end that way, so its
  // threads store rows themselves, from the sm80 path's swizzled rows so that
  // stores are 16 bytes wide; where that staging does not fit (d256), from
  // registers. O is never staged over Q: the next tile's Q load would wait
  // for the stores to drain.
  static constexpr int kRowsPerWarpgroup = 64;
  static constexpr int kOChunkCols = HeadDimV > 128 ? 128 : HeadDimV;
  static_assert(HeadDimV % kOChunkCols == 0, "O leaves in whole column chunks");
  // One warpgroup's buffer, atoms tiled down the rows first so that the TMA
  // store's box spans all 64 rows of an atom column: a 128-column chunk
  // leaves in two stores (tiled along the columns first, it took sixteen
  // 8-row boxes, issued one after another by the storing thread).
  using SmemLayoutOChunk = decltype(cute::tile_to_shape(
      GmmaRowMajorAtom<Element, kOChunkCols>{},
      cute::Shape<cute::Int<kRowsPerWarpgroup>, cute::Int<kOChunkCols>>{}));
  // All warpgroups' buffers one after another, seen as one (BlockM, chunk)
  // tile whose row r lies in buffer r / 64: the consumers' tiled copy
  // partitions it as it partitions O.
  using SmemLayoutOChunkStack = decltype(cute::tile_to_shape(
      GmmaRowMajorAtom<Element, kOChunkCols>{},
      cute::Shape<cute::Int<kRowsPerWarpgroup>, cute::Int<kOChunkCols>,
                  cute::Int<kConsumerWarpgroups>>{}));
  using SmemLayoutOChunks = decltype(cute::composition(
      SmemLayoutOChunkStack{},
      cute::Layout<cute::Shape<cute::Shape<cute::Int<kRowsPerWarpgroup>,
                                           cute::Int<kConsumerWarpgroups>>,
                               cute::Int<kOChunkCols>>,
                   cute::Stride<cute::Stride<cute::_1, cute::Int<kRowsPerWarpgroup * kOChunkCols>>,
                                cute::Int<kRowsPerWarpgroup>>>{}));
  // The P V product cut to one column chunk: the same accumulator layout
  // over fewer 8-column blocks, which partitions a chunk's registers.
  using TiledMmaPVChunk = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, cute::Int<kOChunkCols>, cute::Int<BlockN>>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>(),
      AtomLayout{}));
  using RowsO = SmemRows<Element, HeadDimV, kConsumerThreads>;
  using SmemLayoutORows = typename RowsO::template Layout<kBlockM>;
  static constexpr int kOStagingElements =
      IsGroupMode ? int(cute::cosize_v<SmemLayoutORows>)
                  : kConsumerWarpgroups * int(cute::cosize_v<SmemLayoutOChunk>);
  // stmatrix: both staging layouts keep 8-element runs of a row contiguous
  // and 16-byte aligned, as stmatrix's rows need.
  using SmemStoreAtomO = cute::Copy_Atom<cute::SM90_U32x4_STSM_N, Element>;

  // Global views the TMA descriptors are built from: (rows, head dim, heads,
  // batch) with 64-bit strides and a unit head-dim stride.
  using GmemStride = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;
  using GmemTensor = decltype(cute::make_tensor(
      cute::make_gmem_ptr(static_cast<InputElement const*>(nullptr)),
      cute::Shape<int, int, int, int>{}, GmemStride{}));
  using TmaQ = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutQ{},
      cute::Shape<cute::Int<kBlockM>, cute::Int<HeadDimQK>>{}, cute::_1{}));
  using TmaK = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{}, GmemTensor{}, cute::take<0, 2>(SmemLayoutK{}),
      cute::Shape<cute::Int<BlockN>, cute::Int<HeadDimQK>>{}, cute::_1{}));
  using TmaV = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{}, GmemTensor{}, cute::take<0, 2>(SmemLayoutV{}),
      cute::Shape<cute::Int<BlockN>, cute::Int<HeadDimV>>{}, cute::_1{}));
  using GmemTensorOut = decltype(cute::make_tensor(
      cute::make_gmem_ptr(static_cast<Element*>(nullptr)), cute::Shape<int, int, int, int>{},
      GmemStride{}));
  // Only the TMA-store output path uses it; it keeps one parameter struct for all.
  using TmaO = decltype(cute::make_tma_copy(
      cute::SM90_TMA_STORE{}, GmemTensorOut{}, SmemLayoutOChunk{},
      cute::Shape<cute::Int<kRowsPerWarpgroup>, cute::Int<kOChunkCols>>{}, cute::_1{}));

  static constexpr int kTmaBytesQ = kBlockM * HeadDimQK * int(sizeof(InputElement));
  static constexpr int kTmaBytesK = BlockN * HeadDimQK * int(sizeof(InputElement));
  static constexpr int kTmaBytesV = BlockN * HeadDimV * int(sizeof(InputElement));

  // Q is double-buffered where shared memory allows, so the next tile's Q
  // loads while this tile runs instead of after its last S product.
  static constexpr int kMaxQStages = 2;
  struct PlainBarriers {
    uint64_t q_full[kMaxQStages];
    uint64_t q_empty[kMaxQStages];  // every consumer warpgroup is done with that Q
    uint64_t k_full[Stages];
    uint64_t v_full[Stages];
    // K and V are released apart: a stage's K is done once its S product is,
    // while its V is still read by the P V product issued a turn later.
    uint64_t k_empty[Stages];
    uint64_t v_empty[Stages];
  };
  // fp8: v_full/v_empty guard the transposed ring the consumers read, and
  // the staging ring the TMA fills has barriers of its own.
  struct Fp8Barriers : PlainBarriers {
    uint64_t v_staged[Stages];
    uint64_t v_staging_free[Stages];
  };
  using Barriers = std::conditional_t<KvFp8, Fp8Barriers, PlainBarriers>;
  // Swizzled GMMA/TMA tiles need 1024-byte alignment.
  // (fp8 adds vt, the transposed V ring; plain V is read where it lands.)
  template <int QStages>
  struct PlainStorageWithoutO {
    alignas(1024) cute::array_aligned<InputElement, QStages * cute::cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<InputElement, cute::cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<InputElement, cute::cosize_v<SmemLayoutV>> v;
    Barriers bar;
  };
  template <int QStages>
  struct PlainStorageWithO {
    alignas(1024) cute::array_aligned<InputElement, QStages * cute::cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<InputElement, cute::cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<InputElement, cute::cosize_v<SmemLayoutV>> v;
    alignas(1024) cute::array_aligned<Element, kOStagingElements> o;
    Barriers bar;
  };
  template <int QStages>
  struct Fp8StorageWithoutO {
    alignas(1024) cute::array_aligned<InputElement, QStages * cute::cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<InputElement, cute::cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<InputElement, cute::cosize_v<SmemLayoutV>> v;
    alignas(1024) cute::array_aligned<InputElement, kVtElements> vt;
    Barriers bar;
  };
  template <int QStages>
  struct Fp8StorageWithO {
    alignas(1024) cute::array_aligned<InputElement, QStages * cute::cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<InputElement, cute::cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<InputElement, cute::cosize_v<SmemLayoutV>> v;
    alignas(1024) cute::array_aligned<InputElement, kVtElements> vt;
    alignas(1024) cute::array_aligned<Element, kOStagingElements> o;
    Barriers bar;
  };
  template <int QStages>
  using StorageWithoutO = std::conditional_t<KvFp8, Fp8StorageWithoutO<QStages>,
                                             PlainStorageWithoutO<QStages>>;
  template <int QStages>
  using StorageWithO =
      std::conditional_t<KvFp8, Fp8StorageWithO<QStages>, PlainStorageWithO<QStages>>;
  // Dynamic shared memory is only 16-byte aligned: one extra KiB lets the
  // kernel round its base up to 1024.
  static constexpr int kSmemLimit = 227 * 1024;
  // An elementwise bias streams through a ring of its own after the storage
  // struct (fwd_bias_ring.cuh): two stages where they fit beside staged O
  // and one Q, else one; none where not even that fits (d256), and such
  // kernels read their bias into registers.
  template <int BiasStages>
  using SmemLayoutBiasStages = decltype(cute::tile_to_shape(
      GmmaRowMajorAtom<Element, BlockN>{},
      cute::Shape<cute::Int<kBlockM>, cute::Int<BlockN>, cute::Int<BiasStages>>{}));
  template <int BiasStages>
  using BiasRingStages =
      FwdBiasRingStorage<Element, SmemLayoutBiasStages<BiasStages>, BiasStages>;
  template <int BiasStages>
  static constexpr int kBiasRingBytes =
      BiasStages == 0 ? 0 : int(sizeof(BiasRingStages<BiasStages>));
  template <int BiasStages>
  static constexpr bool kBiasRingFits =
      int(sizeof(StorageWithO<1>)) + kBiasRingBytes<BiasStages> + 1024 <= kSmemLimit;
  static constexpr int kBiasStages =
      Bias != BiasMode::kElementwise ? 0
      : kBiasRingFits<2>             ? 2
      : kBiasRingFits<1>             ? 1
                                     : 0;
  // Three consumer warpgroups (160 registers a thread) have no room for a
  // bias tile, in registers or added from the ring (both spilled 0.9-1.3 KB
  // at d64): their elementwise bias is a row broadcast over the query rows,
  // in the ring's row mode only; the runtime gives them no other bias.
  static constexpr bool kBiasRowsOnly =
      Bias == BiasMode::kElementwise && kConsumerWarpgroups == 3;
  using BiasRing =
      std::conditional_t<kBiasStages == 0, NoBiasRing, BiasRingStages<kBiasStages>>;
  using SmemLayoutBiasRing = SmemLayoutBiasStages<kBiasStages == 0 ? 1 : kBiasStages>;
  static constexpr int kBiasBytes = kBiasRingBytes<kBiasStages>;
  static constexpr int kTmaBytesBias = kBlockM * BlockN * int(sizeof(Element));
  using GmemTensorBias = decltype(cute::make_tensor(
      cute::make_gmem_ptr(static_cast<Element const*>(nullptr)),
      cute::Shape<int, int, int, int>{}, GmemStride{}));
  // The bias as (rows, keys, heads, batch), keys contiguous; only kernels
  // with a ring carry its descriptor.
  using TmaBias = std::conditional_t<
      kBiasStages == 0 || kBiasRowsOnly, NoBiasTma,
      decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensorBias{},
                                   cute::take<0, 2>(SmemLayoutBiasRing{}),
                                   cute::Shape<cute::Int<kBlockM>, cute::Int<BlockN>>{},
                                   cute::_1{}))>;
  // Staging O comes first (its register path lost at s512, NOTES 33), then
  // the bias ring; a second Q only where all fit (not d256, nor d128 with a
  // bias ring).
  static constexpr int kQStages =
      int(sizeof(StorageWithO<kMaxQStages>)) + kBiasBytes + 1024 <= kSmemLimit ? kMaxQStages
                                                                               : 1;
  using SmemLayoutQRing = decltype(cute::tile_to_shape(
      GmmaRowMajorAtom<InputElement, HeadDimQK>{},
      cute::Shape<cute::Int<kBlockM>, cute::Int<HeadDimQK>, cute::Int<kQStages>>{}));
  static constexpr bool kStagesO =
      int(sizeof(StorageWithO<kQStages>)) + kBiasBytes + 1024 <= kSmemLimit;
  static constexpr Sm90OutputPath kOutputPath =
      !kStagesO ? Sm90OutputPath::kRegisters
                : (IsGroupMode ? Sm90OutputPath::kSmemRows : Sm90OutputPath::kTmaStore);
  using SharedStorage =
      std::conditional_t<kStagesO, StorageWithO<kQStages>, StorageWithoutO<kQStages>>;
  static constexpr int kSmemBytes = int(sizeof(SharedStorage)) + kBiasBytes + 1024;

  // The bias ring, right after the storage struct (a whole number of KiB).
  __device__ static BiasRing* bias_ring(SharedStorage* storage) {
    return reinterpret_cast<BiasRing*>(reinterpret_cast<char*>(storage) + sizeof(SharedStorage));
  }
  static_assert(kSmemBytes <= kSmemLimit, "Q, the K/V ring and barriers must fit shared memory");

  // The ring the P V product reads: V itself, or (fp8) its transpose.
  __device__ static InputElement* vt_data(SharedStorage* storage) {
    if constexpr (KvFp8) {
      return storage->vt.data();
    } else {
      return storage->v.data();
    }
  }

  // The O staging buffer; null on the register path, which never reads it.
  __device__ static Element* o_staging(SharedStorage* storage) {
    if constexpr (kStagesO) {
      return storage->o.data();
    } else {
      return nullptr;
    }
  }
};

}  // namespace ckfmha::kernel
