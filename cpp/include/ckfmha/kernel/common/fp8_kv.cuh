// fp8 (e4m3) K/V tiles of the split-KV body (Traits::kKvFp8): key rows land
// as bytes in row-major shared-memory stages, then every thread widens its
// 16-byte chunks into the swizzled fp16 K and V tiles the tensor-core
// products read (one cvt per pair; bf16 queries are rescaled into fp16 once
// per CTA, queries_to_half). Each e4m3 value is exact in fp16 (3 mantissa
// bits, exponents 2^-9..2^8), so widening loses nothing; the dequantisation
// scales are applied to the scores and the output instead, once per element
// of S and O rather than once per element of K and V.
#pragma once

#include "ckfmha/kernel/params/fwd_params.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include <cstdint>
#include <type_traits>

namespace ckfmha::kernel {

// The scale of this K/V head: the device array's entry (one value, or one per
// K/V head), else the problem's scalar.
__device__ __forceinline__ float kv_scale(float const* device_scales, float scalar,
                                          bool per_head, int head_k) {
  if (device_scales == nullptr) return scalar;
  return __ldg(device_scales + (per_head ? head_k : 0));
}

// Two e4m3 values (low byte first) as two fp16 values in one word.
__device__ __forceinline__ uint32_t widen_e4m3_pair(uint16_t pair) {
  const __half2_raw halves = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
  return uint32_t(halves.x) | (uint32_t(halves.y) << 16);
}

// cp.async of 16 bytes that zero-fills when `read` is false (the source is
// then not touched, though it must still be a global address).
__device__ __forceinline__ void copy_16_bytes_or_zero(void* smem_dst, void const* gmem_src,
                                                      bool read) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t smem_addr = cute::cast_smem_ptr_to_uint(smem_dst);
  const int src_bytes = read ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr),
               "l"(gmem_src), "r"(src_bytes));
#endif
}

// Loads one key tile's K and V rows, (Rows, ColsK) and (Rows, ColsV) bytes,
// into their byte stages (row-major). `row_source(r)` gives key row r's K and
// V addresses and whether to read them (false: zero-filled). Threads take
// consecutive 16-byte chunks, so a warp's shared-memory writes are
// conflict-free; with equal widths a thread's K and V chunks share a row, so
// each row is looked up once (a page-table read, for paged caches).
template <int Threads, int Rows, int ColsK, int ColsV, class RowSource>
__device__ __forceinline__ void load_fp8_kv_tiles(uint8_t* k_stage, uint8_t* v_stage,
                                                  RowSource const& row_source, int tid) {
  auto load = [&](auto cols, auto part) {
    constexpr int kCols = decltype(cols)::value;
    constexpr int kPart = decltype(part)::value;  // 0: K and V, 1: K only, 2: V only
    constexpr int kChunksPerRow = kCols / 16;
    constexpr int kChunks = Rows * kChunksPerRow;
    static_assert(kCols % 16 == 0 && kChunks % Threads == 0, "whole chunks per thread");
    CUTE_UNROLL
    for (int i = 0; i < kChunks / Threads; ++i) {
      const int chunk = tid + i * Threads;
      const int row = chunk / kChunksPerRow;
      const int col = (chunk % kChunksPerRow) * 16;
      auto const [k_row, v_row, read] = row_source(row);
      if constexpr (kPart != 2) copy_16_bytes_or_zero(k_stage + row * kCols + col, k_row + col, read);
      if constexpr (kPart != 1) copy_16_bytes_or_zero(v_stage + row * kCols + col, v_row + col, read);
    }
  };
  if constexpr (ColsK == ColsV) {
    load(cute::Int<ColsK>{}, cute::Int<0>{});
  } else {
    load(cute::Int<ColsK>{}, cute::Int<1>{});
    load(cute::Int<ColsV>{}, cute::Int<2>{});
  }
}

