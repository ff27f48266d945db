// The pieces of the Hopper forward that only the fp8 (e4m3 Q, K and V)
// instances run (Traits::kQkvFp8):
//   - P in e4m3: the S accumulator's probabilities packed into the A
//     registers of the e4m3 P V product, with no exchange between threads;
//   - V^T: fp8 wgmma reads B K-major, so producer warps 1-3 transpose each V
//     tile from the TMA's staging ring into the ring the P V product reads;
//   - the dequantisation scales: q and k's join the softmax scale, v's the
//     output's normalisation.
//
// Key order. A thread's S accumulator holds, in each 32-key step, keys
// {2t, 2t+1, 2t+8, 2t+9} (+16) of its rows, t = lane % 4, while the e4m3 A
// operand wants positions {4t .. 4t+3} (+16). Rather than move values between
// lanes, position 4t + e of P (e = 0..3) stands for key
// 2t + (e & 1) + 8 (e >> 1), and V^T's key columns are written in that same
// order: the P V product sums over keys, so any order both sides share is
// the product itself.
#pragma once

#include "ckfmha/ckfmha.h"  // CKFMHA_FP8_SCALE_BLOCK
#include "ckfmha/kernel/common/fp8_kv.cuh"  // kv_scale
#include "ckfmha/kernel/common/persistent_tile_order.cuh"
#include "ckfmha/kernel/params/fwd_params.h"
#include "ckfmha/kernel/sm90/fwd_ring.cuh"
#include "ckfmha/kernel/sm90/fwd_tile_work.cuh"

#include <cuda_fp8.h>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <cstdint>

namespace ckfmha::kernel {

// P is computed as exp2(s - running max + 4): a row's largest probability
// is at least 16, not 1, so that small ones stay above e4m3's smallest
// subnormal (2^-9) down to 2^-13 of the largest. Sums carry the same factor,
// which cancels in O = P V / sum; only the LSE subtracts it. The running
// maximum is lazy (online_softmax.cuh): it moves only when a tile exceeds it
// by more than 2^4, so most tiles skip O's rescale, and P stays below
// 2^(4 + 4) = 256, inside e4m3's 448. (An offset of 8 with an exact maximum
// rescaled O at every tile, 64 multiplies per thread at d128.)
constexpr int kFp8ProbOffsetLog2 = 4;
constexpr int kFp8ScaleBlock = CKFMHA_FP8_SCALE_BLOCK;
constexpr int kFp8MaxSlackLog2 = 4;
static_assert((1 << (kFp8ProbOffsetLog2 + kFp8MaxSlackLog2)) <= 448,
              "fp8 P must stay inside e4m3's range");

// Two floats as two e4m3 codes in one 16-bit word, `lo` in the low byte
// (round to nearest even, saturating at +-448).
__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ uint32_t e4m3x4(float b0, float b1, float b2, float b3) {
  return e4m3x2(b0, b1) | (e4m3x2(b2, b3) << 16);
}

// One consumer thread's probabilities (the S accumulator, ((2,2,N/8),1,1):
// value i = column pair (i % 2), row half (i / 2 % 2), 8-column block i / 4)
// as the A registers of the e4m3 P V product (((4,2,2),1,N/32): 4 keys, row
// half, 16-key half of the step), in the key order described above.
template <class AccS, class Probs>
__device__ __forceinline__ void quantize_probs_e4m3(AccS const& acc_s, Probs& probs) {
  constexpr int kSteps = decltype(cute::size(acc_s))::value / 16;
  static_assert(decltype(cute::size(probs))::value == 16 * kSteps);
  uint32_t* words = reinterpret_cast<uint32_t*>(probs.data());
  CUTE_UNROLL
  for (int step = 0; step < kSteps; ++step) {
    auto c = [&](int i) { return acc_s(16 * step + i); };
    words[4 * step + 0] = e4m3x4(c(0), c(1), c(4), c(5));      // row r, keys 2t.. of 0-15
    words[4 * step + 1] = e4m3x4(c(2), c(3), c(6), c(7));      // row r + 8
    words[4 * step + 2] = e4m3x4(c(8), c(9), c(12), c(13));    // row r, keys 16-31
    words[4 * step + 3] = e4m3x4(c(10), c(11), c(14), c(15));  // row r + 8
  }
}

// The register fragment quantize_probs_e4m3 fills: ((4,2,2), 1, BlockN/32),
// as the e4m3 A operand of one consumer warpgroup's P V product.
template <class Traits>
using ProbsE4m3 = decltype(cute::make_tensor<typename Traits::InputElement>(
    cute::Layout<cute::Shape<cute::Shape<cute::_4, cute::_2, cute::_2>, cute::_1,
                             cute::Int<Traits::kBlockN / 32>>>{}));

// Per-tensor or per-head scales: the one factor of a query head's scores
// (the softmax scale in the log2 domain times q's and k's scales), and v's.
__device__ __forceinline__ float fp8_qk_scale_log2(FwdParams const& p, int head) {
  const bool per_head = p.kv_scale_per_head != 0;
  return p.scale_log2 * kv_scale(p.q_scale_ptr, p.q_scale, per_head, head) *
         kv_scale(p.k_scale_ptr, p.k_scale, per_head, head / p.head_group);
}

__device__ __forceinline__ float fp8_v_scale(FwdParams const& p, int head) {
  return kv_scale(p.v_scale_ptr, p.v_scale, p.kv_scale_per_head != 0, head / p.head_group);
}

// Per-block scales (p.fp8_block_scales): q's change every 128 rows, so each
// row of a consumer thread has its own, kept in registers for the query
// tile; k's and v's change with the key tile's block and are read per tile.
// O then holds values in units of the latest tile's v scale and is rescaled
// whenever that moves, like a moved row maximum.
template <int Rows>
struct Fp8RowScales {
  float q_log2[Rows];  // the softmax scale (log2 domain) times q's scale

