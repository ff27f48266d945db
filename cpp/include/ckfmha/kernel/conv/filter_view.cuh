// Reading a filter weight through the problem's filter view
// (ConvFilterView, conv_params.h): the direct kernels stage their filters
// element by element, so they take any view at the cost of an index
// computation a staged element.
#pragma once

#include "ckfmha/kernel/params/conv_params.h"

#include <cstdint>

namespace ckfmha::kernel::conv_detail {

// Weight (group, k, tap, c) of the problem, where tap runs row-major over
// p.filter (z, then y, then x) as the kernels number taps.
template <class Element>
__device__ __forceinline__ float viewed_weight(ConvFwdParams const& p, int64_t group, int32_t k,
                                               int32_t tap, int32_t c) {
  ConvFilterView const& v = p.filter_view;
  const int32_t x = tap % p.filter[2];
  const int32_t zy = tap / p.filter[2];
  const int32_t y = zy % p.filter[1];
  const int32_t z = zy / p.filter[1];
  const int64_t offset = v.first + group * v.group + k * v.out_channel + c * v.in_channel +
                         z * v.tap[0] + y * v.tap[1] + x * v.tap[2];
  return float(static_cast<const Element*>(p.w)[offset]);
}

}  // namespace ckfmha::kernel::conv_detail
