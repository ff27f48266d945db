// The paged K/V address mode of the sm80 forward body (Traits::kPagedKv,
// families fwd_pagedkv and batch_prefill).
//
// The K and V caches are [num_pages, page_size, nhead_k, hdim] ("linear"
// pages, vLLM's flash layout) with strides (page, head, token in page); a
// sequence's keys are the tokens of its pages in table order. Its page ids
// come from a vLLM block table (row b of [batch, max_pages_per_seq]) or from
// SGLang's flat kv_indices[kv_indptr[b] .. kv_indptr[b + 1]).
//
// A key tile's rows are gathered row by row: each thread looks up the page of
// every row it copies and issues its 16-byte cp.async vectors from there, so
// any power-of-two page size works (1 key per page up to whole tiles per
// page) with one code path, and K and V rows share the lookup. Offsets are
// 64-bit (page id x page stride alone passes 2^31 in a large cache). Rows
// past the sequence are zero-filled and their table entries never read:
// entries past a sequence's last page may hold anything.
//
// "Vectorized" pages (vLLM's older layout, Traits::kVColMajor on a paged
// body) hold K as [pages, nhead_k, hdim / 8, page_size, 8] and V as [pages,
// nhead_k, hdim, page_size] (2-byte elements: 8 make a 16-byte vector). A
// key's 8-channel K chunk is still one 16-byte vector, so K keeps the row
// gather with a chunk stride in place of the element stride. V keeps each
// channel's keys contiguous: it is loaded as V^T, (hdim, keys) tiles read
// 8 keys per vector, which is the column-major-V shared-memory layout the
// P V product already reads with plain ldmatrix.
#pragma once

#include "ckfmha/kernel/common/device_errors.cuh"
#include "ckfmha/kernel/common/sequence_slice.cuh"
#include "ckfmha/kernel/params/fwd_params.h"

#include <cute/tensor.hpp>

#include <cstdint>

namespace ckfmha::kernel {

__device__ __forceinline__ bool page_in_pool(int32_t id, FwdParams const& p) {
  return static_cast<uint32_t>(id) < static_cast<uint32_t>(p.num_pages);
}

// One sequence's pages.
struct PagedKeys {
  const int32_t* pages;  // this sequence's page ids, in key order
  int page_shift;        // log2(page_size)
  int batch;             // the sequence, for the error report

