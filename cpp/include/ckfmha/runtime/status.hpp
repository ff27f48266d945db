// One place that records why a C API call failed. Messages are per thread so
// concurrent callers never read each other's errors.
#pragma once

#include "ckfmha/ckfmha.h"

#include <string>

namespace ckfmha::runtime {

// Stores `message` as the calling thread's last error and returns `status`.
int fail(ckfmha_status status, std::string message);

// Clears the last error and returns CKFMHA_SUCCESS.
int succeed();

const char* last_error();

// Maps a launcher's return value (0, or -cudaError_t) to a status, with a
// message naming the kernel.
int from_launch_result(int result, const char* kernel_name);

}  // namespace ckfmha::runtime
