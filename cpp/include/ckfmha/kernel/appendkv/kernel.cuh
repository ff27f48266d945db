// fwd_appendkv: writes new K/V tokens into a KV cache (contiguous or paged),
// rotating the keys (and optionally queries) by their cache position.
//
// Memory-bound: each thread moves 16-byte vectors. A CTA owns TokensPerCta
// tokens of one (batch, head): blockIdx.y < nhead_k picks a K/V head, the
// rest (when q is rotated) a query head. Each thread first loads all of its
// vectors, then (after a barrier in query CTAs, where q may be rotated in
// place and a half-rotated pair is read by two threads) rotates and stores
// them, so a thread keeps several loads in flight.
//
// Half-rotated RoPE pairs column j with j +- rotary_dim/2: the thread writing
// a vector also loads its partner vector, so every output vector is one
// thread's work; the partner is read by its own thread too, from L1.
//
// fp8 caches (Traits::kCacheFp8): each output vector is divided by its
// tensor's scale and written as 8 e4m3 bytes, the form the split-KV body's
// fp8 K/V reads (common/fp8_kv.cuh).
#pragma once

#include <cuda_fp8.h>
#include <cutlass/numeric_types.h>

#include <cstdint>
#include <type_traits>

namespace ckfmha::kernel {

enum class RopeMode { kNone, kInterleaved, kHalfRotated };

// Everything the kernel reads, in elements (strides) and 64-bit where a
// product can exceed 2^31.
struct AppendKvParams {
  void const* k_new;
  void const* v_new;
  void* k_cache;
  void* v_cache;
  int32_t const* cache_seqlens;
  int32_t const* block_table;
  void const* cos;
  void const* sin;
  void const* q;
  void* q_out;
  int32_t* overflow;

  int64_t k_new_stride[3];  // (batch, head, seq)
  int64_t v_new_stride[3];
  int64_t k_cache_stride[3];  // (batch or page, head, seq)
  int64_t v_cache_stride[3];
  int64_t q_stride[3];
  int64_t q_out_stride[3];
  int64_t block_table_stride;
  int64_t cos_stride;
  int64_t sin_stride;
  int64_t capacity;  // tokens per sequence the cache holds

  int nhead_k;
  int seqlen_new;
  int nhead_q;  // 0 unless q is rotated
  int seqlen_q;
  int page_size;
  int num_pages;
  int rotary_dim;
  int rope_max_pos;
  bool rope_fp32;  // cos/sin are fp32 (else the element type)
  // Paged caches in vLLM's vectorized layout: cache strides are (page, head,
  // 8-channel chunk) for K and (page, head, channel) for V.
  bool vectorized_pages;
  // fp8 caches: the scales the caches' codes are multiplied by (the device
  // arrays' entry for the head, one value or one per head, else the scalars).
  float const* k_scale_ptr;
  float const* v_scale_ptr;
  float k_scale, v_scale;
  bool scale_per_head;
};

template <class Element_, int HeadDimK, int HeadDimV, RopeMode Rope, bool Paged,
          int TokensPerCta, int Warps, bool CacheFp8 = false>
struct FwdAppendKvTraits {
  using Element = Element_;
  static constexpr bool kCacheFp8 = CacheFp8;
  static_assert(!CacheFp8 || sizeof(Element) == 2, "fp8 caches take fp16 or bf16 tokens");
  static constexpr int kHeadDimK = HeadDimK;
  static constexpr int kHeadDimV = HeadDimV;
  static constexpr RopeMode kRope = Rope;
  static constexpr bool kPaged = Paged;
  static constexpr int kTokensPerCta = TokensPerCta;
  static constexpr int kThreads = Warps * 32;
  static constexpr int kVecElems = 16 / int(sizeof(Element));
  static constexpr int kKVecs = HeadDimK / kVecElems;
  static constexpr int kVVecs = HeadDimV / kVecElems;
  static constexpr int kRowVecs = kKVecs + kVVecs;
  // Vectors per thread: K and V rows of the token tile, or q rows.
  static constexpr int kKvItems = (TokensPerCta * kRowVecs + kThreads - 1) / kThreads;
  static constexpr int kQItems = (TokensPerCta * kKVecs + kThreads - 1) / kThreads;
  static_assert(HeadDimK % kVecElems == 0 && HeadDimV % kVecElems == 0,
                "head dims are whole 16-byte vectors");
  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                    std::is_same_v<Element, cutlass::bfloat16_t> || std::is_same_v<Element, float>,
                "fp16, bf16 or fp32");
};

