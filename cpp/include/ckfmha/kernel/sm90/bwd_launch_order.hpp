// How many (KV head, batch) pairs each chunk of a causal Hopper backward grid
// takes (bwd_sm90_key_tile has the order itself). Host-only arithmetic, so
// that the choice can be read and checked without a device.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace ckfmha::kernel {

// Query rows a CTA walks, summed over a pair's key tiles, and the most any
// one key tile walks: under a causal mask key tile j sees the rows from
// j * block_n - offset on (offset: seqlen_k - seqlen_q when aligned
// bottom-right, else 0), so its walk shortens by block_n rows a tile.
struct CausalKeyTileWork {
  double rows_per_pair;
  double longest_rows;
};

inline CausalKeyTileWork causal_key_tile_work(int seqlen_q, int seqlen_k, int block_n,
                                              bool bottom_right) {
  const int64_t offset = bottom_right ? int64_t(seqlen_k) - seqlen_q : 0;
  const int64_t key_tiles = (int64_t(seqlen_k) + block_n - 1) / block_n;
  // Key tile j walks clamp(seqlen_q + offset - j * block_n, 0, seqlen_q) rows:
  // all of them while j * block_n <= offset, then fewer by block_n a tile.
  const int64_t full = offset < 0 ? 0 : std::min(key_tiles, offset / block_n + 1);
  const int64_t reach = seqlen_q + offset;  // rows + offset: > 0 while a tile sees a row
  const int64_t seen = reach <= 0 ? 0 : std::min(key_tiles, (reach + block_n - 1) / block_n);
  const int64_t partial = std::max<int64_t>(0, seen - full);
  // Sum of reach - j * block_n over j in [full, seen).
  const double partial_rows =
      double(partial) * double(reach) - double(block_n) * double(full + seen - 1) * partial / 2.0;
  return {double(full) * seqlen_q + partial_rows,
          double(std::clamp<int64_t>(reach, 0, seqlen_q))};
}

// The (KV head, batch) pairs of a causal grid in chunks: full_chunks of
// chunk_pairs pairs, then one of last_pairs. Within a chunk the CTAs launch
// key tile by key tile over its pairs, the longest first; with one pair a
// chunk that is grid order (each pair's key tiles in turn).
struct BwdSm90CausalChunks {
  int chunk_pairs;  // 0: the grid's own (key tiles, KV heads, batch) order
  int last_pairs;
  int full_chunks;
  int64_t ctas;     // pairs * key tiles
};

// wave_chunks: chunks of about one wave of CTAs, so that the Q, dO and dQ
// rows in use at a time stay as few as in grid order (bwd_sm90_key_tile
// says where they pay); otherwise one pair a chunk.
//
// An SM takes the next CTA when its own ends, so a chunk's short CTAs
// overlap the next chunk's long ones and only the last chunk leaves a tail:
// its longest CTAs start with only that chunk's work left for the other
// SMs. In grid order that chunk is a single pair, whose longest CTA walks
// every query row, and GQA pairs are long (a CTA walks all the query heads
// of its group). So after one-pair chunks the last chunk takes the fewest
// pairs whose work per SM covers their longest CTA. Merged that way after
// wave-sized chunks it lost up to 30% at d128-d256 (GQA, 2k-8k tokens) as
// often as it won (NOTES 93), so those keep a remainder for a last chunk.
inline BwdSm90CausalChunks bwd_sm90_causal_chunks(int64_t pairs, int key_tiles, int sms,
                                                  bool wave_chunks, CausalKeyTileWork work) {
  const int64_t ctas = pairs * key_tiles;
  if (pairs <= 1 || key_tiles <= 0 || sms <= 0 || ctas > int64_t(INT32_MAX)) {
    return {0, 0, 0, ctas};
  }
  const int64_t chunk = wave_chunks ? std::clamp<int64_t>(sms / key_tiles, 1, pairs) : 1;
  if (chunk > 1) {
    const int64_t full_chunks = (pairs - 1) / chunk;
    return {int(chunk), int(pairs - full_chunks * chunk), int(full_chunks), ctas};
  }
  if (work.rows_per_pair <= 0.0) return {0, 0, 0, ctas};
  const double needed = double(sms) * work.longest_rows / work.rows_per_pair;
  const int64_t last = std::clamp<int64_t>(int64_t(std::ceil(needed)), 1, pairs);
  return {1, int(last), int(pairs - last), ctas};
}

}  // namespace ckfmha::kernel
