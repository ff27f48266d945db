// Dropout in the Hopper backward main stage: which of a warpgroup's (key,
// query) pairs the forward kept, recomputed from the forward's Philox stream
// (common/philox_dropout.cuh).
//
// A warpgroup's tile spans one 64-key block of the stream and `Queries` query
// rows; a generator call covers 16 keys of one row there, so the tile needs
// Queries * 4 calls. A thread's own elements (two keys eight apart, over 16
// or 8 queries) would take one call per two of them, each call repeated by
// the eight threads that share it. Instead each thread makes Queries * 4 / 128
// of the calls, stores their 16 bytes in shared memory, and after a barrier of
// the warpgroup reads the words its elements lie in.
//
// Layout: row q of the tile holds 16 words: call g's word w (bytes 4w..4w+3,
// keys j with (j % 8) / 2 == g and (j % 64) / 16 == w) at position
// ((g ^ s) * 4 + (w ^ s)), s = (q / 2) % 4. A warp's reads then cover 16
// distinct banks in each row pair (its lanes take four query pairs and four
// calls), where the unswizzled order put every lane of a call on one bank.
#pragma once

#include "ckfmha/kernel/common/philox_dropout.cuh"

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <cstdint>

namespace ckfmha::kernel {

template <int Queries>
struct BwdSm90DropoutTile {
  static constexpr int kWordsPerRow = 16;
  static constexpr int kWords = Queries * kWordsPerRow;
  static constexpr int kCalls = Queries * 4;
  static_assert(kCalls % 128 == 0, "every thread of the warpgroup makes the same number of calls");

  __device__ __forceinline__ static int swizzle(int query) { return (query >> 1) & 3; }

  // Run by the warpgroup's 128 threads (`thread` from 0): the calls of the
  // tile whose first key is `key0` (a multiple of 64) and first query
  // `query0`, into `words`; returns once every thread's words are stored
  // (named barrier `barrier_id` of the warpgroup).
  __device__ __forceinline__ static void generate(PhiloxDropout const& stream, uint32_t* words,
                                                  int thread, int key0, int query0,
                                                  uint32_t barrier_id) {
    CUTE_UNROLL
    for (int n = thread; n < kCalls; n += 128) {
      const int q = n >> 2, g = n & 3;
      const uint4 w = stream.stream_words(query0 + q, key0 + 2 * g);
      const uint32_t word[4] = {w.x, w.y, w.z, w.w};
      const int s = swizzle(q);
      const uint4 stored = make_uint4(word[s], word[1 ^ s], word[2 ^ s], word[3 ^ s]);
      *reinterpret_cast<uint4*>(words + q * kWordsPerRow + ((g ^ s) << 2)) = stored;
    }
    cutlass::arch::NamedBarrier::sync(128, barrier_id);
  }

  // Bit i * cols + j set where element (i, j) of this thread's (keys,
  // queries) fragment was kept; `coords` gives each element's (key, query)
  // within the CTA's tile, whose keys start on a 64-key block and whose
  // warpgroup tile starts at query `query0`. A thread's two keys are a
  // wgmma accumulator's rows r and r + 8 of a 16-row block: for each query
  // they lie in one word (bytes b and b + 2), read once.
  template <class Coords>
  __device__ __forceinline__ static uint32_t keep_bits(uint32_t const* words,
                                                       Coords const& coords, int query0,
                                                       uint32_t threshold) {
    using namespace cute;
    constexpr int kRows = decltype(size<0>(coords))::value;
    constexpr int kCols = decltype(size<1>(coords))::value;
    static_assert(kRows == 2 && kRows * kCols <= 32,
                  "two keys eight apart per thread, one bit per element in a 32-bit mask");
    // The same two keys in every column; the byte each takes in the word.
    const int key = get<0>(coords(0, 0)), second_key = get<0>(coords(1, 0));
    const int g = (key & 7) >> 1, w = (key & 63) >> 4;
    auto byte_shift = [](int k) { return 8 * ((((k & 15) >> 3) << 1) | (k & 1)); };
    const int shift = byte_shift(key), second_shift = byte_shift(second_key);
    const uint32_t threshold4 = threshold * 0x01010101u;  // threshold < 256
    uint32_t bits = 0;
    CUTE_UNROLL
    for (int j = 0; j < kCols; ++j) {
      const int q = get<1>(coords(0, j)) - query0, s = swizzle(q);
      const uint32_t word = words[q * kWordsPerRow + ((g ^ s) << 2) + (w ^ s)];
      // 0xff in each byte at least the threshold.
      const uint32_t kept = __vcmpgeu4(word, threshold4);
      bits |= ((kept >> shift) & 1u) << j;
      bits |= ((kept >> second_shift) & 1u) << (kCols + j);
    }
    return bits;
  }
};

}  // namespace ckfmha::kernel