  // The table's entry for `token`, unchecked.
  __device__ __forceinline__ int32_t page_id(int token) const {
    return __ldg(pages + (token >> page_shift));
  }
  // The page holding `token`, or -1 (reported) when the table names a page
  // outside the caches: that key is then read as zeros, never from the table's
  // address.
  __device__ __forceinline__ int64_t page(int token, FwdParams const& p) const {
    const int32_t id = page_id(token);
    if (!page_in_pool(id, p)) {
      report_device_error(p.errors, &DeviceErrors::page_id, batch);
      return -1;
    }
    return id;
  }
  __device__ __forceinline__ int slot(int token) const {
    return token & ((1 << page_shift) - 1);
  }
};

// The sequence a paged CTA serves and its pages. Queries as in
// locate_sequence (group mode: cu_seqlens_q, checked against total_q and
// seqlen_q); keys: seqlens_k[b] when given, else every key of the sequence's
// pages. A kv_indptr range outside kv_indices, or a key count outside what
// the sequence's pages hold, skips the sequence and is reported: its table
// entries are then never read.
template <bool IsGroupMode>
__device__ __forceinline__ SequenceSlice locate_paged_sequence(FwdParams const& p, int batch,
                                                               PagedKeys* keys) {
  SequenceSlice seq = locate_queries<IsGroupMode>(p, batch);
  if (seq.skip) return seq;
  int64_t page_count;
  if (p.kv_indptr != nullptr) {
    const int64_t first = p.kv_indptr[batch], next = p.kv_indptr[batch + 1];
    if (!range_fits(first, next, p.num_kv_indices, p.num_kv_indices)) {
      report_device_error(p.errors, &DeviceErrors::key_count, batch);
      return skipped_sequence();
    }
    page_count = next - first;
    keys->pages = p.kv_indices + first;
  } else {
    page_count = p.max_pages_per_seq;
    keys->pages = p.block_table + int64_t(batch) * p.block_table_stride;
  }
  keys->page_shift = p.page_size_log2;
  keys->batch = batch;
  const int64_t capacity = page_count << p.page_size_log2;
  const int64_t wanted = p.seqlens_k != nullptr ? int64_t(p.seqlens_k[batch]) : capacity;
  if (wanted < 0 || wanted > capacity) {
    report_device_error(p.errors, &DeviceErrors::key_count, batch);
    return skipped_sequence();
  }
  seq.seqlen_k = int(wanted);
  return seq;
}

// Gathers key tile rows [n_begin, n_begin + rows) of K and V through the page
// table into one shared-memory stage each. k_dst/v_dst/coords: 16-byte-vector
// copy partitions of the K and V tiles and of their identity tensor (K and V
// have the same head dim, so one partition's rows serve both); k_head/v_head:
// the caches at this K/V head. Ragged: rows at or past seqlen_k are
// zero-filled, as are rows whose page id is out of range.
template <bool Ragged, class Element, class KDst, class VDst, class Coords>
__device__ __forceinline__ void load_paged_kv(KDst& k_dst, VDst& v_dst, Coords const& coords,
                                              PagedKeys const& keys, Element const* k_head,
                                              Element const* v_head, FwdParams const& p,
                                              int n_begin, int seqlen_k) {
  using namespace cute;
  static_assert(decltype(size<0>(k_dst))::value * sizeof(Element) == 16, "one 16-byte vector");
  static_assert(decltype(size<1>(k_dst))::value == decltype(size<1>(v_dst))::value &&
                    decltype(size<2>(k_dst))::value == decltype(size<2>(v_dst))::value,
                "K and V tiles are partitioned alike");
  bool bad_page = false;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(k_dst); ++m) {
    const int token = n_begin + get<0>(coords(0, m, 0));
    // Rows past the sequence (ragged tiles only) never read their table entry.
    const bool in_seq = !Ragged || token < seqlen_k;
    const int32_t id = in_seq ? keys.page_id(token) : 0;
    const bool read = in_seq && page_in_pool(id, p);
    bad_page |= in_seq && !read;
    // A row not read is zero-filled by the copy itself (source size 0): no
    // branch, so every row's vectors issue alike. Its address is clamped into
    // the pool anyway (one min: negative ids are huge unsigned), so no copy is
    // ever given an address outside the caches. Paged caches keep the page
    // stride where contiguous ones keep the batch stride.
    const int64_t page = min(static_cast<uint32_t>(id), static_cast<uint32_t>(p.num_pages) - 1u);
    const int64_t slot = keys.slot(token);
    Element const* k_row = k_head + page * p.k_batch_stride + slot * p.k_row_stride;
    Element const* v_row = v_head + page * p.v_batch_stride + slot * p.v_row_stride;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(k_dst); ++k) {
      const int col = get<1>(coords(0, m, k));
      SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint128_t>::copy(
          *reinterpret_cast<uint128_t const*>(k_row + col),
          *reinterpret_cast<uint128_t*>(raw_pointer_cast(k_dst(_, m, k).data())), read);
      SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint128_t>::copy(
          *reinterpret_cast<uint128_t const*>(v_row + col),
          *reinterpret_cast<uint128_t*>(raw_pointer_cast(v_dst(_, m, k).data())), read);
    }
  }
  if (bad_page) report_device_error(p.errors, &DeviceErrors::page_id, keys.batch);
}

