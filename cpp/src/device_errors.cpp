#include "ckfmha/runtime/device_errors.hpp"

#include "ckfmha/kernel/params/device_errors.h"
#include "ckfmha/runtime/device.hpp"
#include "ckfmha/runtime/status.hpp"

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <mutex>
#include <string>

namespace ckfmha::runtime {

namespace {

using kernel::DeviceErrors;

// Records are never freed: kernels of any stream may still write to one
// while the process runs, and a record is 16 bytes per device.
constexpr int kMaxDevices = 64;
std::array<std::atomic<DeviceErrors*>, kMaxDevices> g_records{};
std::mutex g_allocate;

// The record of `device`, or null if none was made (nothing was launched there).
DeviceErrors* existing_record(int device) {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  return g_records[device].load(std::memory_order_acquire);
}

int record_for(int device, DeviceErrors** out) {
  if (device < 0 || device >= kMaxDevices) {
    return fail(CKFMHA_ERROR_UNSUPPORTED, "device " + std::to_string(device) +
                                              " is past the " + std::to_string(kMaxDevices) +
                                              " devices ckfmha keeps error records for");
  }
  if ((*out = existing_record(device)) != nullptr) return CKFMHA_SUCCESS;
  std::lock_guard<std::mutex> lock(g_allocate);
  if ((*out = existing_record(device)) != nullptr) return CKFMHA_SUCCESS;
  // Mapped: kernels store into it directly; portable: any context can map
  // it. With unified addressing the host pointer is also the device pointer.
  void* host = nullptr;
  cudaError_t err =
      cudaHostAlloc(&host, sizeof(DeviceErrors), cudaHostAllocMapped | cudaHostAllocPortable);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return fail(CKFMHA_ERROR_CUDA, std::string("cudaHostAlloc of the device error record: ") +
                                       cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
  auto* record = static_cast<DeviceErrors*>(host);
  *record = DeviceErrors{};
  g_records[device].store(record, std::memory_order_release);
  *out = record;
  return CKFMHA_SUCCESS;
}

// Reads and clears one slot; the exchange keeps a store a kernel makes
// between the read and the clear.
int32_t take(int32_t& slot) { return __atomic_exchange_n(&slot, 0, __ATOMIC_SEQ_CST); }

int report(int device, DeviceErrors* record) {
  const int32_t sequence = take(record->sequence_range);
  const int32_t page = take(record->page_id);
  const int32_t keys = take(record->key_count);
  const int32_t append = take(record->append_position);
  if ((sequence | page | keys | append) == 0) return CKFMHA_SUCCESS;
  std::string message = "out-of-range device metadata met by an earlier call's kernels on cuda:" +
                        std::to_string(device) + ":";
  if (sequence != 0) {
    message += " sequence " + std::to_string(sequence - 1) +
               ": cu_seqlens_q/k range outside the packed tensors (total_q/total_k), decreasing, "
               "or longer than max_seqlen_q/k; the sequence was skipped;";
  }
  if (page != 0) {
    message += " sequence " + std::to_string(page - 1) +
               ": a block_table/kv_indices page id outside [0, num_pages); its keys were read "
               "as zeros;";
  }
  if (keys != 0) {
    message += " sequence " + std::to_string(keys - 1) +
               ": seqlens_k outside [0, what its pages hold] or a kv_indptr range outside "
               "kv_indices; the sequence was skipped;";
  }
  if (append != 0) {
    message += " append_kv: a new token's cache position, page or RoPE row was out of range "
               "and the token was not written (pass overflow= to handle that yourself);";
  }
  message += " nothing outside the buffers was read or written, but those outputs are "
             "undefined (pass validate=True to check device metadata before launching)";
  return fail(CKFMHA_ERROR_DEVICE_METADATA, message);
}

}  // namespace

int begin_launch(ckfmha_launch_context* context) {
  int device = 0;
  if (int s = current_device(&device)) return s;
  DeviceErrors* record = nullptr;
  if (int s = record_for(device, &record)) return s;
  if (int s = report(device, record)) return s;
  context->device_errors = record;
  return CKFMHA_SUCCESS;
}

int check_device_errors(int device, bool synchronize) {
  int current = 0;
  if (int s = current_device(&current)) return s;
  if (device < 0) device = current;
  if (synchronize) {
    if (device != current) {
      if (int s = set_device(device)) return s;
    }
    cudaError_t err = cudaDeviceSynchronize();
    if (device != current) set_device(current);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return fail(CKFMHA_ERROR_CUDA, std::string("cudaDeviceSynchronize: ") +
                                         cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
    }
  }
  DeviceErrors* record = existing_record(device);
  if (record == nullptr) return succeed();
  if (int s = report(device, record)) return s;
  return succeed();
}

}  // namespace ckfmha::runtime
