// The host side of kernel/params/device_errors.h: one record per device,
// handed to every launch, read back without a synchronisation.
#pragma once

#include "ckfmha/kernel_entry.h"

namespace ckfmha::runtime {

// Before launching on the current device: fails with
// CKFMHA_ERROR_DEVICE_METADATA (and clears the record) when an earlier
// kernel there reported out-of-range metadata, else fills `context` with the
// device's record, allocating it on first use.
int begin_launch(ckfmha_launch_context* context);

// ckfmha_check_device_errors: `device` < 0 is the current one; `synchronize`
// waits for the device's work first.
int check_device_errors(int device, bool synchronize);

}  // namespace ckfmha::runtime