// Vectorized pages: gathers key tile rows [n_begin, n_begin + kBlockN) of K
// (k_dst/k_coords: the row-gather partition of the K tile, as above; p.k_row_stride
// is the stride between 8-channel chunks) and of V^T (vt_dst/vt_coords: a
// 16-byte-vector partition of the (hdim, keys) tile; p.v_row_stride is the
// channel stride) into one stage each.
//
// A V vector is 8 consecutive keys of one channel. With pages of 8 or more
// keys (powers of two) such a vector never crosses a page, so it is one
// cp.async from the page; the vector straddling seqlen_k, and every vector
// of smaller pages, is read key by key with a page lookup each, and keys at
// or past seqlen_k, or on out-of-range pages, are zero-filled (their page
// slots may hold anything, and 0 * NaN would poison O). Those scalar shared stores are synchronous, so
// the barrier that publishes the cp.async data publishes them too.
template <bool Ragged, class Element, class KDst, class KCoords, class VtDst, class VtCoords>
__device__ __forceinline__ void load_vectorized_paged_kv(KDst& k_dst, KCoords const& k_coords,
                                                         VtDst& vt_dst, VtCoords const& vt_coords,
                                                         PagedKeys const& keys,
                                                         Element const* k_head,
                                                         Element const* v_head,
                                                         FwdParams const& p, int n_begin,
                                                         int seqlen_k) {
  using namespace cute;
  constexpr int kVec = 16 / int(sizeof(Element));
  static_assert(decltype(size<0>(k_dst))::value == kVec &&
                    decltype(size<0>(vt_dst))::value == kVec,
                "one 16-byte vector: 8 channels of K, 8 keys of V");
  CUTE_UNROLL
  for (int m = 0; m < size<1>(k_dst); ++m) {
    const int token = n_begin + get<0>(k_coords(0, m, 0));
    const int64_t page = !Ragged || token < seqlen_k ? keys.page(token, p) : -1;
    if (page >= 0) {
      Element const* k_key = k_head + page * p.k_batch_stride + int64_t(keys.slot(token)) * kVec;
      CUTE_UNROLL
      for (int k = 0; k < size<2>(k_dst); ++k) {
        const int64_t chunk = get<1>(k_coords(0, m, k)) / kVec;
        SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>::copy(
            *reinterpret_cast<uint128_t const*>(k_key + chunk * p.k_row_stride),
            *reinterpret_cast<uint128_t*>(raw_pointer_cast(k_dst(_, m, k).data())));
      }
    } else {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(k_dst); ++k) clear(k_dst(_, m, k));
    }
  }
  const bool whole_page_vectors = keys.page_shift >= 3;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(vt_dst); ++k) {
    // Every vector of a thread's column slice k covers the same 8 keys (the
    // copy's threads tile the key columns, its value steps walk the channels).
    const int token = n_begin + get<1>(vt_coords(0, 0, k));
    const int keys_in_seq = seqlen_k - token;
    // -2: read key by key below; -1: an out-of-range page, read as zeros.
    const int64_t page = whole_page_vectors && (!Ragged || keys_in_seq >= kVec)
                             ? keys.page(token, p)
                             : -2;
    if (page >= 0) {
      Element const* v_keys = v_head + page * p.v_batch_stride + keys.slot(token);
      CUTE_UNROLL
      for (int m = 0; m < size<1>(vt_dst); ++m) {
        const int64_t channel = get<0>(vt_coords(0, m, k));
        SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>::copy(
            *reinterpret_cast<uint128_t const*>(v_keys + channel * p.v_row_stride),
            *reinterpret_cast<uint128_t*>(raw_pointer_cast(vt_dst(_, m, k).data())));
      }
    } else if (page == -1) {
      CUTE_UNROLL
      for (int m = 0; m < size<1>(vt_dst); ++m) clear(vt_dst(_, m, k));
    } else {
      // Rare (the sequence's last vector, or pages under 8 keys): kept rolled
      // so it adds no registers to the common path.
#pragma unroll 1
      for (int i = 0; i < kVec; ++i) {
        const int key = token + i;
        const int64_t key_page = i < keys_in_seq ? keys.page(key, p) : -1;
        if (key_page >= 0) {
          Element const* v_key = v_head + key_page * p.v_batch_stride + keys.slot(key);
          CUTE_UNROLL
          for (int m = 0; m < size<1>(vt_dst); ++m) {
            vt_dst(i, m, k) = v_key[int64_t(get<0>(vt_coords(0, m, k))) * p.v_row_stride];
          }
        } else {
          CUTE_UNROLL
          for (int m = 0; m < size<1>(vt_dst); ++m) vt_dst(i, m, k) = Element(0.f);
        }
      }
    }
  }
}

}  // namespace ckfmha::kernel
