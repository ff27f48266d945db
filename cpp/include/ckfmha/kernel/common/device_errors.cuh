// Device side of params/device_errors.h: how a kernel records metadata it
// refused to follow.
#pragma once

#include "ckfmha/kernel/params/device_errors.h"

#include <cstdint>

namespace ckfmha::kernel {

// Stores 1 + batch in the record's `kind` slot (the record may be absent: a
// launcher called outside the runtime). Every thread that meets the error
// may store: any offending batch is as good as another.
__device__ __forceinline__ void report_device_error(DeviceErrors* errors,
                                                    int32_t DeviceErrors::*kind, int batch) {
  if (errors != nullptr) *reinterpret_cast<volatile int32_t*>(&(errors->*kind)) = batch + 1;
}

// A sequence's [begin, end) within a packed tensor of `total` rows and at
// most `max_len` long.
__device__ __forceinline__ bool range_fits(int64_t begin, int64_t end, int64_t total,
                                           int64_t max_len) {
  return begin >= 0 && begin <= end && end <= total && end - begin <= max_len;
}

}  // namespace ckfmha::kernel