namespace appendkv {

template <class Element>
struct alignas(16) Vec {
  Element x[16 / sizeof(Element)];
};

template <class Element>
__device__ __forceinline__ Vec<Element> load(Element const* ptr) {
  return *reinterpret_cast<Vec<Element> const*>(ptr);
}

// k_new and v_new are never written by the kernel: the read-only path.
template <class Element>
__device__ __forceinline__ Vec<Element> load_readonly(Element const* ptr) {
  const uint4 bits = __ldg(reinterpret_cast<uint4 const*>(ptr));
  Vec<Element> v;
  static_assert(sizeof(v) == sizeof(bits));
  memcpy(&v, &bits, sizeof(v));
  return v;
}

template <class Element>
__device__ __forceinline__ void store(Element* ptr, Vec<Element> const& v) {
  *reinterpret_cast<Vec<Element>*>(ptr) = v;
}

// An 8-element vector as e4m3 codes of v / scale (the division correctly
// rounded, then to nearest even, saturating at +-448), stored as 8 bytes.
template <class Element>
__device__ __forceinline__ void store_e4m3(uint8_t* ptr, Vec<Element> const& v, float scale) {
  static_assert(sizeof(Vec<Element>) == 16 && sizeof(Element) == 2, "8 elements per vector");
  uint16_t pairs[4];
#pragma unroll
  for (int e = 0; e < 8; e += 2) {
    const float2 scaled = make_float2(__fdiv_rn(float(v.x[e]), scale),
                                      __fdiv_rn(float(v.x[e + 1]), scale));
    pairs[e / 2] = __nv_cvt_float2_to_fp8x2(scaled, __NV_SATFINITE, __NV_E4M3);
  }
  *reinterpret_cast<uint2*>(ptr) = make_uint2(uint32_t(pairs[0]) | (uint32_t(pairs[1]) << 16),
                                              uint32_t(pairs[2]) | (uint32_t(pairs[3]) << 16));
}

// The scale of `head` for an fp8 cache: the device array's entry, else the scalar.
__device__ __forceinline__ float cache_scale(float const* device_scales, float scalar,
                                             bool per_head, int head) {
  if (device_scales == nullptr) return scalar;
  return __ldg(device_scales + (per_head ? head : 0));
}

template <class Element>
__device__ __forceinline__ float angle_entry(void const* table, bool fp32, int64_t index) {
  return fp32 ? static_cast<float const*>(table)[index]
              : float(static_cast<Element const*>(table)[index]);
}

// A skipped token is reported once per vector; any value but 0 means "some".
__device__ __forceinline__ void flag_overflow(AppendKvParams const& p) {
  if (p.overflow != nullptr) *reinterpret_cast<int32_t volatile*>(p.overflow) = 1;
}

// Rotates the vector at head-dim column `col` of a row at cache position
// `pos`; `partner` is the vector rotary_dim/2 columns away (half-rotated only).
template <class Traits>
__device__ __forceinline__ Vec<typename Traits::Element> rotate(
    Vec<typename Traits::Element> own, Vec<typename Traits::Element> const& partner, int col,
    int64_t pos, AppendKvParams const& p) {
  using Element = typename Traits::Element;
  constexpr int kVec = Traits::kVecElems;
  if constexpr (Traits::kRope == RopeMode::kInterleaved) {
    const int64_t cos_row = pos * p.cos_stride, sin_row = pos * p.sin_stride;
#pragma unroll
    for (int e = 0; e < kVec; e += 2) {
      const int j = col + e;
      if (j >= p.rotary_dim) break;
      const float c = angle_entry<Element>(p.cos, p.rope_fp32, cos_row + j / 2);
      const float s = angle_entry<Element>(p.sin, p.rope_fp32, sin_row + j / 2);
      const float x = float(own.x[e]), y = float(own.x[e + 1]);
      own.x[e] = Element(x * c - y * s);
      own.x[e + 1] = Element(x * s + y * c);
    }
  } else if constexpr (Traits::kRope == RopeMode::kHalfRotated) {
    const int half = p.rotary_dim / 2;
    if (col < p.rotary_dim) {
      // Whole vectors lie on one side of half (half is a multiple of kVec).
      const bool first = col < half;
      const int64_t cos_row = pos * p.cos_stride, sin_row = pos * p.sin_stride;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const int i = (first ? col : col - half) + e;
        const float c = angle_entry<Element>(p.cos, p.rope_fp32, cos_row + i);
        const float s = angle_entry<Element>(p.sin, p.rope_fp32, sin_row + i);
        const float x = float(own.x[e]), y = float(partner.x[e]);
        // (x_i, x_{i+half}) -> (x_i c - x_{i+half} s, x_i s + x_{i+half} c)
        own.x[e] = Element(first ? x * c - y * s : x * c + y * s);
      }
    }
  }
  return own;
}

