// Device memory, stream and device-error helpers of the C API, so bindings (the Cython
// layer, other FFIs) can stage host arrays without linking the CUDA runtime.
#include "ckfmha/ckfmha.h"

#include "ckfmha/runtime/device.hpp"
#include "ckfmha/runtime/device_errors.hpp"
#include "ckfmha/runtime/status.hpp"

#include <cuda_runtime.h>

#include <string>

using namespace ckfmha::runtime;

namespace {

int check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return succeed();
  cudaGetLastError();
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    return fail(CKFMHA_ERROR_NO_DEVICE,
                std::string(what) + ": no usable CUDA device (" + cudaGetErrorString(err) + ")");
  }
  return fail(CKFMHA_ERROR_CUDA, std::string(what) + " failed: " + cudaGetErrorName(err) + ": " +
                                     cudaGetErrorString(err));
}

int require_device() {
  int count = 0;
  if (int s = device_count(&count)) return s;
  return count > 0 ? CKFMHA_SUCCESS : fail(CKFMHA_ERROR_NO_DEVICE, "no CUDA device is visible");
}

}  // namespace

extern "C" {

int ckfmha_device_malloc(void** ptr, size_t bytes) {
  if (ptr == nullptr) return fail(CKFMHA_ERROR_INVALID_ARGUMENT, "ptr is NULL");
  *ptr = nullptr;
  if (int s = require_device()) return s;
  return check(cudaMalloc(ptr, bytes), "cudaMalloc");
}

int ckfmha_device_free(void* ptr) {
  if (ptr == nullptr) return succeed();
  return check(cudaFree(ptr), "cudaFree");
}

int ckfmha_memcpy_to_device(void* dst, const void* src, size_t bytes) {
  if (int s = require_device()) return s;
  return check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy host->device");
}

int ckfmha_memcpy_to_device_async(void* dst, const void* src, size_t bytes,
                                  ckfmha_stream_t stream) {
  if (int s = require_device()) return s;
  return check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
                               reinterpret_cast<cudaStream_t>(stream)),
               "cudaMemcpyAsync host->device");
}

int ckfmha_memcpy_to_host(void* dst, const void* src, size_t bytes) {
  if (int s = require_device()) return s;
  return check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy device->host");
}

int ckfmha_memset_device(void* dst, int value, size_t bytes) {
  if (int s = require_device()) return s;
  return check(cudaMemset(dst, value, bytes), "cudaMemset");
}

int ckfmha_stream_synchronize(ckfmha_stream_t stream) {
  if (int s = require_device()) return s;
  return check(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)),
               "cudaStreamSynchronize");
}

int ckfmha_check_device_errors(int device, int synchronize) {
  // device < 0: the current one.
  if (int s = device < 0 ? require_device() : require_device_index(device)) return s;
  return check_device_errors(device, synchronize != 0);
}

}  // extern "C"
