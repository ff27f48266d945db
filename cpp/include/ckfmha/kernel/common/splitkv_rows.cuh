// Pieces the split-KV variant of the sm80 forward kernel adds to its body.
//
// Rows: a split-KV CTA serves one K/V head and packs the query heads that
// share it (GQA) into the tile's rows, query position major: tile row r is
// query (m_begin + r) / group of head head0 + (m_begin + r) % group. A decode
// step (seqlen_q 1..8) of a group of 4-8 heads then fills one 16- to 64-row
// tile and reads each K/V tile once for the whole group, which is what a
// memory-bound decode needs. With group 1 the rows are plain query positions.
//
// Keys: split s of S visits key tiles [s*n/S, (s+1)*n/S) of the sequence's n
// tiles (intersected with what the mask leaves visible) and writes its result
// normalised by its own softmax sum, plus that sum's LSE, to the workspace
// (params/splitkv_workspace.h); fwd_splitkv_combine merges the S partials exactly.
// A split that sees no visible key writes O = 0 and LSE = -inf. With S = 1
// the one split's result is already exact: it goes straight to O and LSE and
// the plan has no combine stage and no workspace.
#pragma once

#include "ckfmha/kernel/params/fwd_params.h"

#include <cute/tensor.hpp>

#include <cstdint>

namespace ckfmha::kernel {

struct PackedRows {
  int m_begin;  // first packed row of the tile
  int group;    // query heads per K/V head
  int head0;    // first query head of the group

  __device__ __forceinline__ int query(int tile_row) const { return (m_begin + tile_row) / group; }
  __device__ __forceinline__ int head(int tile_row) const {
    return head0 + (m_begin + tile_row) % group;
  }
  // Query positions [first, first + count) the tile's rows touch: what the
  // mask's tile-level bounds are computed over.
  __device__ __forceinline__ int first_query() const { return m_begin / group; }
  __device__ __forceinline__ int query_count(int block_m) const {
    return (m_begin + block_m - 1) / group - m_begin / group + 1;
  }
};

// This split's key tiles: [first, last) of the sequence's tiles, intersected
// with the mask's visible range [*n_first, *n_last). Empty leaves n_last == n_first.
__device__ __forceinline__ void clip_to_split(int split, int num_splits, int seqlen_k, int block_n,
                                              int* n_first, int* n_last) {
  const int tiles = (seqlen_k + block_n - 1) / block_n;
  const int first = int(int64_t(split) * tiles / num_splits);
  const int last = int(int64_t(split + 1) * tiles / num_splits);
  *n_first = max(*n_first, first);
  *n_last = max(*n_first, min(*n_last, last));
}

// Gathers the tile's Q rows, each from its own head and position, with one
// 16-byte cp.async per thread vector; rows past the sequence are zero-filled.
// dst/coords: a 16-byte-vector copy partition of the Q tile and of its identity
// tensor; q_seq: the sequence's first token (head 0).
template <class Element, class Dst, class Coords>
__device__ __forceinline__ void load_packed_rows(Dst& dst, Coords const& coords,
                                                 PackedRows const& rows, Element const* q_seq,
                                                 int64_t head_stride, int64_t row_stride,
                                                 int seqlen_q) {
  using namespace cute;
  static_assert(decltype(size<0>(dst))::value * sizeof(Element) == 16, "one 16-byte vector");
  CUTE_UNROLL
  for (int m = 0; m < size<1>(dst); ++m) {
    const int tile_row = get<0>(coords(0, m, 0));
    const int query = rows.query(tile_row);
    Element const* row = q_seq + rows.head(tile_row) * head_stride + int64_t(query) * row_stride;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(dst); ++k) {
      if (query < seqlen_q) {
        SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>::copy(
            *reinterpret_cast<uint128_t const*>(row + get<1>(coords(0, m, k))),
            *reinterpret_cast<uint128_t*>(raw_pointer_cast(dst(_, m, k).data())));
      } else {
        clear(dst(_, m, k));
      }
    }
  }
}

// Writes the normalised fp32 O rows and their LSE of this split. out/coords:
// (rows, cols) views of the O accumulator and of its identity tensor, whose
// columns come in adjacent pairs (the mma.sync C fragment), stored as float2.
template <int HeadDimV, int Rows, class Out, class Coords>
__device__ __forceinline__ void store_split_partials(FwdParams const& p, Out const& out,
                                                     Coords const& coords,
                                                     float const (&lse)[Rows],
                                                     PackedRows const& rows, int split, int batch,
                                                     int seqlen_q) {
  using namespace cute;
  static_assert(decltype(size<1>(out))::value % 2 == 0, "columns come in pairs");
  const int64_t rows_per_split = int64_t(p.batch) * p.nhead_q * p.seqlen_q;
  CUTE_UNROLL
  for (int i = 0; i < Rows; ++i) {
    const int tile_row = get<0>(coords(i, 0));
    const int query = rows.query(tile_row);
    if (query >= seqlen_q) continue;
    const int64_t index = split * rows_per_split +
                          (int64_t(batch) * p.nhead_q + rows.head(tile_row)) * p.seqlen_q + query;
    if (get<1>(coords(i, 0)) == 0) p.partial_lse[index] = lse[i];  // one lane per quad
    float* o_row = p.partial_o + index * HeadDimV;
    CUTE_UNROLL
    for (int j = 0; j < size<1>(out); j += 2) {
      *reinterpret_cast<float2*>(o_row + get<1>(coords(i, j))) =
          make_float2(out(i, j), out(i, j + 1));
    }
  }
}

// Writes the tile's rows straight to O (in Element) and LSE: the one-split
// plan, whose normalised rows need no merge. out/coords as for
// store_split_partials; o_seq/lse_seq: the sequence's first token (head 0) in
// O and LSE (lse_seq nullptr when no LSE is asked for).
template <class Element, int Rows, class Out, class Coords>
__device__ __forceinline__ void store_packed_output(FwdParams const& p, Out const& out,
                                                    Coords const& coords,
                                                    float const (&lse)[Rows],
                                                    PackedRows const& rows, Element* o_seq,
                                                    float* lse_seq, int seqlen_q) {
  using namespace cute;
  static_assert(decltype(size<1>(out))::value % 2 == 0, "columns come in pairs");
  using Pair = cute::array<Element, 2>;
  CUTE_UNROLL
  for (int i = 0; i < Rows; ++i) {
    const int tile_row = get<0>(coords(i, 0));
    const int query = rows.query(tile_row);
    if (query >= seqlen_q) continue;
    const int head = rows.head(tile_row);
    if (lse_seq != nullptr && get<1>(coords(i, 0)) == 0) {  // one lane per quad
      lse_seq[head * p.lse_head_stride + query] = lse[i];
    }
    Element* o_row = o_seq + head * p.o_head_stride + int64_t(query) * p.o_row_stride;
    CUTE_UNROLL
    for (int j = 0; j < size<1>(out); j += 2) {
      *reinterpret_cast<Pair*>(o_row + get<1>(coords(i, j))) =
          Pair{Element(out(i, j)), Element(out(i, j + 1))};
    }
  }
}

}  // namespace ckfmha::kernel
