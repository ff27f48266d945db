// Dropout on the probabilities with a counter-based generator (Philox4x32-10),
// so any element's random byte can be recomputed from (seed, offset, b, h, i, j)
// alone: reproducible across launches, tile shapes and devices.
//
// Element (b, h, i, j) takes byte stream_byte(j) of Philox with key
// (seed_lo, seed_hi ^ offset_hi) and counter (stream_block(j), i,
// b * nhead_q + h, offset_lo); the four output words are read as 16
// little-endian bytes. One generator call covers, in a 64-key block of one
// row, the 16 keys j with the same (j % 8) / 2: exactly the keys one lane of
// an MMA accumulator quad holds there (pairs of neighbouring keys every 8),
// so a thread calls the generator once per 16 of its elements rather than
// four lanes computing the same call.
#pragma once

#include <cute/tensor.hpp>

#include <cstdint>

namespace ckfmha::kernel {

struct Philox4x32 {
  static constexpr uint32_t kMul0 = 0xD2511F53u;
  static constexpr uint32_t kMul1 = 0xCD9E8D57u;
  static constexpr uint32_t kWeyl0 = 0x9E3779B9u;
  static constexpr uint32_t kWeyl1 = 0xBB67AE85u;

  __device__ __forceinline__ static uint4 generate(uint4 counter, uint32_t key0, uint32_t key1) {
    CUTE_UNROLL
    for (int round = 0; round < 10; ++round) {
      uint32_t hi0 = __umulhi(kMul0, counter.x);
      uint32_t lo0 = kMul0 * counter.x;
      uint32_t hi1 = __umulhi(kMul1, counter.z);
      uint32_t lo1 = kMul1 * counter.z;
      counter = make_uint4(hi1 ^ counter.y ^ key0, lo1, hi0 ^ counter.w ^ key1, lo0);
      key0 += kWeyl0;
      key1 += kWeyl1;
    }
    return counter;
  }
};

// The generator call of key j in its row, and which of its 16 bytes j takes.
__device__ __forceinline__ uint32_t stream_block(int col) {
  return uint32_t((col >> 6) * 4 + ((col & 7) >> 1));
}
__device__ __forceinline__ int stream_byte(int col) { return ((col & 63) >> 3) * 2 + (col & 1); }

__device__ __forceinline__ uint32_t random_byte(uint4 words, int byte) {
  uint32_t word = byte < 8 ? (byte < 4 ? words.x : words.y) : (byte < 12 ? words.z : words.w);
  return (word >> ((byte & 3) * 8)) & 0xffu;
}

struct PhiloxDropout {
  uint32_t key0, key1, offset;
  uint32_t threshold;   // drop iff byte < threshold
  uint32_t head_index;  // b * nhead_q + h
  uint8_t* randval;     // optional: this (b, h)'s [seqlen_q, seqlen_k] plane, row stride ld
  int64_t randval_ld;
  int seqlen_q, seqlen_k;

  // This (batch, head)'s stream for one sequence; random bytes, if asked
  // for, land in the [batch, nhead_q, seqlen_q, seqlen_k] plane of the
  // launch's padded sizes whatever the sequence's own lengths. Params:
  // FwdParams, a template parameter so that dropout needs neither direction's
  // parameter header.
  template <class Params>
  __device__ __forceinline__ static PhiloxDropout for_sequence(Params const& p, int seq_q,
                                                                int seq_k, int batch, int head) {
    PhiloxDropout d{p.philox_key0, p.philox_key1, p.philox_offset, p.dropout_threshold,
                    uint32_t(batch * p.nhead_q + head), nullptr, int64_t(p.seqlen_k), seq_q,
                    seq_k};
    if (p.dropout_randval != nullptr) {
      d.randval = p.dropout_randval +
                  (int64_t(batch) * p.nhead_q + head) * p.seqlen_q * int64_t(p.seqlen_k);
    }
    return d;
  }

  // The forward's stream again, for the backward (which never stores bytes);
  // Params: BwdParams, which carries the same seed fields.
  template <class Params>
  __device__ __forceinline__ static PhiloxDropout for_backward(Params const& p, int seq_q,
                                                                int seq_k, int batch, int head) {
    return PhiloxDropout{p.philox_key0, p.philox_key1, p.philox_offset, p.dropout_threshold,
                         uint32_t(batch * p.nhead_q + head), nullptr, int64_t(p.seqlen_k),
                         seq_q, seq_k};
  }

  // The generator call that holds the byte of key `col` in row `row`.
  __device__ __forceinline__ uint4 stream_words(int row, int col) const {
    return Philox4x32::generate(make_uint4(stream_block(col), uint32_t(row), head_index, offset),
                                key0, key1);
  }

