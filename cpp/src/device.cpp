#include "ckfmha/runtime/device.hpp"

#include "ckfmha/runtime/status.hpp"

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <string>

namespace ckfmha::runtime {

namespace {

// Per-device facts that never change while a process runs, read once: every
// plan asks for the current device's arch and SM count, and each attribute
// query is a driver call (half a microsecond to several under load). 0 means
// not read yet; devices past the table are queried each time.
constexpr int kCachedDevices = 64;
std::array<std::atomic<int>, kCachedDevices> g_arch{};
std::array<std::atomic<int>, kCachedDevices> g_sm_count{};
// The visible device count (CUDA reads CUDA_VISIBLE_DEVICES once, at init); -1: not read yet.
std::atomic<int> g_device_count{-1};

int cuda_failure(cudaError_t err, const char* what) {
  // Clear the sticky-free error state so a later call starts clean.
  cudaGetLastError();
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    return fail(CKFMHA_ERROR_NO_DEVICE,
                std::string("no usable CUDA device (") + what + ": " + cudaGetErrorString(err) + ")");
  }
  return fail(CKFMHA_ERROR_CUDA, std::string(what) + " failed: " + cudaGetErrorName(err) + ": " +
                                     cudaGetErrorString(err));
}
}  // namespace

int device_count(int* count) {
  if (int known = g_device_count.load(std::memory_order_relaxed); known >= 0) {
    *count = known;
    return succeed();
  }
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    cudaGetLastError();
    n = 0;
  } else if (err != cudaSuccess) {
    return cuda_failure(err, "cudaGetDeviceCount");
  }
  g_device_count.store(n, std::memory_order_relaxed);
  *count = n;
  return succeed();
}

int current_device(int* device) {
  cudaError_t err = cudaGetDevice(device);
  if (err != cudaSuccess) return cuda_failure(err, "cudaGetDevice");
  return succeed();
}

int set_device(int device) {
  cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) return cuda_failure(err, "cudaSetDevice");
  return succeed();
}

int require_device_index(int device) {
  int count = 0;
  if (int s = device_count(&count)) return s;
  if (count == 0) return fail(CKFMHA_ERROR_NO_DEVICE, "no CUDA device is visible");
  if (device < 0 || device >= count) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT,
                "device " + std::to_string(device) + " does not exist; valid devices are 0.." +
                    std::to_string(count - 1) + " (" + std::to_string(count) +
                    " CUDA device(s) visible)");
  }
  return CKFMHA_SUCCESS;
}

int device_arch(int device, int* arch) {
  const bool cacheable = device >= 0 && device < kCachedDevices;
  if (cacheable) {
    if (int known = g_arch[device].load(std::memory_order_relaxed); known > 0) {
      *arch = known;
      return succeed();
    }
  }
  int major = 0, minor = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  }
  if (err != cudaSuccess) return cuda_failure(err, "cudaDeviceGetAttribute(compute capability)");
  *arch = 10 * major + minor;
  if (cacheable) g_arch[device].store(*arch, std::memory_order_relaxed);
  return succeed();
}

int current_device_arch(int* arch) {
  int count = 0;
  if (int status = device_count(&count); status != CKFMHA_SUCCESS) return status;
  if (count == 0) {
    return fail(CKFMHA_ERROR_NO_DEVICE,
                "no CUDA device is visible; pass an explicit arch to select or explain kernels");
  }
  int device = 0;
  if (int status = current_device(&device); status != CKFMHA_SUCCESS) return status;
  return device_arch(device, arch);
}

int current_device_sm_count(int* count) {
  int device = 0;
  if (int status = current_device(&device); status != CKFMHA_SUCCESS) return status;
  const bool cacheable = device >= 0 && device < kCachedDevices;
  if (cacheable) {
    if (int known = g_sm_count[device].load(std::memory_order_relaxed); known > 0) {
      *count = known;
      return succeed();
    }
  }
  cudaError_t err = cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return cuda_failure(err, "cudaDeviceGetAttribute(SM count)");
  if (cacheable) g_sm_count[device].store(*count, std::memory_order_relaxed);
  return succeed();
}

int pointer_device(const void* ptr, int* device) {
  cudaPointerAttributes attributes{};
  cudaError_t err = cudaPointerGetAttributes(&attributes, ptr);
  if (err != cudaSuccess) return cuda_failure(err, "cudaPointerGetAttributes");
  *device = attributes.type == cudaMemoryTypeUnregistered ? -1 : attributes.device;
  return succeed();
}

}  // namespace ckfmha::runtime
