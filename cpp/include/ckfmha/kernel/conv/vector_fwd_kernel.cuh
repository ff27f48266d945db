// Grouped convolution forward for groups of 1, 2 or 4 channels (as many in
// as out) with eight channels a 16-byte load: the direct template's vector
// path where the tensors allow it (conv_vector_fwd_limit and
// vector_fwd_fits); for one-channel groups it is the depthwise path. The
// one-lane-a-group path reads two bytes a lane and stages a whole input tile
// before its first product; this one keeps each thread's inputs in
// registers, read straight from global memory (neighbouring threads' windows
// overlap, so the L1 cache serves most of them).
//
// A thread computes a run of kRun consecutive outputs along w (4, or 2 where
// runs of 4 leave the SMs mostly idle) of eight consecutive channels (8
// groups of 1, 4 of 2 or 2 of 4). Per filter row it
// loads the window of inputs those outputs read, (Run - 1) x stride + filter
// width wide, widens it to fp32 one channel pair at a time and accumulates
// every filter column from it: a pair feeds its own two outputs in groups of
// one, and all G outputs of its group otherwise.
//
// On small grids (batch 1) a thread waits on its rows' loads one after the
// other with little else resident to hide them, so up to `row_parts` threads
// share a run, each taking every row_parts-th filter row, and add their sums
// in shared memory.
#pragma once

#include "ckfmha/kernel/conv/filter_view.cuh"
#include "ckfmha/kernel/params/conv_params.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cute/numeric/numeric_types.hpp>

#include <cstdint>
#include <type_traits>

