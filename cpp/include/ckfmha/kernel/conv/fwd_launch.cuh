// Host-side launcher for one conv_fwd instance. The runtime has checked the
// problem and pointers and chosen a kernel whose channel vector the tensors
// allow before a launcher runs.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel/common/launch.cuh"
#include "ckfmha/kernel/conv/vector_fwd_kernel.cuh"
#include "ckfmha/kernel/conv/direct_kernel.cuh"
#include "ckfmha/kernel/conv/fwd_kernel.cuh"
#include "ckfmha/kernel/conv/fwd_sm90_kernel.cuh"
#include "ckfmha/kernel/conv/fwd_tma_kernel.cuh"
#include "ckfmha/kernel/conv/fwd_tma_maps.hpp"
#include "ckfmha/kernel/params/conv_params.h"
#include "ckfmha/kernel/params/conv_params_from_problem.h"
#include "ckfmha/kernel/params/launch_context.h"
#include "ckfmha/kernel_entry.h"

#include <algorithm>
#include <cstdint>

namespace ckfmha::kernel {

// One CTA per (row tile, channel tile, group); groups past 65535 (the grid's
// z limit) loop inside the CTAs. view: w's filter view, for kernels that
// read one (null: dense).
template <class Traits>
int launch_conv_fwd(void (*kernel)(ConvFwdParams), void const* problem, void const* args,
                    ckfmha_stream_t stream, ConvFilterView const* view = nullptr) {
  auto const& pr = *static_cast<ckfmha_conv_problem const*>(problem);
  auto const& ar = *static_cast<ckfmha_conv_fwd_args const*>(args);
  ConvFwdParams params = make_conv_fwd_params(pr, ar);
  if (view != nullptr) params.filter_view = *view;
  const int64_t tiles_m = (params.rows + Traits::kTileM - 1) / Traits::kTileM;
  const int64_t tiles_n = (params.out_channels + Traits::kTileN - 1) / Traits::kTileN;
  if (tiles_m > 0x7fffffff || tiles_n > 65535) return -int(cudaErrorInvalidConfiguration);
  dim3 grid(unsigned(tiles_m), unsigned(tiles_n), unsigned(std::min(params.groups, 65535)));
  return launch_kernel(kernel, grid, Traits::kThreads, Traits::kSmemLaunchBytes, stream, params);
}

template <class Traits>
int launch_conv_fwd_sm80(void const* problem, void const* args,
                         ckfmha_launch_context const* context, ckfmha_stream_t stream) {
  (void)context;  // no device metadata is read
  return launch_conv_fwd<Traits>(&conv_fwd_sm80_kernel<Traits>, problem, args, stream);
}

// A filter view from the context (backward-data) runs the viewed-filter
// variant, whose 16-byte vectors of w run along the output channels: the
// runtime gives a view only to 8-channel instances, for output channels in
// whole vectors of a 16-byte aligned w whose channels are one apart
// (reads_filter_view, conv_bwd_plan.cpp).
template <class Traits>
int launch_conv_fwd_sm90(void const* problem, void const* args,
                         ckfmha_launch_context const* context, ckfmha_stream_t stream) {
  if (context == nullptr || context->conv_filter_view == nullptr) {
    return launch_conv_fwd<Traits>(&conv_fwd_sm90_kernel<Traits>, problem, args, stream);
  }
  if constexpr (Traits::kVector == 8) {
    auto const& pr = *static_cast<ckfmha_conv_problem const*>(problem);
    auto const& ar = *static_cast<ckfmha_conv_fwd_args const*>(args);
    ConvFilterView const& view = *static_cast<ConvFilterView const*>(context->conv_filter_view);
    // Every vector's first element 16-byte aligned.
    bool whole_vectors = view.out_channel == 1 && pr.out_channels % 8 == 0 &&
                         reinterpret_cast<uintptr_t>(ar.w) % 16 == 0 && view.first % 8 == 0 &&
                         view.group % 8 == 0 && view.in_channel % 8 == 0;
    for (int d = 0; d < 3; ++d) whole_vectors = whole_vectors && view.tap[d] % 8 == 0;
    if (!whole_vectors) return -int(cudaErrorInvalidValue);
    using Viewed = ConvFwdSm90ViewedFilterTraits<Traits>;
    return launch_conv_fwd<Viewed>(&conv_fwd_sm90_kernel<Viewed>, problem, args, stream, &view);
  } else {
    return -int(cudaErrorInvalidValue);
  }
}

// The TMA forward: as many CTAs as SMs hold at once (fewer for few tiles), each walking
// output tiles in turn (fwd_tma_kernel.cuh); where the tiles leave most SMs
// idle, clusters of CTAs that share each tile's k-tiles, one cluster a tile
// (conv_fwd_tma_splits, on this launch's share of the SMs beside `concurrent`
// convolutions; the planner's cost model splits alike). The runtime has
// checked the problem against conv_tma_limit and the channel vector of 8.
template <class Traits>
int run_conv_fwd_tma(ConvFwdTmaParams params, int32_t concurrent, ckfmha_stream_t stream) {
  if (int err = encode_conv_fwd_tma_maps<Traits>(params.conv, &params.x_map, &params.w_map)) {
    return err;
  }
  params.tiles_m = (params.conv.rows + Traits::kTileM - 1) / Traits::kTileM;
  params.tiles_n = (params.conv.out_channels + Traits::kTileN - 1) / Traits::kTileN;
  int sms = 0;
  if (int err = current_device_sms(&sms)) return err;
  const int64_t tiles = params.tiles_m * params.tiles_n * params.conv.groups;
  if (tiles == 0) return 0;
  // The split sum stages its partial tile in the operand stages.
  constexpr bool kCanSplit =
      conv_split_scratch_bytes(Traits::kTileM, Traits::kTileN, kConvMaxClusterSplits) <=
      Traits::kSmemBytes;
  params.split_shift =
      kCanSplit ? conv_fwd_tma_split_shift(tiles, params.conv.reduction,
                                           sms / std::max<int32_t>(concurrent, 1))
                : 0;
  const int32_t splits = 1 << params.split_shift;
  if (splits > 1) {
    // One CTA an SM (conv_cluster_spread_smem): the tiles' CTAs are at most the SMs.
    const int smem =
        conv_detail::conv_cluster_spread_smem(Traits::kSmemLaunchBytes, tiles * splits, sms);
    return launch_kernel_cluster(&conv_fwd_tma_kernel<Traits, true>,
                                 dim3(unsigned(tiles * splits)), dim3(unsigned(splits), 1, 1),
                                 Traits::kThreads, smem, stream, params);
  }
  const dim3 grid(unsigned(std::min<int64_t>(tiles, int64_t(sms) * Traits::kMinCtasPerSm)));
  return launch_kernel(&conv_fwd_tma_kernel<Traits, false>, grid, Traits::kThreads,
                       Traits::kSmemLaunchBytes, stream, params);
}

// A filter view from the context (backward-data) runs the transposed-filter
// variant; its offsets are whole taps of the filter (the view's tap
// strides are multiples of one tap's channels).
template <class Traits>
int launch_conv_fwd_tma(void const* problem, void const* args,
                        ckfmha_launch_context const* context, ckfmha_stream_t stream) {
  auto const& pr = *static_cast<ckfmha_conv_problem const*>(problem);
  auto const& ar = *static_cast<ckfmha_conv_fwd_args const*>(args);
  ConvFwdTmaParams params{};
  params.conv = make_conv_fwd_params(pr, ar);
  const int32_t concurrent = context != nullptr ? context->conv_concurrent : 1;
  if (context == nullptr || context->conv_filter_view == nullptr) {
    return run_conv_fwd_tma<Traits>(params, concurrent, stream);
  }
  ConvFilterView const& view = *static_cast<ConvFilterView const*>(context->conv_filter_view);
  params.conv.filter_view = view;
  const int64_t run = pr.out_channels;
  if (run == 0 || view.first % run != 0) return -int(cudaErrorInvalidValue);
  params.filter_first_tap = int32_t(view.first / run);
  for (int d = 0; d < 3; ++d) {
    if (view.tap[d] % run != 0) return -int(cudaErrorInvalidValue);
    params.filter_tap_step[d] = int32_t(view.tap[d] / run);
  }
  return run_conv_fwd_tma<ConvFwdTmaTransposedFilterTraits<Traits>>(params, concurrent, stream);
}

// The direct template's vector path takes a problem of kG-channel groups
// whose geometry conv_vector_fwd_limit allows and whose x and y the 16-byte
// loads and stores can address.
template <int kG>
bool vector_fwd_fits(ConvFwdParams const& p) {
  if (p.in_channels != kG || p.out_channels != kG ||
      conv_vector_fwd_limit(p.groups, p.in_channels, p.out_channels,
                            int64_t(p.filter[0]) * p.filter[1] * p.filter[2], p.filter[2],
                            p.stride[2], p.dilation[2]) != nullptr) {
    return false;
  }
  bool aligned = reinterpret_cast<uintptr_t>(p.x) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(p.y) % 16 == 0;
  for (int d = 0; d < 4; ++d) {
    aligned = aligned && p.x_stride[d] % kDepthwiseVector == 0 &&
              p.y_stride[d] % kDepthwiseVector == 0;
  }
  return aligned;
}

// The largest divisor of `count` that is at most `limit`.
inline int32_t largest_divisor_up_to(int64_t count, int32_t limit) {
  for (int32_t d = limit; d > 1; --d) {
    if (count % d == 0) return d;
  }
  return 1;
}

// The vector kernel's run along w (vector_fwd_kernel.cuh): 4 outputs a
// thread, or 2 for depthwise 3-wide filters where runs of 4 give the SMs
// fewer than kVectorFwdShortRunWarps warps each. MobileNet's batch-1 3x3
// layers (1,700-14,000 threads of runs of 4 on 132 SMs) wait on each
// thread's loads in turn; twice the threads took them 4-17% faster (6.3 ->
// 5.2 us at 112x112 stride 2). Its batch-32 7x7 layer (13 warps an SM) ran
// 34% slower on runs of 2 (6.8 -> 9.1 us: a third more loads, each thread's
// setup over half the outputs). ResNeXt's batch-1 layer of 4-channel groups
// read the same on either (5.7-5.9 us), so wider groups keep runs of 4 and
// their instances build no second kernel (H200, NOTES 124).
constexpr int64_t kVectorFwdShortRunWarps = 4;

inline int32_t vector_fwd_run(ConvFwdParams const& params, int64_t total_vectors, int sms,
                              bool depthwise) {
  const int64_t runs_of_4 = int64_t(params.batch) * params.output[0] * params.output[1] *
                            ((params.output[2] + 3) / 4);
  const bool narrow = params.filter[2] <= 3;
  const bool few = runs_of_4 * total_vectors < kVectorFwdShortRunWarps * 32 * sms;
  return depthwise && narrow && few ? 2 : 4;
}

// Threads that share each run's filter rows (vector_fwd_kernel.cuh): where
// the runs give the SMs fewer than kVectorFwdSplitRowsWarps warps each, as
// many as bring them there, up to the filter's rows and
// kVectorFwdMaxRowParts, and no more than leave every part a row. ConvNeXt's
// batch-1 7x7 layers ran 1.1-1.4x faster (768 groups: 8.6 -> 6.3 us). With 4
// warps the 56x56 and 28x28 layers split into too few parts (9.9 and 8.2 us
// against 8.8 and 7.0); with 16 the batch-32 7x7 layer (13 warps an SM)
// split too and ran 9% slower. Only filters wider than 3 split, on the wide
// window they run anyway: MobileNet's batch-1 3x3 layers ran 0.87-1.12x the
// time split, and ResNeXt's batch-1 layer of 4-channel groups 5.9 -> 6.4 us
// on the wide window (H200, NOTES 125).
constexpr int64_t kVectorFwdSplitRowsWarps = 8;
constexpr int32_t kVectorFwdMaxRowParts = 8;

inline int32_t vector_fwd_row_parts(ConvFwdParams const& params, int64_t run_threads, int sms) {
  const int64_t rows = int64_t(params.filter[0]) * params.filter[1];
  const int64_t wanted = kVectorFwdSplitRowsWarps * 32 * sms;
  if (rows <= 1 || run_threads >= wanted || params.filter[2] <= 3) return 1;
  const int64_t parts =
      std::min<int64_t>({rows, kVectorFwdMaxRowParts, (wanted + run_threads - 1) / run_threads});
  const int64_t rows_each = (rows + parts - 1) / parts;
  return int32_t((rows + rows_each - 1) / rows_each);
}

// The vector kernel's CTAs (vector_fwd_kernel.cuh): 256 threads over the
// largest block of channel vectors up to 8 (and up to what 48 KiB of
// filters hold) that divides the problem's (whole blocks, and a tap's
// weights read by many threads), made smaller, threads first down to 64 and
// then vectors, while the grid holds fewer than kVectorFwdCtasPerSm CTAs an
// SM: a batch-1 layer's few runs then spread over every SM. Each CTA stages
// the filters of all its vectors, so smaller CTAs stage more for their
// runs: with 4 CTAs an SM as the target, the depthwise layers ran 1.03x
// slower at batch 32 (ConvNeXt's 14x14 7.3 against 8.1 TFLOP/s) and 1.01x at
// batch 1 than with 2; with 1, ConvNeXt's batch-1 56x56 layer ran 12% slower
// (H200, NOTES 124). Split rows multiply a run's threads by row_parts.
constexpr int64_t kVectorFwdCtasPerSm = 2;
template <class Element, int kG>
int launch_conv_fwd_vector(ConvFwdParams const& params, ckfmha_stream_t stream) {
  int sms = 0;
  if (int err = current_device_sms(&sms)) return err;
  const int64_t total_vectors = params.groups * kG / kDepthwiseVector;
  const int32_t run = vector_fwd_run(params, total_vectors, sms, kG == 1);
  const int64_t runs = int64_t(params.batch) * params.output[0] * params.output[1] *
                       ((params.output[2] + run - 1) / run);
  if (runs == 0) return 0;
  const int32_t row_parts = vector_fwd_row_parts(params, runs * total_vectors, sms);
  const int64_t taps = int64_t(params.filter[0]) * params.filter[1] * params.filter[2];
  const int64_t vector_bytes = vector_fwd_filter_floats<kG>(taps) * int64_t(sizeof(float));
  const int32_t fitting = int32_t(std::clamp<int64_t>(48 * 1024 / vector_bytes, 1, 8));
  int32_t threads = conv_detail::kVectorFwdThreads;
  int32_t vectors = largest_divisor_up_to(total_vectors, fitting);
  // Runs a CTA: a thread a vector and a row part each.
  auto slots = [&] { return std::max<int64_t>(1, threads / (int64_t(vectors) * row_parts)); };
  auto ctas = [&] { return (runs + slots() - 1) / slots() * (total_vectors / vectors); };
  // A thread stages vectors x vector_floats / threads weights, one load
  // after another. Where the rows are split (small grids) that wait is much
  // of a CTA's, so there vectors shrink before threads while a thread stages
  // more than 8 (ConvNeXt's 7x7 layers). Not further: wider CTAs read wider
  // runs of x's channels (split 3x3 rows on one vector a CTA ran MobileNet's
  // batch-1 112x112 layer 26% slower).
  const int64_t vector_floats = vector_fwd_filter_floats<kG>(taps);
  auto staging_first = [&] {
    return row_parts > 1 && vectors > 1 && vectors * vector_floats > 8 * int64_t(threads);
  };
  while (ctas() < kVectorFwdCtasPerSm * int64_t(sms) && (threads > 64 || vectors > 1)) {
    if (threads > 64 && !staging_first()) {
      threads /= 2;
    } else {
      vectors = largest_divisor_up_to(total_vectors, vectors - 1);
    }
  }
  const int64_t blocks = (runs + slots() - 1) / slots();
  const int64_t vector_blocks = total_vectors / vectors;
  if (blocks > 0x7fffffff || vector_blocks > 65535) return -int(cudaErrorInvalidConfiguration);
  const dim3 grid{unsigned(blocks), unsigned(vector_blocks)};
  const int64_t run_threads = slots() * vectors;
  // Split rows run 4 outputs a thread (only 3-wide filters take runs of 2).
  const int64_t partial_floats = vector_fwd_partial_floats<4>(run_threads, row_parts);
  const int smem = int(vectors * vector_bytes + partial_floats * int64_t(sizeof(float)));
  const bool narrow = params.filter[2] <= 3;
  constexpr int kWide = kDepthwiseMaxWidth;
  auto kernel = params.stride[2] == 1
                    ? (narrow ? &conv_fwd_vector_kernel<Element, 1, 3, kG, 4, false>
                              : &conv_fwd_vector_kernel<Element, 1, kWide, kG, 4, false>)
                    : (narrow ? &conv_fwd_vector_kernel<Element, 2, 3, kG, 4, false>
                              : &conv_fwd_vector_kernel<Element, 2, kWide, kG, 4, false>);
  if constexpr (kG == 1) {
    if (run == 2) {
      kernel = params.stride[2] == 1 ? &conv_fwd_vector_kernel<Element, 1, 3, kG, 2, false>
                                     : &conv_fwd_vector_kernel<Element, 2, 3, kG, 2, false>;
    }
  }
  // Split rows: filters 4-7 wide, the wide window.
  if (row_parts > 1) {
    kernel = params.stride[2] == 1 ? &conv_fwd_vector_kernel<Element, 1, kWide, kG, 4, true>
                                   : &conv_fwd_vector_kernel<Element, 2, kWide, kG, 4, true>;
  }
  return launch_kernel(kernel, grid, int(run_threads * row_parts), smem, stream,
                       ConvVectorFwdParams{params, vectors, row_parts});
}

// Groups of few channels on the CUDA cores: one CTA per (output tile, block
// of 32 groups, batch). Its shared memory depends on the problem (the input
// tile a stride, dilation and filter need); the runtime checks it fits
// before choosing the kernel (conv_plan.cpp), and the launch fails cleanly
// otherwise. Where its vectors fit, the vector path runs instead: the
// one-channel instance for depthwise problems, the 2- and 4-channel ones for
// groups of 2 or 4 channels (as many in as out) that they hold. Both paths
// stage the filter element by element, so they read it through the
// context's filter view where there is one.
template <class Traits>
int launch_conv_fwd_direct(void const* problem, void const* args,
                           ckfmha_launch_context const* context, ckfmha_stream_t stream) {
  auto const& pr = *static_cast<ckfmha_conv_problem const*>(problem);
  auto const& ar = *static_cast<ckfmha_conv_fwd_args const*>(args);
  ConvFwdParams params = make_conv_fwd_params(pr, ar);
  if (context != nullptr && context->conv_filter_view != nullptr) {
    params.filter_view = *static_cast<ConvFilterView const*>(context->conv_filter_view);
  }
  using Element = typename Traits::Element;
  if constexpr (Traits::kMaxChannels == 1) {
    if (vector_fwd_fits<1>(params)) return launch_conv_fwd_vector<Element, 1>(params, stream);
  } else {
    if (vector_fwd_fits<2>(params)) return launch_conv_fwd_vector<Element, 2>(params, stream);
    if constexpr (Traits::kMaxChannels == 4) {
      if (vector_fwd_fits<4>(params)) return launch_conv_fwd_vector<Element, 4>(params, stream);
    }
  }
  const int64_t smem = conv_detail::direct_tile<Traits>(params).bytes();
  if (smem > 227 * 1024) return -int(cudaErrorInvalidConfiguration);
  const int64_t tiles = int64_t((params.output[2] + Traits::kTileW - 1) / Traits::kTileW) *
                        ((params.output[1] + Traits::kTileH - 1) / Traits::kTileH) *
                        params.output[0];
  const int64_t group_blocks = (params.groups + Traits::kGroups - 1) / Traits::kGroups;
  if (tiles > 0x7fffffff || group_blocks > 65535 || params.batch > 65535) {
    return -int(cudaErrorInvalidConfiguration);
  }
  dim3 grid(unsigned(tiles), unsigned(group_blocks), unsigned(params.batch));
  return launch_kernel(&conv_fwd_direct_kernel<Traits>, grid, Traits::kThreads, int(smem), stream,
                       params);
}

}  // namespace ckfmha::kernel