  template <class Work, class Coords>
  __device__ __forceinline__ void start(FwdParams const& p, Work const& work,
                                        Coords const& rows_cols) {
    const int64_t base =
        (int64_t(work.tile.batch) * p.nhead_q + work.tile.head) * p.fp8_q_scale_blocks;
    CUTE_UNROLL
    for (int r = 0; r < Rows; ++r) {
      // Rows past the sequence's end (a 192-row tile's, or a short
      // sequence's) clamp to its last block; their outputs are dropped.
      const int row = work.m_begin + cute::get<0>(rows_cols(r, 0));
      const int block = min(row / kFp8ScaleBlock, p.fp8_q_scale_blocks - 1);
      q_log2[r] = p.scale_log2 * __ldg(p.q_scale_ptr + base + block);
    }
  }
};

// Block scales: k's and v's (x, y) of the key tile from `key` on (a tile
// lies in one block: key tiles of 64 or 128 keys, rules/sm90_fwd.py).
template <class Work>
__device__ __forceinline__ float2 fp8_key_block_scales(FwdParams const& p, Work const& work,
                                                       int key) {
  const int64_t at = (int64_t(work.tile.batch) * (p.nhead_q / p.head_group) +
                      work.tile.head / p.head_group) *
                         p.fp8_kv_scale_blocks +
                     key / kFp8ScaleBlock;
  return make_float2(__ldg(p.k_scale_ptr + at), __ldg(p.v_scale_ptr + at));
}

// V^T from V with the matrix load and store instructions, in units of 16
// keys x 32 head-dim bytes (512 bytes). ldmatrix .trans reads the unit as
// four 8x8 matrices of 16-bit pairs, keys down the rows (keys 0-7 and 8-15,
// bytes 0-15 and 16-31), and hands lane l = 4g + q, from each, the byte
// pairs (2g, 2g + 1) of keys 2q and 2q + 1. Two byte permutes per pair of
// matrices then give the lane, for head-dim bytes 2g and 2g + 1 (and 16 +
// those), the four bytes of keys 2q, 2q + 1, 2q + 8, 2q + 9: exactly V^T's
// 4-byte word at key position 4q of those rows in P's key order (above).
// stmatrix writes four 8x8 matrices of such words, each lane row g of each.
//
// Bank conflicts: ldmatrix's eight rows are eight keys, whose swizzled
// 16-byte chunks differ. stmatrix's eight rows are V^T rows, and the
// swizzle spreads them only if their row numbers differ modulo 8, which
// rows 2g alone (g = 0..7) do not; so lanes g >= 4 swap their even and odd
// words, and matrix 0 takes rows 0, 2, 4, 6, 9, 11, 13, 15, matrix 1 the
// others.
__device__ __forceinline__ uint4 load_matrix_x4_trans(uint32_t address) {
  uint4 r;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "r"(address));
  return r;
}

__device__ __forceinline__ void store_matrix_x4(uint32_t address, uint4 words) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(address),
               "r"(words.x), "r"(words.y), "r"(words.z), "r"(words.w));
}

template <class Tile>
__device__ __forceinline__ uint32_t shared_address(Tile const& tile, int row, int col) {
  return cute::cast_smem_ptr_to_uint(&tile(row, col));
}

// Addresses in a swizzled K-major tile of bytes, `Rows` rows of 8-row
// atoms `AtomCols` bytes wide, stacked down the rows first: element
// (row0 + r, col0 + c) lies at (address of (r, c)) ^ (col0 % AtomCols) plus
// the atom's offset, for row0 a multiple of 8 and col0 a multiple of 16
// whose in-atom bits c does not use. The swizzle XORs the column bits with
// the row's bits within its atom, which row0 leaves alone, so both parts
// are constants of the unit: one operation and an immediate offset per
// address.
template <int Rows, int AtomCols>
struct SwizzledByteTile {
  static constexpr uint32_t kAtomBytes = 8 * AtomCols;

  __device__ __forceinline__ static uint32_t at(uint32_t address_of_rc, int row0, int col0) {
    const uint32_t atom = uint32_t(row0 / 8) * kAtomBytes +
                          uint32_t(col0 / AtomCols) * (Rows / 8) * kAtomBytes;
    return (address_of_rc ^ uint32_t(col0 % AtomCols)) + atom;
  }
};