// Where one thread's 16-byte chunks of a widened tile lie, made once per
// kernel. Threads take consecutive chunks, so a thread's chunks share their
// columns and sit kRowsPerPass rows apart: in the byte stage (row-major)
// each pass is a constant step on, and in the swizzled element tile (8-row
// atoms stacked down the rows, swizzled by the row within its atom) the
// offsets repeat every kPeriod passes, a whole number of atoms further.
// With the widening's address arithmetic out of the loop, the conversions
// and the shared-memory accesses are most of what is left.
template <int Threads, int Rows, int Cols>
struct Fp8WidenPlan {
  static constexpr int kChunksPerRow = Cols / 16;
  static_assert(Cols % 16 == 0 && Threads % kChunksPerRow == 0, "whole rows per pass");
  static constexpr int kRowsPerPass = Threads / kChunksPerRow;
  static constexpr int kPasses = Rows * kChunksPerRow / Threads;
  static_assert(Rows * kChunksPerRow % Threads == 0, "whole chunks per thread");
  // Passes until a thread's rows are back at the same place in their atoms.
  static constexpr int kPeriod = kRowsPerPass % 8 == 0   ? 1
                                 : kRowsPerPass % 4 == 0 ? 2
                                 : kRowsPerPass % 2 == 0 ? 4
                                                         : 8;
  static constexpr uint32_t kStageStep = uint32_t(kRowsPerPass * Cols);

  uint32_t stage_offset;         // pass 0's chunk in the byte stage
  uint32_t tile_offset[kPeriod][2];  // passes 0..kPeriod-1: the low and high 8 elements
  uint32_t tile_step;            // kPeriod passes further down the element tile

  template <class Tile>
  __device__ __forceinline__ Fp8WidenPlan(Tile const& tile, int tid) {
    static_assert(std::is_same_v<typename Tile::value_type, cutlass::half_t>,
                  "fp8 K/V is widened to fp16");
    auto at = [&](int row, int col) { return cute::cast_smem_ptr_to_uint(&tile(row, col)); };
    const uint32_t origin = at(0, 0);
    const int row = tid / kChunksPerRow;
    const int col = (tid % kChunksPerRow) * 16;
    stage_offset = uint32_t(row * Cols + col);
    CUTE_UNROLL
    for (int i = 0; i < kPeriod; ++i) {
      tile_offset[i][0] = at(row + i * kRowsPerPass, col) - origin;
      tile_offset[i][1] = at(row + i * kRowsPerPass, col + 8) - origin;
    }
    tile_step = at(kPeriod * kRowsPerPass, 0) - origin;
  }
};

__device__ __forceinline__ uint4 load_shared_16_bytes(uint32_t address) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(address));
  return v;
}

__device__ __forceinline__ void store_shared_16_bytes(uint32_t address, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(address), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w));
}

// Widens a (Rows, Cols)-byte stage at shared address `stage` into the
// swizzled fp16 tile at `tile` (the tile `plan` was made from): each chunk
// of 16 bytes becomes two 16-byte element vectors (the swizzle permutes
// 8-element vectors only, so each stays contiguous).
template <class Plan>
__device__ __forceinline__ void widen_fp8_tile(uint32_t stage, uint32_t tile, Plan const& plan) {
  constexpr int kPeriod = Plan::kPeriod;
  // Unrolled a few passes at a time: fully unrolled, the compiler hoists
  // every chunk's shared load ahead of the conversions and runs out of
  // registers.
  constexpr int kUnroll = Plan::kPasses < 4 ? Plan::kPasses : (kPeriod > 4 ? kPeriod : 4);
  static_assert(Plan::kPasses % kUnroll == 0 && kUnroll % kPeriod == 0);
  uint32_t src = stage + plan.stage_offset;
  uint32_t dst = tile;
#pragma unroll 1
  for (int block = 0; block < Plan::kPasses / kUnroll; ++block) {
    CUTE_UNROLL
    for (int j = 0; j < kUnroll; ++j) {
      const uint4 bytes = load_shared_16_bytes(src + j * Plan::kStageStep);
      const uint32_t words[4] = {bytes.x, bytes.y, bytes.z, bytes.w};
      uint32_t wide[8];
      CUTE_UNROLL
      for (int w = 0; w < 4; ++w) {
        wide[2 * w] = widen_e4m3_pair(uint16_t(words[w] & 0xffffu));
        wide[2 * w + 1] = widen_e4m3_pair(uint16_t(words[w] >> 16));
      }
      const uint32_t atoms = dst + (j / kPeriod) * plan.tile_step;
      store_shared_16_bytes(atoms + plan.tile_offset[j % kPeriod][0],
                            make_uint4(wide[0], wide[1], wide[2], wide[3]));
      store_shared_16_bytes(atoms + plan.tile_offset[j % kPeriod][1],
                            make_uint4(wide[4], wide[5], wide[6], wide[7]));
    }
    src += kUnroll * Plan::kStageStep;
    dst += (kUnroll / kPeriod) * plan.tile_step;
  }
}

