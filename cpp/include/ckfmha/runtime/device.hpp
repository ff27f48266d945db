// The CUDA runtime calls the C API needs, each turned into a status with a
// message; nothing else in the runtime includes CUDA headers.
#pragma once

#include <cstddef>

namespace ckfmha::runtime {

int device_count(int* count);
int current_device(int* device);
// cudaSetDevice(device); the caller checks the range.
int set_device(int device);
// NO_DEVICE without a visible device, INVALID_ARGUMENT naming the valid
// range when `device` is not one of them.
int require_device_index(int device);
int device_arch(int device, int* arch);
// Arch of the current device, or a NO_DEVICE status.
int current_device_arch(int* arch);
// Streaming multiprocessors of the current device.
int current_device_sm_count(int* count);
// The CUDA device whose memory `ptr` points into, or -1 for host memory CUDA does not know.
int pointer_device(const void* ptr, int* device);

}  // namespace ckfmha::runtime
