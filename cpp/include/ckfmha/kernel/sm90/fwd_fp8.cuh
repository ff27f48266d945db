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

// Four 4-byte words from rows r0..r3 (one byte per column) as four words of
// columns 0..3, each holding its byte of r0..r3 in that order.
__device__ __forceinline__ void transpose_4x4_bytes(uint32_t r0, uint32_t r1, uint32_t r2,
                                                    uint32_t r3, uint32_t (&cols)[4]) {
  const uint32_t lo01 = __byte_perm(r0, r1, 0x5140);  // r0.b0 r1.b0 r0.b1 r1.b1
  const uint32_t hi01 = __byte_perm(r0, r1, 0x7362);  // r0.b2 r1.b2 r0.b3 r1.b3
  const uint32_t lo23 = __byte_perm(r2, r3, 0x5140);
  const uint32_t hi23 = __byte_perm(r2, r3, 0x7362);
  cols[0] = __byte_perm(lo01, lo23, 0x5410);
  cols[1] = __byte_perm(lo01, lo23, 0x7632);
  cols[2] = __byte_perm(hi01, hi23, 0x5410);
  cols[3] = __byte_perm(hi01, hi23, 0x7632);
}

// One V tile (BlockN keys x HeadDimV bytes) into V^T (HeadDimV x BlockN).
// A lane makes one 4-key group of V^T at a time from 16 columns of 4 key
// rows (four 16-byte loads, sixteen 4-byte stores); a warp's stores at one
// instruction fill contiguous bytes of one V^T row, conflict-free. With 64
// keys a warp takes two column blocks at once, with 256 two passes of 32
// groups.
//
// Addresses are cheap: both tiles' swizzle atoms are 8 rows tall and
// stacked down the rows first, so row 8a + r lies at (row 8a's start) +
// (row r's offset in the first atom). A lane computes the 8 V^T offsets of
// its group once per tile, and per column block the offsets of its key rows
// within an atom (key and key + 1; key + 8 and key + 9 are the next atom's).
// 32-bit shared-memory accesses by address: the tiles' generic pointers cost
// 64-bit arithmetic and generic loads, which the producer's few registers
// could not hold.
__device__ __forceinline__ uint32_t load_shared_u32(uint32_t address) {
  uint32_t value;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(value) : "r"(address));
  return value;
}

__device__ __forceinline__ uint4 load_shared_u128(uint32_t address) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(address));
  return v;
}

__device__ __forceinline__ void store_shared_u32(uint32_t address, uint32_t value) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(address), "r"(value));
}

template <class Tile>
__device__ __forceinline__ uint32_t shared_address(Tile const& tile, int row, int col) {
  return cute::cast_smem_ptr_to_uint(&tile(row, col));
}

template <class Traits, class TileV, class TileVt>
__device__ __forceinline__ void transpose_v_tile(TileV const& sV, TileVt const& sVt, int warp,
                                                 int lane) {
  constexpr int kGroups = Traits::kBlockN / 4;
  constexpr int kGroupsPerPass = kGroups < 32 ? kGroups : 32;
  constexpr int kBlocksPerPass = 32 / kGroupsPerPass;
  constexpr int kColumnBlocks = Traits::kHeadDimV / 16;
  constexpr int kWarps = Traits::kTransposeThreads / 32;
  static_assert(kGroups % kGroupsPerPass == 0 && kColumnBlocks % kBlocksPerPass == 0,
                "a pass of a warp covers whole 4-key groups and column blocks");
  const uint32_t v = shared_address(sV, 0, 0);
  const uint32_t vt = shared_address(sVt, 0, 0);
  const uint32_t v_atom_rows = shared_address(sV, 8, 0) - v;
  const uint32_t vt_atom_rows = shared_address(sVt, 8, 0) - vt;
  CUTE_UNROLL
  for (int pass = 0; pass < kGroups / kGroupsPerPass; ++pass) {
    const int group = pass * kGroupsPerPass + lane % kGroupsPerPass;
    const int step = group / 8, quad = group % 8;
    const int key = 32 * step + 16 * (quad / 4) + 2 * (quad % 4);
    uint32_t row_offset[8];
    CUTE_UNROLL
    for (int r = 0; r < 8; ++r) row_offset[r] = shared_address(sVt, r, 4 * group) - vt;
    // The lane's key rows: key and key + 1 (key is even, so both in one
    // atom), and the same two rows of the next atom.
    const uint32_t v_rows = v + uint32_t(key / 8) * v_atom_rows;
#pragma unroll 1
    for (int first = warp * kBlocksPerPass; first < kColumnBlocks;
         first += kWarps * kBlocksPerPass) {
      const int col = 16 * (first + lane / kGroupsPerPass);
      const uint32_t even = v_rows + (shared_address(sV, key % 8, col) - v);
      const uint32_t odd = v_rows + (shared_address(sV, key % 8 + 1, col) - v);
      const uint32_t block = shared_address(sVt, col, 0);
      // All 64 bytes in flight at once, then one 4-byte column of them at a
      // time into V^T.
      const uint4 r0 = load_shared_u128(even), r1 = load_shared_u128(odd);
      const uint4 r2 = load_shared_u128(even + v_atom_rows);
      const uint4 r3 = load_shared_u128(odd + v_atom_rows);
      auto store = [&](int word, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
        uint32_t cols[4];
        transpose_4x4_bytes(a, b, c, d, cols);
        CUTE_UNROLL
        for (int j = 0; j < 4; ++j) {
          const int r = 4 * word + j;
          store_shared_u32(block + (r / 8) * vt_atom_rows + row_offset[r % 8], cols[j]);
        }
      };
      store(0, r0.x, r1.x, r2.x, r3.x);
      store(1, r0.y, r1.y, r2.y, r3.y);
      store(2, r0.z, r1.z, r2.z, r3.z);
      store(3, r0.w, r1.w, r2.w, r3.w);
    }
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
