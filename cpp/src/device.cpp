#include "ckfmha/runtime/device.hpp"

#include "ckfmha/runtime/status.hpp"

#include <cuda_runtime.h>

#include <string>

namespace ckfmha::runtime {

namespace {
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
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    cudaGetLastError();
    *count = 0;
    return succeed();
  }
  if (err != cudaSuccess) return cuda_failure(err, "cudaGetDeviceCount");
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
  int major = 0, minor = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  }
  if (err != cudaSuccess) return cuda_failure(err, "cudaDeviceGetAttribute(compute capability)");
  *arch = 10 * major + minor;
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
  cudaError_t err = cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return cuda_failure(err, "cudaDeviceGetAttribute(SM count)");
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
