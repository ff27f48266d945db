// Host side: what a launcher takes from the runtime's launch context.
#pragma once

#include "ckfmha/kernel/params/device_errors.h"
#include "ckfmha/kernel_entry.h"

namespace ckfmha::kernel {

// The device's error record, or null (no context: nothing is recorded).
inline DeviceErrors* device_errors_of(ckfmha_launch_context const* context) {
  return context != nullptr ? static_cast<DeviceErrors*>(context->device_errors) : nullptr;
}

}  // namespace ckfmha::kernel
