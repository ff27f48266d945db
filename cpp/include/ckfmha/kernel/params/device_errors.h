// Out-of-range device metadata a kernel met, recorded for the host.
//
// A kernel cannot raise. When a sequence range, page id or key count read
// from device memory would take it outside the caller's buffers, it reads
// and writes nothing there (the sequence is skipped, the page's keys are
// zeros, the appended token is dropped) and stores 1 + the batch index in
// the slot of that kind. The record lives in mapped, pinned host memory (one
// per device, see runtime/device_errors.hpp), so the host reads it with a
// plain load, without a copy or a synchronisation, at the start of the next
// call on that device and in ckfmha_check_device_errors, and turns a set
// slot into CKFMHA_ERROR_DEVICE_METADATA.
//
// Plain stores, not atomics: any one offending batch index is enough for the
// message, and a store to host memory needs no system-scope atomic support.
#pragma once

#include <cstdint>

namespace ckfmha::kernel {

struct DeviceErrors {
  // cu_seqlens_q/k[b..b+1] not within [0, total_q/k], decreasing, or longer
  // than max_seqlen_q/k (the grid and the workspaces are sized by those).
  int32_t sequence_range;
  // A block-table or kv_indices entry outside [0, num_pages).
  int32_t page_id;
  // seqlens_k[b] outside [0, the keys its pages hold], or
  // kv_indptr[b..b+1] not within [0, num_kv_indices] or decreasing.
  int32_t key_count;
  // fwd_appendkv without args.overflow: a new token's cache position, page
  // or angle row was out of range (the token was not written). Holds 1.
  int32_t append_position;
};

}  // namespace ckfmha::kernel
