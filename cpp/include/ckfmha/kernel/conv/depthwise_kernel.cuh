// Depthwise convolution forward (one input and one output channel a group)
// with eight groups a 16-byte load: the direct template's path for its
// one-channel bucket where the tensors allow it (conv_depthwise_limit and
// depthwise_vectors_fit). The one-lane-a-group path reads two bytes a lane and
// stages a whole input tile before its first product; this one keeps each
// thread's inputs in registers, read straight from global memory (neighbouring
// threads' windows overlap, so the L1 cache serves most of them).
//
// A thread computes kDepthwiseRun consecutive outputs along w of eight
// consecutive groups. Per filter row it loads the window of inputs those
// outputs read (Run - 1) x stride + filter width wide, widens it to fp32 one
// channel pair at a time and accumulates every filter column from it.
#pragma once

#include "ckfmha/kernel/params/conv_params.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cute/numeric/numeric_types.hpp>

#include <cstdint>
#include <type_traits>

namespace ckfmha::kernel {

namespace conv_detail {

constexpr int kDepthwiseRun = 4;  // outputs along w a thread computes
constexpr int kDepthwiseThreads = 256;  // the most a CTA has

// A 32-bit word of two fp16/bf16 values as floats, and back.
template <class Element>
__device__ __forceinline__ float2 widen_pair(uint32_t word) {
  if constexpr (std::is_same_v<Element, cute::bfloat16_t>) {
    return make_float2(__uint_as_float(word << 16), __uint_as_float(word & 0xffff0000u));
  } else {
    __half2 h;
    static_assert(sizeof(h) == sizeof(word));
    memcpy(&h, &word, sizeof(word));
    return __half22float2(h);
  }
}

template <class Element>
__device__ __forceinline__ uint32_t narrow_pair(float lo, float hi) {
  uint32_t word;
  if constexpr (std::is_same_v<Element, cute::bfloat16_t>) {
    const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
    memcpy(&word, &b, sizeof(word));
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    memcpy(&word, &h, sizeof(word));
  }
  return word;
}

__device__ __forceinline__ uint32_t word_of(uint4 v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

}  // namespace conv_detail

// What the depthwise kernel reads beside the problem: the CTA's shape, which
// the launch sizes so that small problems still fill the SMs.
struct ConvDepthwiseParams {
  ConvFwdParams conv;
  int32_t vectors_per_cta;  // groups a CTA covers, in vectors of 8
};

// Grid: x = blocks of consecutive output runs (along w, then h, d and the
// batch), y = blocks of `vectors_per_cta` x 8 groups; blockDim.x threads, at
// most kDepthwiseThreads. kStrideW: the stride along w (1 or 2), so that the
// window's indices are constants; kMaxTaps: the widest filter along w the
// window holds.
template <class Element, int kStrideW, int kMaxTaps>
__global__ void __launch_bounds__(conv_detail::kDepthwiseThreads, 2)
    conv_fwd_depthwise_kernel(ConvDepthwiseParams const __grid_constant__ dp) {
  using namespace conv_detail;
  static_assert(sizeof(Element) == 2, "fp16 or bf16");
  constexpr int kRun = kDepthwiseRun;
  constexpr int kSpan = (kRun - 1) * kStrideW + kMaxTaps;
  constexpr int kChannels = kDepthwiseVector;  // groups a thread computes
  constexpr int kWords = kChannels / 2;         // their channel pairs
  // The window of a 3-wide filter at stride 1 fits twice in 128 registers
  // (two CTAs an SM): the next filter row's inputs load while this row's
  // products run. Wider windows hold one: at 168 registers (one CTA an SM)
  // the 7x7 layers of ConvNeXt ran 20-30% slower (H200, NOTES 113).
  constexpr bool kPrefetch = kSpan <= 6;
  using Window = uint4[kSpan];  // a filter row's inputs, 8 groups each
  ConvFwdParams const& p = dp.conv;
  extern __shared__ __align__(16) char smem[];
  float* ws = reinterpret_cast<float*>(smem);  // [tap][group of the CTA]

  const int32_t vectors = dp.vectors_per_cta;
  const int32_t cta_groups = vectors * kDepthwiseVector;
  const int32_t taps = p.filter[0] * p.filter[1] * p.filter[2];
  const int64_t group0 = int64_t(blockIdx.y) * cta_groups;
  // The filters of the CTA's groups as fp32, [tap][group]: a thread reads its
  // groups' weights of a tap as float pairs (the layout is [group][tap] in
  // memory, one group's taps contiguous).
  const Element* w = static_cast<const Element*>(p.w) + group0 * taps;

  const int32_t parts = cta_groups / kChannels;  // threads a position
  const int32_t slots = blockDim.x / parts;
  const int32_t part = threadIdx.x % parts;
  const int32_t slot = threadIdx.x / parts;
  const int64_t runs_w = (p.output[2] + kRun - 1) / kRun;
  const int64_t run = int64_t(blockIdx.x) * slots + slot;
  const bool active =
      slot < slots && run < int64_t(p.batch) * p.output[0] * p.output[1] * runs_w;
  int64_t rest = run / runs_w;
  const int32_t ow0 = int32_t(run - rest * runs_w) * kRun;
  const int32_t oh = int32_t(rest % p.output[1]);
  rest /= p.output[1];
  const int32_t od = int32_t(rest % p.output[0]);
  const int64_t n = rest / p.output[0];
  const int64_t channel0 = group0 + part * kChannels;

  float acc[kRun][kChannels];
#pragma unroll
  for (int j = 0; j < kRun; ++j) {
#pragma unroll
    for (int c = 0; c < kChannels; ++c) acc[j][c] = 0.f;
  }

  const int32_t filter_w = p.filter[2];
  const int32_t span = (kRun - 1) * kStrideW + filter_w;
  const int32_t iw0 = ow0 * kStrideW - p.padding[2];
  const Element* x = static_cast<const Element*>(p.x) + n * p.x_stride[0] + channel0;
  const float* w_part = ws + part * kChannels;

  // A filter row's window of inputs, zeros in the padding.
  auto load_row = [&](int32_t id, int32_t ih, Window& window) {
    const Element* row = x + id * p.x_stride[1] + ih * p.x_stride[2];
#pragma unroll
    for (int i = 0; i < kSpan; ++i) {
      const int32_t iw = iw0 + i;
      window[i] = make_uint4(0, 0, 0, 0);
      if (i < span && uint32_t(iw) < uint32_t(p.input[2])) {
        window[i] = __ldg(reinterpret_cast<const uint4*>(row + iw * p.x_stride[3]));
      }
    }
  };
  // One filter row's products: every filter column from the window, widened
  // one channel pair at a time.
  auto accumulate = [&](Window const& window, int32_t tap_row) {
    const float* w_row = w_part + tap_row * cta_groups;
#pragma unroll
    for (int pair = 0; pair < kWords; ++pair) {
      float2 in[kSpan];
#pragma unroll
      for (int i = 0; i < kSpan; ++i) in[i] = widen_pair<Element>(word_of(window[i], pair));
#pragma unroll
      for (int fx = 0; fx < kMaxTaps; ++fx) {
        if (fx < filter_w) {
          const float2 weight =
              *reinterpret_cast<const float2*>(w_row + fx * cta_groups + 2 * pair);
#pragma unroll
          for (int j = 0; j < kRun; ++j) {
            acc[j][2 * pair] = fmaf(in[j * kStrideW + fx].x, weight.x, acc[j][2 * pair]);
            acc[j][2 * pair + 1] = fmaf(in[j * kStrideW + fx].y, weight.y, acc[j][2 * pair + 1]);
          }
        }
      }
    }
  };
  auto stage_filters = [&] {
    for (int32_t i = threadIdx.x; i < cta_groups * taps; i += blockDim.x) {
      const int32_t g = i / taps, tap = i - g * taps;
      ws[tap * cta_groups + g] = float(w[i]);
    }
    __syncthreads();
  };

  if constexpr (kPrefetch) {
    // Filter rows in order (fz outer, fy inner); a row outside the input
    // reads nothing and adds nothing.
    int32_t next_fz = 0, next_fy = 0;
    auto load_next_row = [&](Window& window) -> bool {
      const int32_t id = od * p.stride[0] - p.padding[0] + next_fz * p.dilation[0];
      const int32_t ih = oh * p.stride[1] - p.padding[1] + next_fy * p.dilation[1];
      if (++next_fy == p.filter[1]) next_fy = 0, ++next_fz;
      if (uint32_t(id) >= uint32_t(p.input[0]) || uint32_t(ih) >= uint32_t(p.input[1])) {
        return false;
      }
      load_row(id, ih, window);
      return true;
    };
    // The first row's inputs load while the CTA stages its filters.
    Window a, b;
    bool a_read = active && load_next_row(a);
    stage_filters();
    if (!active) return;
    const int32_t rows = p.filter[0] * p.filter[1];
#pragma unroll 1
    for (int32_t r = 0; r < rows; r += 2) {
      bool b_read = false;
      if (r + 1 < rows) b_read = load_next_row(b);
      if (a_read) accumulate(a, r * filter_w);
      if (r + 1 < rows) {
        if (r + 2 < rows) a_read = load_next_row(a);
        if (b_read) accumulate(b, (r + 1) * filter_w);
      }
    }
  } else {
    // Wide windows: a row's inputs load after the filters are staged (loading
    // the first one while they stage, with the rows walked by one counter,
    // read 2% slower over the depthwise layers, NOTES 113).
    stage_filters();
    if (!active) return;
    int32_t tap_row = 0;
    for (int32_t fz = 0; fz < p.filter[0]; ++fz) {
      const int32_t id = od * p.stride[0] - p.padding[0] + fz * p.dilation[0];
      for (int32_t fy = 0; fy < p.filter[1]; ++fy, tap_row += filter_w) {
        const int32_t ih = oh * p.stride[1] - p.padding[1] + fy * p.dilation[1];
        if (uint32_t(id) >= uint32_t(p.input[0]) || uint32_t(ih) >= uint32_t(p.input[1])) continue;
        Window window;
        load_row(id, ih, window);
        accumulate(window, tap_row);
      }
    }
  }

  Element* y = static_cast<Element*>(p.y) + n * p.y_stride[0] + od * p.y_stride[1] +
               oh * p.y_stride[2] + channel0;
#pragma unroll
  for (int j = 0; j < kRun; ++j) {
    if (ow0 + j < p.output[2]) {
      uint32_t words[kWords];
#pragma unroll
      for (int pair = 0; pair < kWords; ++pair) {
        words[pair] = narrow_pair<Element>(acc[j][2 * pair], acc[j][2 * pair + 1]);
      }
      uint4 out;
      memcpy(&out, words, sizeof(out));
      *reinterpret_cast<uint4*>(y + int64_t(ow0 + j) * p.y_stride[3]) = out;
    }
  }
}

}  // namespace ckfmha::kernel
