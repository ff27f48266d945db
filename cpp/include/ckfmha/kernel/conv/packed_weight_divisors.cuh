// The divisors that map an element of a packed backward-weight tile back to
// its group (conv_weight_pack), worked out on the host once a launch and read
// from the kernel's parameters: a multiply and a shift a use, and no
// registers held. Built in the kernel, each cutlass::FastDivmod's shift was
// a chain of some 30 compare-and-selects and its multiplier a 64-bit
// division, and the compiler hoisted all three out of the packed branch into
// every warp's prologue, unpacked plans included: about 200 of the 1,500
// instructions a warp of the mma.sync kernel executed on ResNeXt's batch-1
// groups of 8 (NOTES 132).
#pragma once

#include "ckfmha/kernel/params/conv_params.h"

#include <cutlass/fast_math.h>

namespace ckfmha::kernel {

struct PackedWeightDivisors {
  cutlass::FastDivmod group_out;  // a group's output channels
  cutlass::FastDivmod packed_in;  // the packed group's input channels (a tap's columns)
  cutlass::FastDivmod group_in;   // a group's input channels

  PackedWeightDivisors() = default;

  // bp as the launcher packed it.
  explicit PackedWeightDivisors(ConvBwdWeightParams const& bp)
      : group_out(bp.group_out_channels),
        packed_in(bp.conv.in_channels),
        group_in(bp.group_in_channels) {}
};

}  // namespace ckfmha::kernel