// 2^e as a float, for e in [-126, 127]: exact, where exp2f under fast math
// is an approximation.
__device__ __forceinline__ float power_of_two(int e) { return __int_as_float((127 + e) << 23); }

// Rescales the CTA's bf16 query tile (Count values at `q`, in place, any
// order) into fp16 by 2^shift, putting its largest magnitude in [2^14, 2^15):
// fp16 keeps every bf16 mantissa bit from 2^-14 up, so only values more than
// 2^28 below the largest lose bits, and they move a score by less than that.
// Returns 2^-shift, which takes the scale back out of the scores. `scratch`:
// a float per warp of shared memory nobody reads or writes until the next
// barrier after this returns.
template <int Threads, int Count>
__device__ __forceinline__ float queries_to_half(cutlass::bfloat16_t* q, float* scratch,
                                                 int tid) {
  constexpr int kVec = 8;  // bf16 per 16-byte vector
  static_assert(Count % (kVec * Threads) == 0, "whole vectors per thread");
  constexpr int kWarps = Threads / 32;
  constexpr int kMaxShift = 100;  // 2^(14 +- 100) stays a normal float
  auto* vectors = reinterpret_cast<uint4*>(q);
  float amax = 0.f;
  CUTE_UNROLL
  for (int i = 0; i < Count / (kVec * Threads); ++i) {
    const uint4 bits = vectors[tid + i * Threads];
    auto const* values = reinterpret_cast<__nv_bfloat162 const*>(&bits);
    CUTE_UNROLL
    for (int j = 0; j < 4; ++j) {
      const float2 pair = __bfloat1622float2(values[j]);
      amax = fmaxf(amax, fmaxf(fabsf(pair.x), fabsf(pair.y)));
    }
  }
  CUTE_UNROLL
  for (int offset = 16; offset > 0; offset /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  }
  if constexpr (kWarps > 1) {
    if (tid % 32 == 0) scratch[tid / 32] = amax;
    __syncthreads();
    CUTE_UNROLL
    for (int w = 0; w < kWarps; ++w) amax = fmaxf(amax, scratch[w]);
  }
  // NaN or infinite queries keep their scale and stay NaN or infinite.
  const int shift = amax > 0.f && amax <= 3.0e38f
                        ? max(-kMaxShift, min(kMaxShift, 14 - ilogbf(amax)))
                        : 0;
  const float up = power_of_two(shift);
  CUTE_UNROLL
  for (int i = 0; i < Count / (kVec * Threads); ++i) {
    uint4 bits = vectors[tid + i * Threads];
    auto const* values = reinterpret_cast<__nv_bfloat162 const*>(&bits);
    uint32_t halves[4];
    CUTE_UNROLL
    for (int j = 0; j < 4; ++j) {
      const float2 pair = __bfloat1622float2(values[j]);
      const __half2 scaled = __floats2half2_rn(pair.x * up, pair.y * up);
      halves[j] = reinterpret_cast<uint32_t const&>(scaled);
    }
    vectors[tid + i * Threads] = make_uint4(halves[0], halves[1], halves[2], halves[3]);
  }
  return power_of_two(-shift);
}

}  // namespace ckfmha::kernel
