// The extern "C" surface every operation shares: status text, version, devices
// and the kernel registry. Each operation's entry points are in capi_fwd.cpp,
// capi_bwd.cpp and capi_appendkv.cpp; every entry point returns a
// ckfmha_status and leaves a message on failure.
#include "ckfmha/ckfmha.h"

#include "ckfmha/runtime/capi_support.hpp"
#include "ckfmha/runtime/device.hpp"
#include "ckfmha/runtime/problem.hpp"
#include "ckfmha/runtime/registry.hpp"
#include "ckfmha/runtime/status.hpp"

#include <cstring>
#include <string>

using namespace ckfmha::runtime;

extern "C" {

const char* ckfmha_last_error(void) { return last_error(); }

const char* ckfmha_status_name(int status) {
  switch (status) {
    case CKFMHA_SUCCESS: return "CKFMHA_SUCCESS";
    case CKFMHA_ERROR_INVALID_ARGUMENT: return "CKFMHA_ERROR_INVALID_ARGUMENT";
    case CKFMHA_ERROR_UNSUPPORTED: return "CKFMHA_ERROR_UNSUPPORTED";
    case CKFMHA_ERROR_CUDA: return "CKFMHA_ERROR_CUDA";
    case CKFMHA_ERROR_NO_DEVICE: return "CKFMHA_ERROR_NO_DEVICE";
    case CKFMHA_ERROR_BUFFER_TOO_SMALL: return "CKFMHA_ERROR_BUFFER_TOO_SMALL";
    case CKFMHA_ERROR_NOT_FOUND: return "CKFMHA_ERROR_NOT_FOUND";
    case CKFMHA_ERROR_INTERNAL: return "CKFMHA_ERROR_INTERNAL";
    case CKFMHA_ERROR_DEVICE_METADATA: return "CKFMHA_ERROR_DEVICE_METADATA";
  }
  return "CKFMHA_UNKNOWN_STATUS";
}

int ckfmha_version(int* major, int* minor, int* patch) {
  if (major) *major = CKFMHA_VERSION_MAJOR;
  if (minor) *minor = CKFMHA_VERSION_MINOR;
  if (patch) *patch = CKFMHA_VERSION_PATCH;
  return succeed();
}

int ckfmha_device_count(int* count) {
  if (int s = require(count != nullptr, "count is NULL")) return s;
  return device_count(count);
}

int ckfmha_device_arch(int device, int* arch) {
  if (int s = require(arch != nullptr, "arch is NULL")) return s;
  int count = 0;
  if (int s = device_count(&count)) return s;
  if (device < 0 || device >= count) {
    return fail(count == 0 ? CKFMHA_ERROR_NO_DEVICE : CKFMHA_ERROR_INVALID_ARGUMENT,
                "device " + std::to_string(device) + " does not exist; " + std::to_string(count) +
                    " CUDA device(s) visible");
  }
  return device_arch(device, arch);
}

int ckfmha_current_device(int* device) {
  if (int s = require(device != nullptr, "device is NULL")) return s;
  int count = 0;
  if (int s = device_count(&count)) return s;
  if (count == 0) return fail(CKFMHA_ERROR_NO_DEVICE, "no CUDA device is visible");
  return current_device(device);
}

int ckfmha_set_device(int device) {
  if (int s = require_device_index(device)) return s;
  return set_device(device);
}

int ckfmha_pointer_device(const void* ptr, int* device) {
  if (int s = require(device != nullptr, "device is NULL")) return s;
  int count = 0;
  if (int s = device_count(&count)) return s;
  if (count == 0) return fail(CKFMHA_ERROR_NO_DEVICE, "no CUDA device is visible");
  return pointer_device(ptr, device);
}

int ckfmha_registry_count(int* count) {
  if (int s = require(count != nullptr, "count is NULL")) return s;
  *count = int(Registry::instance().entries()->size());
  return succeed();
}

int ckfmha_registry_name(int index, char* buf, size_t buf_len) {
  const Registry::Snapshot snapshot = Registry::instance().entries();
  auto const& entries = *snapshot;
  if (index < 0 || index >= int(entries.size())) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT, "kernel index " + std::to_string(index) +
                                                   " out of range [0, " +
                                                   std::to_string(entries.size()) + ")");
  }
  return copy_text_out(entries[index].name, buf, buf_len, nullptr);
}

int ckfmha_registry_json(char* buf, size_t buf_len, size_t* needed) {
  return copy_text_out(Registry::instance().to_json(), buf, buf_len, needed);
}

int ckfmha_registry_load_module(const char* path, int* added) { return load_module(path, added); }

}  // extern "C"