namespace ckfmha::kernel {

namespace conv_detail {

constexpr int kVectorFwdThreads = 256;  // the most a CTA has

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

// What the vector kernel reads beside the problem: the CTA's shape, which
// the launch sizes so that small problems still fill the SMs.
struct ConvVectorFwdParams {
  ConvFwdParams conv;
  int32_t vectors_per_cta;  // channels a CTA covers, in vectors of 8
  int32_t row_parts;        // threads that share a run's filter rows (1: no split)
};

// Floats of shared memory a CTA's filters take per vector of 8 channels,
// laid out [vector][tap][output channel][input channel]: a thread's weights
// lie at constant offsets from its vector's block, so its loads need no
// address arithmetic (groups of one had been [tap][channel] over the CTA,
// an address computed for every load of a pair's weights). Each vector's
// block is two floats longer than its taps x 8 x G, so that the threads of a
// warp, which read the same tap of different vectors, meet different banks.
template <int kG>
constexpr int64_t vector_fwd_filter_floats(int64_t taps) {
  return taps * kDepthwiseVector * kG + 2;
}

// Floats of shared memory, after the filters, where the threads of row parts
// 1 and up leave their sums: run_threads (vectors x slots) a row part, kRun x
// 8 of them each.
template <int kRun>
constexpr int64_t vector_fwd_partial_floats(int64_t run_threads, int32_t row_parts) {
  return row_parts > 1 ? (row_parts - 1) * run_threads * kRun * kDepthwiseVector : 0;
}

// Grid: x = blocks of consecutive output runs (along w, then h, d and the
// batch), y = blocks of `vectors_per_cta` x 8 groups; blockDim.x threads, at
// most kVectorFwdThreads, a multiple of vectors_per_cta x row_parts.
// kStrideW: the stride along w (1 or 2), so that the window's indices are
// constants; kMaxTaps: the widest filter along w the window holds; kG: the
// channels of a group (1, 2 or 4); kRun: the outputs along w a thread
// computes; kSplitRows: whether dp.row_parts threads share a run. The split
// has instances of its own: walking every kernel's rows by row part ran the
// batch-32 depthwise layers 8-19% slower, and the unsplit loops kept beside
// the split ones behind a branch spilled up to 236 bytes (NOTES 125).
template <class Element, int kStrideW, int kMaxTaps, int kG, int kRun, bool kSplitRows>
__global__ void __launch_bounds__(conv_detail::kVectorFwdThreads, 2)
    conv_fwd_vector_kernel(ConvVectorFwdParams const __grid_constant__ dp) {
  using namespace conv_detail;
  static_assert(sizeof(Element) == 2, "fp16 or bf16");
  static_assert(kG == 1 || kG == 2 || kG == 4, "groups of 1, 2 or 4 channels");
  constexpr int kSpan = (kRun - 1) * kStrideW + kMaxTaps;
  constexpr int kChannels = kDepthwiseVector;  // channels a thread computes
  constexpr int kWords = kChannels / 2;         // their channel pairs
  // The window of a 3-wide filter at stride 1 fits twice in 128 registers
  // (two CTAs an SM): the next filter row's inputs load while this row's
  // products run. Wider windows hold one: at 168 registers (one CTA an SM)
  // the 7x7 layers of ConvNeXt ran 20-30% slower (H200, NOTES 113).
  constexpr bool kPrefetch = kSpan <= 6;
  // A sum's two products of a channel pair (wider groups) issued back to
  // back wait out the first one's latency; apart, they need temporaries.
  // The stride-1 3-wide window of 4-channel groups has the registers for
  // them (no spills); elsewhere the split spilled 24-88 bytes.
  constexpr bool kSplitProducts = kG == 4 && kPrefetch;
  using Window = uint4[kSpan];  // a filter row's inputs, 8 channels each
  ConvFwdParams const& p = dp.conv;
  extern __shared__ __align__(16) char smem[];
  float* ws = reinterpret_cast<float*>(smem);  // vector_fwd_filter_floats' layout

  const int32_t vectors = dp.vectors_per_cta;
  const int32_t cta_channels = vectors * kDepthwiseVector;
  const int32_t taps = p.filter[0] * p.filter[1] * p.filter[2];
  // The CTA's first channel of x and y: whole groups, as channels = groups x G.
  const int64_t cta_channel0 = int64_t(blockIdx.y) * cta_channels;
  const int64_t part_floats = vector_fwd_filter_floats<kG>(taps);

  // Threads: (row part, slot, part), part fastest. A run's threads share its
  // slot and differ in row part.
  const int32_t parts = vectors;  // threads a position's channels
  const int32_t row_parts = kSplitRows ? dp.row_parts : 1;
  const int32_t run_threads = int32_t(blockDim.x) / row_parts;
  const int32_t slots = run_threads / parts;
  const int32_t part = threadIdx.x % parts;
  const int32_t slot = kSplitRows ? threadIdx.x % run_threads / parts : threadIdx.x / parts;
  const int32_t row_part = kSplitRows ? threadIdx.x / run_threads : 0;
  const int32_t runs_w = (p.output[2] + kRun - 1) / kRun;
  const int64_t run = int64_t(blockIdx.x) * slots + slot;
  const int64_t runs = int64_t(p.batch) * p.output[0] * p.output[1] * runs_w;
  const bool active = slot < slots && row_part < row_parts && run < runs;
  int32_t ow0, oh, od;
  int64_t n;
  // The run's coordinates, found in the type `rest` has.
  auto decode = [&](auto rest) {
    using Index = decltype(rest);
    const Index run_index = rest;
    rest /= Index(runs_w);
    ow0 = int32_t(run_index - rest * Index(runs_w)) * kRun;
    oh = int32_t(rest % Index(p.output[1]));
    rest /= Index(p.output[1]);
    od = int32_t(rest % Index(p.output[0]));
    n = int64_t(rest / Index(p.output[0]));
  };
  // 32-bit divisions where the runs allow: three 64-bit ones took about 100
  // of a thread's 1,600 instructions on MobileNet's batch-32 layers (NOTES
  // 129).
  if (runs <= INT32_MAX) {
    decode(uint32_t(run));
  } else {
    decode(run);
  }
  const int64_t channel0 = cta_channel0 + part * kChannels;

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
  const float* w_part = ws + part * part_floats;  // this vector's block

  // The window's columns that lie in the input (bit i: column iw0 + i) are
  // the same in every row, so they are found once; a row then costs its
  // start and a 64-bit add a column. Bounds and 64-bit products per load
  // were 20 instructions a 16-byte load, as many as the row's products
  // (MobileNet's batch-32 3x3 layers, NOTES 129).
  uint32_t columns_in = 0;
#pragma unroll
  for (int i = 0; i < kSpan; ++i) {
    if (i < span && uint32_t(iw0 + i) < uint32_t(p.input[2])) columns_in |= 1u << i;
  }
  const int64_t column_bytes = p.x_stride[3] * int64_t(sizeof(Element));
  const char* x_bytes = reinterpret_cast<const char*>(x);
  // A filter row's window of inputs, zeros in the padding. The address
  // walks the columns by adds.
  auto load_row = [&](int32_t id, int32_t ih, Window& window) {
    const char* at = x_bytes + (id * p.x_stride[1] + ih * p.x_stride[2] + iw0 * p.x_stride[3]) *
                                   int64_t(sizeof(Element));
#pragma unroll
    for (int i = 0; i < kSpan; ++i, at += column_bytes) {
      window[i] = make_uint4(0, 0, 0, 0);
      if (columns_in >> i & 1u) window[i] = __ldg(reinterpret_cast<const uint4*>(at));
    }
  };
  // One filter row's products: every filter column from the window, widened
  // one channel pair at a time. In groups of one each channel of the pair is
  // its own output's input; in wider groups the pair is two inputs of one
  // group, which feed all G of its outputs (their weights a float pair).
  auto accumulate = [&](Window const& window, int32_t tap_row) {
    const float* w_row = w_part + tap_row * kChannels * kG;
#pragma unroll
    for (int pair = 0; pair < kWords; ++pair) {
      float2 in[kSpan];
#pragma unroll
      for (int i = 0; i < kSpan; ++i) in[i] = widen_pair<Element>(word_of(window[i], pair));
      const int first = 2 * pair / kG * kG;  // its group's first channel
      const int input = 2 * pair - first;    // the pair's first channel in its group
#pragma unroll
      for (int fx = 0; fx < kMaxTaps; ++fx) {
        if (fx < filter_w) {
          if constexpr (kG == 1) {
            const float2 weight =
                *reinterpret_cast<const float2*>(w_row + fx * kChannels + 2 * pair);
#pragma unroll
            for (int j = 0; j < kRun; ++j) {
              acc[j][2 * pair] = fmaf(in[j * kStrideW + fx].x, weight.x, acc[j][2 * pair]);
              acc[j][2 * pair + 1] =
                  fmaf(in[j * kStrideW + fx].y, weight.y, acc[j][2 * pair + 1]);
            }
          } else {
            const float* w_tap = w_row + (fx * kChannels + first) * kG + input;
#pragma unroll
            for (int out = 0; out < kG; ++out) {
              const float2 weight = *reinterpret_cast<const float2*>(w_tap + out * kG);
              if constexpr (kSplitProducts) {
                // The pair's first channel into every output of the run, then
                // its second: a sum's two products kRun FMAs apart.
#pragma unroll
                for (int j = 0; j < kRun; ++j) {
                  float& sum = acc[j][first + out];
                  sum = fmaf(in[j * kStrideW + fx].x, weight.x, sum);
                }
#pragma unroll
                for (int j = 0; j < kRun; ++j) {
                  float& sum = acc[j][first + out];
                  sum = fmaf(in[j * kStrideW + fx].y, weight.y, sum);
                }
              } else {
#pragma unroll
                for (int j = 0; j < kRun; ++j) {
                  float& sum = acc[j][first + out];
                  sum = fmaf(in[j * kStrideW + fx].x, weight.x, sum);
                  sum = fmaf(in[j * kStrideW + fx].y, weight.y, sum);
                }
              }
            }
          }
        }
      }
    }
  };
  // Weight (output channel `out` of the CTA, tap, input channel) into its
  // slot of the layout above.
  auto stage_weight = [&](int32_t out, int32_t tap, int32_t input, float weight) {
    const int32_t vector = out / kChannels, lane = out % kChannels;
    ws[vector * part_floats + (tap * kChannels + lane) * kG + input] = weight;
  };
  // A thread walks a range of (output channel, tap) pairs of the view
  // (dense, or backward-data's transposed and flipped one); out = the CTA's
  // group x G + the output channel in it.
  auto stage_filters = [&] {
    ConvFilterView const& v = p.filter_view;
    const Element* wv = static_cast<const Element*>(p.w) + cta_channel0 / kG * v.group;
    int32_t begin, end;
    viewed_range(cta_channels * taps, threadIdx.x, blockDim.x, &begin, &end);
    walk_viewed_taps(p, begin, end, [&](int32_t pair, int32_t out, int64_t offset) {
      offset += out / kG * v.group + out % kG * v.out_channel;
#pragma unroll
      for (int32_t input = 0; input < kG; ++input) {
        stage_weight(out, pair - out * taps, input, float(wv[offset + input * v.in_channel]));
      }
    });
    __syncthreads();
  };

  if constexpr (!kSplitRows) {
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
      // Wide windows: a row's inputs load after the filters are staged
      // (loading the first one while they stage, with the rows walked by one
      // counter, read 2% slower over the depthwise layers, NOTES 113).
      stage_filters();
      if (!active) return;
      int32_t tap_row = 0;
      for (int32_t fz = 0; fz < p.filter[0]; ++fz) {
        const int32_t id = od * p.stride[0] - p.padding[0] + fz * p.dilation[0];
        for (int32_t fy = 0; fy < p.filter[1]; ++fy, tap_row += filter_w) {
          const int32_t ih = oh * p.stride[1] - p.padding[1] + fy * p.dilation[1];
          if (uint32_t(id) >= uint32_t(p.input[0]) || uint32_t(ih) >= uint32_t(p.input[1])) {
            continue;
          }
          Window window;
          load_row(id, ih, window);
          accumulate(window, tap_row);
        }
      }
    }
  } else {
    // Split rows (small grids): this thread's rows are row_part, row_part +
    // row_parts, ... (fz outer, fy inner), one or two of them, walked by
    // counters; the first one loads while the CTA stages its filters. A row
    // outside the input reads nothing and adds nothing.
    const int32_t rows = p.filter[0] * p.filter[1];
    const int32_t my_rows =
        row_part < rows ? (rows - row_part + row_parts - 1) / row_parts : 0;
    int32_t fz = row_part / p.filter[1];
    int32_t fy = row_part - fz * p.filter[1];
    auto load_next_row = [&](Window& window) -> bool {
      const int32_t id = od * p.stride[0] - p.padding[0] + fz * p.dilation[0];
      const int32_t ih = oh * p.stride[1] - p.padding[1] + fy * p.dilation[1];
      for (fy += row_parts; fy >= p.filter[1]; fy -= p.filter[1]) ++fz;
      if (uint32_t(id) >= uint32_t(p.input[0]) || uint32_t(ih) >= uint32_t(p.input[1])) {
        return false;
      }
      load_row(id, ih, window);
      return true;
    };
    Window window;
    bool read = active && my_rows > 0 && load_next_row(window);
    stage_filters();
    if (active) {
      for (int32_t k = 0; k < my_rows; ++k) {
        if (k > 0) read = load_next_row(window);
        if (read) accumulate(window, (row_part + k * row_parts) * filter_w);
      }
    }
    // The sums of row parts 1 and up meet in shared memory, after the
    // filters, a value per thread side by side; row part 0 adds them.
    float* partial = ws + vectors * part_floats;
    const int32_t local = threadIdx.x % run_threads;
    if (row_part > 0) {
      float* mine = partial + int64_t(row_part - 1) * kRun * kChannels * run_threads + local;
#pragma unroll
      for (int j = 0; j < kRun; ++j) {
#pragma unroll
        for (int c = 0; c < kChannels; ++c) mine[(j * kChannels + c) * run_threads] = acc[j][c];
      }
    }
    __syncthreads();
    if (!active || row_part != 0) return;
    for (int32_t s = 1; s < row_parts; ++s) {
      const float* theirs = partial + int64_t(s - 1) * kRun * kChannels * run_threads + local;
#pragma unroll
      for (int j = 0; j < kRun; ++j) {
#pragma unroll
        for (int c = 0; c < kChannels; ++c) {
          acc[j][c] += theirs[(j * kChannels + c) * run_threads];
        }
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