// One warp's units of a V tile, `Warp` fixed so that every unit's offsets
// are constants. `src` and `dst`: this lane's ldmatrix and stmatrix
// addresses in the unit at keys 0-15 and head-dim bytes 0-31.
template <class Traits, int Warp>
__device__ __forceinline__ void transpose_v_units(uint32_t src, uint32_t dst, uint32_t first,
                                                  uint32_t second) {
  constexpr int kKeyBlocks = Traits::kBlockN / 16;
  constexpr int kUnits = kKeyBlocks * (Traits::kHeadDimV / 32);
  constexpr int kWarps = Traits::kTransposeThreads / 32;
  using V = SwizzledByteTile<Traits::kBlockN, Traits::kVAtomBytes>;
  using Vt = SwizzledByteTile<Traits::kHeadDimV, Traits::kVtAtomBytes>;
  CUTE_UNROLL
  for (int unit = Warp; unit < kUnits; unit += kWarps) {
    const int key0 = 16 * (unit % kKeyBlocks);
    const int col0 = 32 * (unit / kKeyBlocks);
    const uint4 pairs = load_matrix_x4_trans(V::at(src, key0, col0));
    uint4 words;
    words.x = __byte_perm(pairs.x, pairs.y, first);
    words.y = __byte_perm(pairs.x, pairs.y, second);
    words.z = __byte_perm(pairs.z, pairs.w, first);
    words.w = __byte_perm(pairs.z, pairs.w, second);
    store_matrix_x4(Vt::at(dst, col0, key0), words);
  }
}

// One V tile (BlockN keys x HeadDimV bytes) into V^T (HeadDimV x BlockN),
// the units shared round-robin among the transposing warps.
template <class Traits, class TileV, class TileVt>
__device__ __forceinline__ void transpose_v_tile(TileV const& sV, TileVt const& sVt, int warp,
                                                 int lane) {
  static_assert(Traits::kTransposeThreads == 96, "three transposing warps");
  const int matrix = lane / 8, row = lane % 8;
  // The row this lane addresses: ldmatrix's key and byte offset, stmatrix's
  // V^T row (even rows 2 x row in matrices 0 and 2 for rows 0-3, odd ones
  // for rows 4-7; matrices 1 and 3 the other way).
  const int src_key = 8 * (matrix % 2) + row;
  const int src_col = 16 * (matrix / 2);
  const int dst_row = 16 * (matrix / 2) + 2 * row + int((row >= 4) != (matrix % 2 == 1));
  const uint32_t src = shared_address(sV, src_key, src_col);
  const uint32_t dst = shared_address(sVt, dst_row, 0);
  // The words this lane holds: for g < 4 the even row's in matrices 0 and 2.
  const bool upper = lane / 4 >= 4;
  const uint32_t first = upper ? 0x7531u : 0x6420u;
  const uint32_t second = upper ? 0x6420u : 0x7531u;
  if (warp == 0) {
    transpose_v_units<Traits, 0>(src, dst, first, second);
  } else if (warp == 1) {
    transpose_v_units<Traits, 1>(src, dst, first, second);
  } else {
    transpose_v_units<Traits, 2>(src, dst, first, second);
  }
}

// Run by producer warps 1-3 (`thread` 0..95): every V tile of every query
// tile, in the order the TMA thread stages them, from the staging ring sV
// into the ring sVt the consumers read. A staged tile is freed for the next
// copy once transposed; a V^T stage is reused once every consumer warpgroup
// has released it (v_empty), and announced with v_full.
template <class Traits, class SmemV, class SmemVt>
__device__ __forceinline__ void fwd_sm90_transpose_v(FwdSm90Params<Traits> const& params,
                                                     typename Traits::Barriers& bar,
                                                     SmemV const& sV, SmemVt const& sVt,
                                                     int thread) {
  using namespace cute;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using Work = Sm90TileWork<Traits>;
  const int warp = thread / 32;
  const int lane = thread % 32;
  int kv_count = 0;
  for_each_tile(params.order, [&](QueryTile query_tile) {
    const Work work(params.p, query_tile);
    if (!work.has_rows()) return;
    const int n_tiles = work.n_tiles();
    for (int i = 0; i < n_tiles; ++i) {
      const RingSlot slot = ring_slot_of<Traits::kStages>(kv_count + i);
      Barrier::wait(&bar.v_staged[slot.stage], slot.phase);
      Barrier::wait(&bar.v_empty[slot.stage], slot.phase ^ 1);
      transpose_v_tile<Traits>(sV(_, _, slot.stage), sVt(_, _, slot.stage), warp, lane);
      // wgmma reads shared memory through the async proxy.
      cutlass::arch::fence_view_async_shared();
      Barrier::arrive(&bar.v_full[slot.stage]);
      Barrier::arrive(&bar.v_staging_free[slot.stage]);
    }
    kv_count += n_tiles;
  });
}

}  // namespace ckfmha::kernel
