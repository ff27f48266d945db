// Reading a filter through the problem's filter view (ConvFilterView,
// conv_params.h). The direct kernels stage their filters element by element,
// so they take any view, the dense one included; a thread walks a contiguous
// range of (row, tap) pairs and steps the tap's coordinates by counters, so
// that the walk costs a few run-time divisions a range rather than several
// an element (decoding each element slowed backward-data on 4-channel groups
// by a quarter and on depthwise 7x7 layers by 13-33% at batch 32).
#pragma once

#include "ckfmha/kernel/params/conv_params.h"

#include <cstdint>

namespace ckfmha::kernel::conv_detail {

// Calls visit(pair, row, tap_offset) for pairs [begin, end) of (row, tap),
// pair = row x taps + tap, taps row-major over p.filter (z, y, x) as the
// kernels number them; tap_offset is the view's element offset of the tap
// (first included; the caller adds its row's and channel's).
template <class Visit>
__device__ __forceinline__ void walk_viewed_taps(ConvFwdParams const& p, int32_t begin,
                                                 int32_t end, Visit&& visit) {
  if (begin >= end) return;
  ConvFilterView const& v = p.filter_view;
  const int32_t taps = p.filter[0] * p.filter[1] * p.filter[2];
  int32_t row = begin / taps;
  const int32_t tap = begin - row * taps;
  int32_t x = tap % p.filter[2];
  const int32_t zy = tap / p.filter[2];
  int32_t y = zy % p.filter[1];
  int32_t z = zy / p.filter[1];
  for (int32_t pair = begin; pair < end; ++pair) {
    visit(pair, row, v.first + z * v.tap[0] + y * v.tap[1] + x * v.tap[2]);
    if (++x == p.filter[2]) {
      x = 0;
      if (++y == p.filter[1]) {
        y = 0;
        if (++z == p.filter[0]) {
          z = 0;
          ++row;
        }
      }
    }
  }
}

// The range of `count` pairs worker `index` of `workers` walks.
__device__ __forceinline__ void viewed_range(int32_t count, int32_t index, int32_t workers,
                                             int32_t* begin, int32_t* end) {
  const int32_t each = (count + workers - 1) / workers;
  *begin = min(count, index * each);
  *end = min(count, *begin + each);
}

}  // namespace ckfmha::kernel::conv_detail