template <class Traits>
__device__ __forceinline__ bool needs_partner(int col, AppendKvParams const& p) {
  return Traits::kRope == RopeMode::kHalfRotated && col < p.rotary_dim;
}

template <class Traits>
__device__ __forceinline__ int partner_col(int col, AppendKvParams const& p) {
  const int half = p.rotary_dim / 2;
  return col < half ? col + half : col - half;
}

// Where the cache row of sequence `batch` at `pos` lives: (batch or page,
// token within it). False (and nothing is written) when the position, its
// page or its angle row is out of range.
template <class Traits>
__device__ __forceinline__ bool locate_cache_row(AppendKvParams const& p, int batch, int64_t pos,
                                                 int64_t* slab, int64_t* token) {
  if (pos < 0 || pos >= p.capacity) return false;
  if (Traits::kRope != RopeMode::kNone && pos >= p.rope_max_pos) return false;
  if constexpr (Traits::kPaged) {
    const int32_t page = p.block_table[batch * p.block_table_stride + pos / p.page_size];
    if (page < 0 || page >= p.num_pages) return false;
    *slab = page;
    *token = pos % p.page_size;
  } else {
    *slab = batch;
    *token = pos;
  }
  return true;
}

template <class Traits>
__device__ void append_rows(AppendKvParams const& p, int batch, int head, int token0,
                            int64_t length) {
  using Element = typename Traits::Element;
  constexpr int kVec = Traits::kVecElems;
  constexpr int kItems = Traits::kKvItems;
  constexpr int kTotal = Traits::kTokensPerCta * Traits::kRowVecs;
  Vec<Element> own[kItems], partner[kItems];
  bool valid[kItems];
  float k_scale = 1.f, v_scale = 1.f;
  if constexpr (Traits::kCacheFp8) {
    k_scale = cache_scale(p.k_scale_ptr, p.k_scale, p.scale_per_head, head);
    v_scale = cache_scale(p.v_scale_ptr, p.v_scale, p.scale_per_head, head);
  }

  // All loads of new tokens first: they depend on nothing but the item, so a
  // thread has kItems (or twice that) 16-byte loads in flight at once.
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int item = int(threadIdx.x) + k * Traits::kThreads;
    const int t = token0 + item / Traits::kRowVecs;
    valid[k] = item < kTotal && t < p.seqlen_new;
    if (!valid[k]) continue;
    const int vec = item % Traits::kRowVecs;
    const bool is_k = vec < Traits::kKVecs;
    const int col = (is_k ? vec : vec - Traits::kKVecs) * kVec;
    int64_t const* stride = is_k ? p.k_new_stride : p.v_new_stride;
    Element const* src = static_cast<Element const*>(is_k ? p.k_new : p.v_new) +
                         batch * stride[0] + head * stride[1] + t * stride[2];
    own[k] = load_readonly(src + col);
    if (is_k && needs_partner<Traits>(col, p)) {
      partner[k] = load_readonly(src + partner_col<Traits>(col, p));
    }
  }
  // Vectorized pages keep each V channel's keys contiguous: V rows go through
  // shared memory (rows padded by one 4-byte word, so that the threads reading
  // one channel of consecutive tokens hit distinct banks) and leave token by
  // token, consecutive threads on consecutive tokens of one channel.
  constexpr bool kVectorizable = Traits::kPaged && sizeof(Element) == 2 && !Traits::kCacheFp8;
  constexpr int kTileRow = Traits::kHeadDimV + 2;
  __shared__ Element v_tile[kVectorizable ? Traits::kTokensPerCta * kTileRow : 1];
  const bool stage_v = kVectorizable && p.vectorized_pages;
  // Then where each row goes (a block-table read for pages), and the stores.
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    if (!valid[k]) continue;
    const int item = int(threadIdx.x) + k * Traits::kThreads;
    const int t = token0 + item / Traits::kRowVecs;
    const int vec = item % Traits::kRowVecs;
    const bool is_k = vec < Traits::kKVecs;
    const int col = (is_k ? vec : vec - Traits::kKVecs) * kVec;
    const int64_t pos = length + t;
    int64_t slab = 0, token = 0;
    if (!locate_cache_row<Traits>(p, batch, pos, &slab, &token)) {
      flag_overflow(p);
      continue;
    }
    int64_t const* stride = is_k ? p.k_cache_stride : p.v_cache_stride;
    Element* row = static_cast<Element*>(is_k ? p.k_cache : p.v_cache) + slab * stride[0] +
                   head * stride[1];
    // Values are never rotated.
    const Vec<Element> out = is_k ? rotate<Traits>(own[k], partner[k], col, pos, p) : own[k];
    if constexpr (Traits::kCacheFp8) {
      // Linear layouts only (the runtime refuses fp8 vectorized pages); strides are bytes.
      uint8_t* bytes = static_cast<uint8_t*>(is_k ? p.k_cache : p.v_cache) + slab * stride[0] +
                       head * stride[1] + token * stride[2] + col;
      store_e4m3(bytes, out, is_k ? k_scale : v_scale);
    } else if (!Traits::kPaged || !p.vectorized_pages) {
      store(row + token * stride[2] + col, out);
    } else if (is_k) {
      // A key's 8-channel chunk is one vector: chunk col / 8, slot `token`.
      store(row + (col / kVec) * stride[2] + token * kVec, out);
    } else if (stage_v) {
      Element* tile_row = v_tile + (t - token0) * kTileRow + col;
#pragma unroll
      for (int e = 0; e < kVec; ++e) tile_row[e] = out.x[e];
    }
  }
  if (stage_v) {
    __syncthreads();
    const int tokens = min(Traits::kTokensPerCta, p.seqlen_new - token0);
    Element* v_head = static_cast<Element*>(p.v_cache) + head * p.v_cache_stride[1];
    for (int idx = int(threadIdx.x); idx < Traits::kTokensPerCta * Traits::kHeadDimV;
         idx += Traits::kThreads) {
      const int t = idx % Traits::kTokensPerCta;
      const int channel = idx / Traits::kTokensPerCta;
      int64_t slab = 0, token = 0;
      // Rows that fail here were flagged by the loop above.
      if (t >= tokens || !locate_cache_row<Traits>(p, batch, length + token0 + t, &slab, &token)) {
        continue;
      }
      v_head[slab * p.v_cache_stride[0] + channel * p.v_cache_stride[2] + token] =
          v_tile[t * kTileRow + channel];
    }
  }
}