  // Which elements of a (rows, cols) fragment the forward kept: bit i * cols + j
  // set for element (i, j). One Philox call per ColumnGroup columns, as in apply().
  template <int ColumnGroup = 4, class Coords>
  __device__ __forceinline__ uint64_t keep_bits(Coords const& coords, int m_begin,
                                                int n_begin) const {
    using namespace cute;
    constexpr int kRows = decltype(size<0>(coords))::value;
    constexpr int kCols = decltype(size<1>(coords))::value;
    static_assert(kRows * kCols <= 64 && kCols % ColumnGroup == 0);
    uint64_t bits = 0;
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      int row = m_begin + get<0>(coords(i, 0));
      CUTE_UNROLL
      for (int j0 = 0; j0 < kCols; j0 += ColumnGroup) {
        uint4 words = stream_words(row, n_begin + get<1>(coords(i, j0)));
        CUTE_UNROLL
        for (int j = j0; j < j0 + ColumnGroup; ++j) {
          int col = n_begin + get<1>(coords(i, j));
          if (random_byte(words, stream_byte(col)) >= threshold) {
            bits |= uint64_t(1) << (i * kCols + j);
          }
        }
      }
    }
    return bits;
  }

  // apply() for the Hopper forward's wgmma accumulators, whose (rows, cols)
  // view holds in fragment columns 16g .. 16g + 15 of a row exactly the 16
  // keys of one generator call, in byte order (a lane holds key pairs every 8
  // keys: stream_byte(key) == column % 16; the GPU tests compare every stored
  // byte with the reference stream). One call per 16 probabilities, its bytes
  // compared four at a time into a 64-bit keep mask. The calls run in a loop
  // that is not unrolled: unrolled, ptxas interleaved them and spilled the
  // consumers' accumulators.
  template <class Probs, class Coords>
  __device__ __forceinline__ void apply_per_call(Probs& probs, Coords const& coords,
                                                 int m_begin, int n_begin) const {
    using namespace cute;
    constexpr int kRows = decltype(size<0>(probs))::value;
    constexpr int kCols = decltype(size<1>(probs))::value;
    constexpr int kCalls = kCols / 16;
    static_assert(kRows * kCols <= 64 && kCols % 16 == 0);
    const uint32_t threshold4 = threshold * 0x01010101u;  // threshold < 256
    uint64_t keep = 0;
#pragma unroll 1
    for (int call = 0; call < kRows * kCalls; ++call) {
      const int i = call / kCalls;
      const int j0 = call % kCalls * 16;
      const int row = m_begin + get<0>(coords(i, 0));
      const uint4 words = stream_words(row, n_begin + get<1>(coords(i, j0)));
      const uint32_t word[4] = {words.x, words.y, words.z, words.w};
      uint32_t kept = 0;  // bit b: byte b is at least the threshold
      CUTE_UNROLL
      for (int w = 0; w < 4; ++w) {
        // __vcmpgeu4 sets each byte to 0xff where kept; the multiply gathers
        // the four top bits into bits 28-31.
        const uint32_t top = __vcmpgeu4(word[w], threshold4) & 0x80808080u;
        kept |= (top * 0x00204081u >> 28) << (4 * w);
      }
      keep |= uint64_t(kept) << (i * kCols + j0);
      if (randval != nullptr) {
        CUTE_UNROLL
        for (int j = 0; j < 16; ++j) {
          const int col = n_begin + get<1>(coords(i, j0 + j));
          if (row < seqlen_q && col < seqlen_k) {
            randval[int64_t(row) * randval_ld + col] = uint8_t(random_byte(words, j));
          }
        }
      }
    }
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      CUTE_UNROLL
      for (int j = 0; j < kCols; ++j) {
        if (((keep >> (i * kCols + j)) & 1u) == 0) probs(i, j) = 0.f;
      }
    }
  }

  // probs/coords: (rows, cols) views. The columns a thread holds come in
  // groups of ColumnGroup consecutive fragment columns of one generator call,
  // so one call serves a group: four on the mma.sync path (two 8-wide MMA
  // atoms), two on the SIMT path (keys 8 apart).
  template <int ColumnGroup = 4, class Probs, class Coords>
  __device__ __forceinline__ void apply(Probs& probs, Coords const& coords, int m_begin,
                                        int n_begin) const {
    using namespace cute;
    static_assert(decltype(size<1>(probs))::value % ColumnGroup == 0);
    CUTE_UNROLL
    for (int i = 0; i < size<0>(probs); ++i) {
      int row = m_begin + get<0>(coords(i, 0));
      CUTE_UNROLL
      for (int j0 = 0; j0 < size<1>(probs); j0 += ColumnGroup) {
        uint4 words = stream_words(row, n_begin + get<1>(coords(i, j0)));
        CUTE_UNROLL
        for (int j = j0; j < j0 + ColumnGroup; ++j) {
          int col = n_begin + get<1>(coords(i, j));
          uint32_t byte = random_byte(words, stream_byte(col));
          if (randval != nullptr && row < seqlen_q && col < seqlen_k) {
            randval[int64_t(row) * randval_ld + col] = uint8_t(byte);
          }
          if (byte < threshold) probs(i, j) = 0.f;
        }
      }
    }
  }
};

}  // namespace ckfmha::kernel
