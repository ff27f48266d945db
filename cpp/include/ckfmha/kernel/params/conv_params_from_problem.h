// Host side: a convolution launch's device parameters from the C API's
// problem and arguments, shared by the launchers and by the runtime where it
// must know how a launcher will read a problem (conv_vector_weight_layout.h).
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel/params/conv_params.h"

#include <cstdint>

namespace ckfmha::kernel {

// The problem in the kernels' 3D form: a 2D problem gains a depth of 1.
inline ConvFwdParams make_conv_fwd_params(ckfmha_conv_problem const& pr,
                                          ckfmha_conv_fwd_args const& ar) {
  ConvFwdParams p{};
  p.x = ar.x;
  p.w = ar.w;
  p.y = ar.y;
  p.batch = pr.batch;
  p.groups = pr.groups;
  p.in_channels = pr.in_channels;
  p.out_channels = pr.out_channels;
  const int skip = 3 - pr.spatial_dims;  // leading unit dims
  for (int d = 0; d < 3; ++d) {
    const bool real = d >= skip;
    const int i = d - skip;
    p.input[d] = real ? pr.input[i] : 1;
    p.filter[d] = real ? pr.filter[i] : 1;
    p.stride[d] = real ? pr.stride[i] : 1;
    p.padding[d] = real ? pr.padding[i] : 0;
    p.dilation[d] = real ? pr.dilation[i] : 1;
    p.output[d] = real ? pr.output[i] : 1;
    p.x_stride[1 + d] = real ? pr.x_stride[1 + i] : 0;
    p.y_stride[1 + d] = real ? pr.y_stride[1 + i] : 0;
  }
  p.x_stride[0] = pr.x_stride[0];
  p.y_stride[0] = pr.y_stride[0];
  p.rows = int64_t(pr.batch) * p.output[0] * p.output[1] * p.output[2];
  p.reduction = p.filter[0] * p.filter[1] * p.filter[2] * pr.in_channels;
  bool paired = reinterpret_cast<uintptr_t>(ar.y) % 4 == 0 && pr.out_channels % 2 == 0;
  for (int d = 0; d < 4; ++d) paired = paired && p.y_stride[d] % 2 == 0;
  p.paired_stores = paired ? 1 : 0;
  bool vectors = reinterpret_cast<uintptr_t>(ar.y) % 16 == 0 && pr.out_channels % 8 == 0;
  for (int d = 0; d < 4; ++d) vectors = vectors && p.y_stride[d] % 8 == 0;
  p.vector_stores = vectors ? 1 : 0;
  ConvFilterView& v = p.filter_view;
  v.tap[2] = pr.in_channels;
  v.tap[1] = v.tap[2] * p.filter[2];
  v.tap[0] = v.tap[1] * p.filter[1];
  v.out_channel = v.tap[0] * p.filter[0];
  v.group = v.out_channel * pr.out_channels;
  v.in_channel = 1;
  v.first = 0;
  return p;
}

}  // namespace ckfmha::kernel