template <class Traits>
__device__ void rotate_q_rows(AppendKvParams const& p, int batch, int head, int token0,
                              int64_t length) {
  using Element = typename Traits::Element;
  constexpr int kVec = Traits::kVecElems;
  constexpr int kItems = Traits::kQItems;
  constexpr int kTotal = Traits::kTokensPerCta * Traits::kKVecs;
  // In place, columns past rotary_dim keep their values and are not rewritten.
  const bool in_place = p.q_out == p.q;
  Vec<Element> own[kItems], partner[kItems];
  Element* dst[kItems];
  int col[kItems];
  int64_t pos[kItems];

#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    dst[k] = nullptr;
    const int item = int(threadIdx.x) + k * Traits::kThreads;
    const int t = token0 + item / Traits::kKVecs;
    if (item >= kTotal || t >= p.seqlen_q) continue;
    col[k] = item % Traits::kKVecs * kVec;
    pos[k] = length + t;
    if (pos[k] < 0 || pos[k] >= p.rope_max_pos) {
      flag_overflow(p);
      continue;
    }
    if (in_place && col[k] >= p.rotary_dim) continue;
    Element const* src = static_cast<Element const*>(p.q) + batch * p.q_stride[0] +
                         head * p.q_stride[1] + t * p.q_stride[2];
    dst[k] = static_cast<Element*>(p.q_out) + batch * p.q_out_stride[0] +
             head * p.q_out_stride[1] + t * p.q_out_stride[2] + col[k];
    own[k] = load(src + col[k]);
    if (needs_partner<Traits>(col[k], p)) partner[k] = load(src + partner_col<Traits>(col[k], p));
  }
  // In place, a half-rotated pair's two vectors are each read by both of
  // their threads: every read happens before any write.
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    if (dst[k] == nullptr) continue;
    store(dst[k], rotate<Traits>(own[k], partner[k], col[k], pos[k], p));
  }
}

}  // namespace appendkv

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads)
    fwd_appendkv_kernel(__grid_constant__ const AppendKvParams p) {
  const int batch = int(blockIdx.z);
  const int token0 = int(blockIdx.x) * Traits::kTokensPerCta;
  const int64_t length = p.cache_seqlens[batch];
  if (int(blockIdx.y) < p.nhead_k) {
    // Uniform over the CTA: append_rows may reach a barrier.
    if (token0 < p.seqlen_new) {
      appendkv::append_rows<Traits>(p, batch, int(blockIdx.y), token0, length);
    }
  } else if (token0 < p.seqlen_q) {
    // The whole CTA takes this branch, so its barrier is reached by all threads.
    appendkv::rotate_q_rows<Traits>(p, batch, int(blockIdx.y) - p.nhead_k, token0, length);
  }
}

}  // namespace ckfmha::kernel
