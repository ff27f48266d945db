// Resident CTAs per SM as the CUDA occupancy calculator counts them for a
// compiled kernel on the current device, asked once per (device, kernel).
#pragma once

#include "ckfmha/kernel_entry.h"

namespace ckfmha::runtime {

// The count from k.resident_ctas on the current device, remembered for the
// process; 0 when the entry has no query or a CUDA call fails (callers then
// estimate).
int occupancy_resident_ctas(ckfmha_kernel_entry const& k);

}  // namespace ckfmha::runtime
