#include "ckfmha/runtime/status.hpp"

#include <cuda_runtime.h>

#include <utility>

namespace ckfmha::runtime {

namespace {
thread_local std::string g_last_error;
}

int fail(ckfmha_status status, std::string message) {
  g_last_error = std::move(message);
  return status;
}

int succeed() {
  g_last_error.clear();
  return CKFMHA_SUCCESS;
}

const char* last_error() { return g_last_error.c_str(); }

int from_launch_result(int result, const char* kernel_name) {
  if (result == 0) return succeed();
  if (result > 0) {
    return fail(static_cast<ckfmha_status>(result),
                std::string("kernel ") + kernel_name + " refused the problem");
  }
  auto err = static_cast<cudaError_t>(-result);
  return fail(CKFMHA_ERROR_CUDA, std::string("CUDA error launching ") + kernel_name + ": " +
                                     cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

}  // namespace ckfmha::runtime
