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

// Widens a (Rows, Cols)-byte stage into `tile`, the (Rows, Cols) swizzled
// fp16 tile: each chunk of 16 bytes becomes two 16-byte element vectors
// (the swizzle permutes 8-element vectors only, so each stays contiguous).
template <int Threads, int Rows, int Cols, class Tile>
__device__ __forceinline__ void widen_fp8_tile(uint8_t const* stage, Tile& tile, int tid) {
  using Element = typename Tile::value_type;
  static_assert(std::is_same_v<Element, cutlass::half_t>, "fp8 K/V is widened to fp16");
  constexpr int kChunksPerRow = Cols / 16;
  constexpr int kChunks = Rows * kChunksPerRow;
  static_assert(kChunks % Threads == 0, "whole chunks per thread");
  // Partly unrolled: fully unrolled, the compiler hoists every chunk's shared
  // load ahead of the conversions and runs out of registers.
#pragma unroll 4
  for (int i = 0; i < kChunks / Threads; ++i) {
    const int chunk = tid + i * Threads;
    const int row = chunk / kChunksPerRow;
    const int col = (chunk % kChunksPerRow) * 16;
    const uint4 bytes = *reinterpret_cast<uint4 const*>(stage + row * Cols + col);
    const uint32_t words[4] = {bytes.x, bytes.y, bytes.z, bytes.w};
    uint32_t wide[8];
    CUTE_UNROLL
    for (int w = 0; w < 4; ++w) {
      wide[2 * w] = widen_e4m3_pair(uint16_t(words[w] & 0xffffu));
      wide[2 * w + 1] = widen_e4m3_pair(uint16_t(words[w] >> 16));
    }
    Element* low = &tile(row, col);
    Element* high = &tile(row, col + 8);
    *reinterpret_cast<uint4*>(low) = make_uint4(wide[0], wide[1], wide[2], wide[3]);
    *reinterpret_cast<uint4*>(high) = make_uint4(wide[4], wide[5], wide[6], wide[7]);
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
