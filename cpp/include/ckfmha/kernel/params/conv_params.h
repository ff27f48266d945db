// What a convolution kernel reads from the runtime's problem: sizes in the
// 3D form every instance uses (a 2D problem is one of depth 1: input, filter,
// stride, dilation 1 and padding 0 in d) and 64-bit element strides.
#pragma once

#include <cstdint>

namespace ckfmha::kernel {

// Where a kernel that reads filter views finds weight (group g, output
// channel k, tap (z, y, x), input channel c) of its problem, in elements from
// w: first + g * group + k * out_channel + c * in_channel + z * tap[0] +
// y * tap[1] + x * tap[2]. Tap strides may be negative: the backward-data
// phases read the forward's filter in place, channel roles swapped and taps
// last first.
struct ConvFilterView {
  int64_t first;
  int64_t group;
  int64_t out_channel;
  int64_t in_channel;
  int64_t tap[3];
};

struct ConvFwdParams {
  const void* x;  // [batch, d, h, w, groups, in_channels]
  const void* w;  // [groups, out_channels, z, y, x, in_channels], dense (see filter_view)
  void* y;        // [batch, od, oh, ow, groups, out_channels]
  int32_t batch;
  int32_t groups;
  int32_t in_channels;
  int32_t out_channels;
  int32_t input[3];  // (d, h, w)
  int32_t filter[3];
  int32_t stride[3];
  int32_t padding[3];
  int32_t dilation[3];
  int32_t output[3];
  int64_t x_stride[4];  // (batch, d, h, w); group stride in_channels, channel 1
  int64_t y_stride[4];  // (batch, d, h, w); group stride out_channels, channel 1
  // The implicit GEMM per group: rows are output positions (batch * od * oh *
  // ow), columns output channels, the reduction filter taps times channels.
  int64_t rows;
  int32_t reduction;
  // 1: adjacent output channels may be stored as one 4-byte pair (y 4-byte
  // aligned, its strides and out_channels even).
  int32_t paired_stores;
  // 1: runs of 8 output channels may be stored as one 16-byte vector (y
  // 16-byte aligned, its strides and out_channels multiples of 8).
  int32_t vector_stores;
  // How the direct kernels and the TMA kernel's transposed-filter variant
  // read w: its dense layout above, or backward-data's transposed and
  // flipped view of it (the other kernels are handed dense filters only).
  ConvFilterView filter_view;
};

// Backward-weight: the forward problem's geometry, with y holding dy (read)
// and w the gradient dw (written). A plan that splits the reduction over
// positions adds each CTA's partial sums into `accum`, fp32 in w's layout
// ([groups, out_channels, reduction], zeroed first), and a later pass
// converts it; with one split the CTAs store dw directly.
struct ConvBwdWeightParams {
  ConvFwdParams conv;
  float* accum;  // null: store into conv.w
  int64_t tiles_per_split;  // k-tiles of positions each split reduces
  // 1: adjacent reduction elements of dw may be stored as one 4-byte pair.
  int32_t paired_stores;
  // Consecutive groups multiplied as one (conv_weight_pack): conv then holds
  // the packed problem (groups / pack, channels x pack), and these the real
  // per-group counts the store maps dw back to.
  int32_t pack;
  int32_t group_in_channels;
  int32_t group_out_channels;
  int32_t group_reduction;  // filter taps x group_in_channels
  // 1: the grid's y CTAs of a tile (its splits) form a cluster and add their
  // partial sums through distributed shared memory before storing dw
  // (accum null; conv_weight_cluster_sum).
  int32_t cluster_sum;
};

// Backward-weight multiplies `pack` consecutive groups of few channels as one
// group of pack x the channels and keeps only the products of a group with
// itself (the block diagonal): a position's channels of those groups are one
// contiguous run, so the gathers read whole 128-byte lines instead of 8 to 64
// bytes of each, and the tensor-core tile is filled along the output
// channels. The largest power of two dividing the groups whose packed
// channels stay within 64 (one shared-memory atom) and whose packed
// reduction (filter taps x channels x pack) stays a 32-bit index: groups of
// 32 channels pair up, groups of 8 pack by 8, wider groups run alone. Only
// from 4096 positions (batch x output positions): on the selection oracle's
// layers with groups of 32 channels or fewer, packing made the fastest
// mma.sync plan 12-43% faster from 4000 positions on and 14-26% slower below
// (a short reduction over fewer, wider CTAs).
constexpr int32_t kWeightPackChannels = 64;
constexpr int64_t kWeightPackMinPositions = 4096;

//
// The kernel fed by the copy engine (`tma`) packs from 1024 positions: its
// copies take 64 channels of one tap, so groups of 16 or 32 channels reach it
// only packed. ResNeXt's last stage at batch 32 (1568 positions, groups of
// 32) took 30.1 us on the gathering kernels and 17.6 packed on it; its
// batch-1 layers of 49-784 positions ran 1.1-1.7x slower packed on it than
// one group at a time on the gathering kernels (H200, NOTES 119).
constexpr int64_t kWeightTmaPackMinPositions = 1024;

constexpr int32_t conv_weight_pack(int32_t groups, int32_t in_channels, int32_t out_channels,
                                   int64_t reduction, int64_t positions, bool tma = false) {
  const int32_t widest = in_channels > out_channels ? in_channels : out_channels;
  int32_t pack = 1;
  if (positions < (tma ? kWeightTmaPackMinPositions : kWeightPackMinPositions)) return pack;
  while (groups % (2 * pack) == 0 && 2 * pack * widest <= kWeightPackChannels &&
         2 * pack * reduction <= 0x7fffffff) {
    pack *= 2;
  }
  return pack;
}

// The forward and backward-data plans multiply `pack` consecutive groups as
// one, through a block-diagonal filter the plan writes into the workspace
// (zeros between the groups), where that makes the convolution's reduction
// channels (pack x the groups' `reduction_channels`, 8 to 32: the forward's
// input channels, backward-data's output channels) exactly 64: the TMA
// forward then runs them at whole 64-channel chunks and spends (pack - 1) /
// pack of its products on the zeros, which the tensor cores have to spare
// (the gathering kernels ran these groups at 0.5-0.8x cuDNN). x and y need no
// change: a position's channels of consecutive groups are one run. The
// runtime takes the packed plan only where it runs on the TMA template, from
// 1024 output positions (batch x output positions), and where the unpacked
// plan is not on the TMA template already (backward-data's read w in place;
// packing adds the rearrangement): on ResNeXt-50's batch-1 layers of 49-784
// positions the packed backward-data plans ran 1.1-2.3x slower, from 3136
// positions 1.03-2.5x faster (NOTES 121).
constexpr int32_t kTmaPackChannels = 64;
constexpr int64_t kTmaPackMinPositions = 1024;

constexpr int32_t conv_tma_pack(int32_t groups, int32_t reduction_channels) {
  if (reduction_channels < 8 || reduction_channels >= kTmaPackChannels ||
      kTmaPackChannels % reduction_channels != 0) {
    return 1;
  }
  const int32_t pack = kTmaPackChannels / reduction_channels;
  return groups % pack == 0 ? pack : 1;
}

// The most CTAs whose partial sums of one tile meet in a cluster: the
// portable cluster size.
constexpr int32_t kConvMaxClusterSplits = 8;

// The split sum's scratch (cluster_split_sum.cuh): a kTileM x kTileN float
// tile in bands of ceil(tile_m / splits) rows, one slot of its band per rank
// at each owner, rows padded by 8 floats.
constexpr int64_t conv_split_scratch_pitch(int64_t tile_n) { return tile_n + 8; }
constexpr int64_t conv_split_scratch_bytes(int64_t tile_m, int64_t tile_n, int64_t splits) {
  return splits * ((tile_m + splits - 1) / splits) * conv_split_scratch_pitch(tile_n) * 4;
}

// CTAs of one cluster that share each output tile of the TMA forward, each
// multiplying an equal run of its k-tiles, their partial sums added through
// distributed shared memory: only where the tiles leave most SMs idle (a
// batch-1 7x7x512 layer has 4 tiles of 64x128 and a reduction of 4608
// columns), doubling while every split keeps at least kTmaFwdMinSplitColumns
// of the reduction and the tiles' CTAs fit one an SM; a power of two (the
// kernel finds a CTA's rank by a mask), at most the portable cluster. The
// split sum (three cluster barriers, the partial tile through distributed
// shared memory) costs about as much as a dozen 64-column k-tiles: splits of 256-320 columns lost, and so did 1152 columns
// in two on 64-column k-tiles (ResNet-18's batch-1 28x28 layer, 6.3 -> 6.9 us
// on an H200) and in four on 32-column ones (8.9 us), so reductions under
// kTmaFwdMinColumnsToSplit stay whole. Counted in columns, not k-tiles, so
// that a tile of 32-column k-tiles splits as one of 64 does. Returns the
// split count's log2.
constexpr int64_t kTmaFwdMinSplitColumns = 512;
constexpr int64_t kTmaFwdMinColumnsToSplit = 1536;

constexpr int32_t conv_fwd_tma_split_shift(int64_t tiles, int64_t reduction, int64_t sms) {
  int32_t shift = 0;
  if (reduction < kTmaFwdMinColumnsToSplit) return shift;
  while ((2 << shift) <= kConvMaxClusterSplits && tiles * (2 << shift) <= sms &&
         reduction >= (2 << shift) * kTmaFwdMinSplitColumns) {
    ++shift;
  }
  return shift;
}

constexpr int32_t conv_fwd_tma_splits(int64_t tiles, int64_t reduction, int64_t sms) {
  return 1 << conv_fwd_tma_split_shift(tiles, reduction, sms);
}

// The corners of the box the copy engine's im2col walk steps through along one
// dim: the first tap-0 input coordinate (-padding) and the last one,
// (output - 1) x stride - padding, as an offset from input - 1. The output
// count, not the padding, fixes the last: the backward-data plan's stride
// phases have outputs no symmetric padding would give.
constexpr int64_t conv_tma_lower_corner(int32_t padding) { return -int64_t(padding); }
constexpr int64_t conv_tma_upper_corner(int32_t input, int32_t output, int32_t stride,
                                        int32_t padding) {
  return int64_t(output - 1) * stride - padding - (input - 1);
}

// Why the copy engine's im2col mode cannot walk a problem's output grid, or
// null. Per spatial dim (spatial_dims of them, outermost first): the walk's
// corners must fit the descriptor's signed fields (8 bits a dim in 2D, 5 bits
// in 3D), a tap's offset its unsigned ones, and the stride its traversal step
// (at most 8).
inline const char* conv_tma_walk_limit(int spatial_dims, const int32_t* input,
                                       const int32_t* output, const int32_t* filter,
                                       const int32_t* stride, const int32_t* padding,
                                       const int32_t* dilation) {
  const int32_t corner_min = spatial_dims == 2 ? -128 : -16;
  const int32_t corner_max = spatial_dims == 2 ? 127 : 15;
  const int32_t reach_max = spatial_dims == 2 ? 255 : 31;
  for (int i = 0; i < spatial_dims; ++i) {
    if (stride[i] > 8) return "the copy engine steps at most 8 positions (stride <= 8)";
    const int64_t reach = int64_t(filter[i] - 1) * dilation[i];
    if (reach > reach_max) {
      return spatial_dims == 2 ? "(filter - 1) x dilation must be at most 255 in 2D"
                               : "(filter - 1) x dilation must be at most 31 in 3D";
    }
    const int64_t lower = conv_tma_lower_corner(padding[i]);
    const int64_t upper = conv_tma_upper_corner(input[i], output[i], stride[i], padding[i]);
    if (lower < corner_min || lower > corner_max || upper < corner_min || upper > corner_max) {
      return spatial_dims == 2
                 ? "-padding and (output - 1) x stride - padding - (input - 1) must lie in "
                   "[-128, 127] in 2D"
                 : "-padding and (output - 1) x stride - padding - (input - 1) must lie in "
                   "[-16, 15] in 3D";
    }
  }
  return nullptr;
}

// Why the copy engine's im2col mode cannot feed a forward problem, or null:
// the walk's limits, and a k-tile is tile_k channels of one tap, so the
// group's channels must divide by it, and all groups' channels are one 32-bit
// coordinate.
inline const char* conv_tma_limit(int spatial_dims, int64_t groups, int32_t in_channels,
                                  int32_t tile_k, const int32_t* input, const int32_t* output,
                                  const int32_t* filter, const int32_t* stride,
                                  const int32_t* padding, const int32_t* dilation) {
  if (tile_k <= 0 || in_channels % tile_k != 0) {
    return "its k-tiles are whole runs of one tap's channels: in_channels must be a multiple "
           "of its tile_k";
  }
  if (groups * in_channels > 0x7fffffff) return "groups x in_channels exceeds 2^31";
  return conv_tma_walk_limit(spatial_dims, input, output, filter, stride, padding, dilation);
}

// The backward-weight kernel fed by the copy engine (bwd_weight_tma_kernel.cuh)
// loads x in chunks of this many channels of one filter tap (128 bytes, the
// swizzle span), and dy in chunks of as many output channels.
constexpr int32_t kWeightTmaChunk = 64;

// Why it cannot take a problem, or null. `pack`: the groups it multiplies as
// one (conv_weight_pack). x's walk is the forward's; dy's, over dy itself,
// always fits.
inline const char* conv_weight_tma_limit(int spatial_dims, int64_t groups, int32_t in_channels,
                                         int32_t out_channels, int32_t pack,
                                         const int32_t* input, const int32_t* output,
                                         const int32_t* filter, const int32_t* stride,
                                         const int32_t* padding, const int32_t* dilation) {
  if (int64_t(in_channels) * pack % kWeightTmaChunk != 0) {
    return "its copies are 64-channel runs of one filter tap: in_channels (times the groups "
           "multiplied as one) must be a multiple of 64";
  }
  if (groups * in_channels > 0x7fffffff || groups * out_channels > 0x7fffffff) {
    return "groups x channels exceeds 2^31";
  }
  return conv_tma_walk_limit(spatial_dims, input, output, filter, stride, padding, dilation);
}

// The direct template's depthwise path (conv/vector_fwd_kernel.cuh) loads
// eight groups of one channel as one 16-byte vector and holds a thread's
// window of inputs along w in registers: at most this many filter taps
// along w, unit dilation there, stride 1 or 2. Its CTA stages its groups'
// filters in fp32: at most 64 groups x kDepthwiseMaxTaps taps, 48 KiB.
constexpr int32_t kDepthwiseVector = 8;
constexpr int32_t kDepthwiseMaxWidth = 7;
constexpr int32_t kDepthwiseMaxTaps = 192;

// Why the depthwise path cannot take a problem's geometry, or null (the
// one-lane-a-group path then runs it). The launch also needs x and y
// 16-byte aligned and their strides multiples of 8 elements.
inline const char* conv_depthwise_limit(int64_t groups, int32_t in_channels,
                                        int32_t out_channels, int64_t taps, int32_t filter_w,
                                        int32_t stride_w, int32_t dilation_w) {
  if (in_channels != 1 || out_channels != 1) return "groups of one input and one output channel";
  if (groups % kDepthwiseVector != 0) return "groups a multiple of 8";
  if (taps > kDepthwiseMaxTaps) return "at most 192 filter taps";
  if (filter_w > kDepthwiseMaxWidth) return "filters at most 7 wide along w";
  if (dilation_w != 1) return "no dilation along w";
  if (stride_w != 1 && stride_w != 2) return "stride 1 or 2 along w";
  return nullptr;
}

// Why the forward direct instances' vector path (conv/vector_fwd_kernel.cuh)
// cannot take a problem's geometry, or null (the one-lane-a-group path then
// runs it). One-channel groups take the depthwise path's limits; groups of 2
// or 4 channels (as many in as out) are loaded eight channels at a time, so
// whole groups must make up the vectors. The launch also needs x and y
// 16-byte aligned and their strides multiples of 8 elements.
inline const char* conv_vector_fwd_limit(int64_t groups, int32_t in_channels,
                                         int32_t out_channels, int64_t taps, int32_t filter_w,
                                         int32_t stride_w, int32_t dilation_w) {
  if (in_channels == 1 && out_channels == 1) {
    return conv_depthwise_limit(groups, in_channels, out_channels, taps, filter_w, stride_w,
                                dilation_w);
  }
  if (in_channels != out_channels || (in_channels != 2 && in_channels != 4)) {
    return "groups of 1, 2 or 4 channels, as many in as out";
  }
  if (groups * in_channels % kDepthwiseVector != 0) {
    return in_channels == 2 ? "groups of two channels a multiple of 4"
                            : "an even number of groups of four channels";
  }
  if (taps > kDepthwiseMaxTaps) return "at most 192 filter taps";
  if (filter_w > kDepthwiseMaxWidth) return "filters at most 7 wide along w";
  if (dilation_w != 1) return "no dilation along w";
  if (stride_w != 1 && stride_w != 2) return "stride 1 or 2 along w";
  return nullptr;
}

// Filter columns a task of the backward-weight vector path sums: one for
// eight-channel groups (64 sums a column fill the registers); for one-channel
// groups, a whole row up to kDepthwiseMaxWidth wide where it is wider than 3
// (a run's dy is then loaded and widened once for all its columns: 7-wide
// rows as two blocks of 4 loaded it twice and summed an eighth column for
// nothing); else three.
constexpr int32_t conv_vector_weight_cols(int32_t group_channels, int32_t filter_w) {
  return group_channels == 8 ? 1 : group_channels == 1 && filter_w > 3 ? kDepthwiseMaxWidth : 3;
}

// Channels the backward-weight vector path loads at once for groups of G
// channels and tasks of `cols` columns: eight (a 16-byte load) for groups of
// eight channels and for three-column tasks of one-channel groups, else four
// (8 bytes), so that a thread's sums (cols x 4 x G) leave room for its window
// of 8-position runs in the registers (eight channels of two-channel groups
// spilled 88-172 bytes inside the row loop).
constexpr int32_t conv_vector_weight_channels(int32_t group_channels, int32_t cols) {
  return group_channels == 8 || (group_channels == 1 && cols <= 3) ? 8 : 4;
}

// The channels the vector path loads at once for a problem's groups of G
// channels and its filter width along w.
constexpr int32_t conv_vector_weight_load_channels(int32_t group_channels, int32_t filter_w) {
  return conv_vector_weight_channels(group_channels,
                                     conv_vector_weight_cols(group_channels, filter_w));
}

// Output positions along w a thread of the vector path sums per row: 4 where
// it loads eight channels (as the forward's depthwise path; eight-channel
// groups' one-column tasks have no overlap to spread, their row loop is 64%
// products either way), 8 for four-channel loads, whose smaller vectors leave
// room for the longer window (it spreads a row's address and predicate work
// and the window's overlap over twice the products), except at stride 2 on
// whole 7-wide rows, whose window would be 21 inputs.
constexpr int32_t conv_vector_weight_run(int32_t group_channels, int32_t cols,
                                         int32_t stride_w) {
  return conv_vector_weight_channels(group_channels, cols) == 8 || (cols > 3 && stride_w > 1)
             ? 4
             : 8;
}

// Whether the vector path's kernel of these groups and columns also comes
// with runs one position shorter (conv_vector_weight_layout picks): the
// whole-row kernel of one-channel groups at stride 1.
constexpr bool conv_vector_weight_has_short_runs(int32_t group_channels, int32_t cols,
                                                 int32_t stride_w) {
  return group_channels == 1 && cols > 3 && stride_w == 1;
}

// Why the direct backward-weight instances' vector path
// (conv/vector_weight_kernel.cuh) cannot take a problem's geometry, or null
// (the one-lane-a-group path then runs it). One-channel groups take the
// depthwise forward's limits; groups of 2, 4 or 8 channels are loaded as
// whole groups, conv_vector_weight_channels at a time. The launch also needs
// x and dy aligned to such a vector and their strides in whole vectors.
inline const char* conv_vector_weight_limit(int64_t groups, int32_t in_channels,
                                            int32_t out_channels, int64_t taps,
                                            int32_t filter_w, int32_t stride_w,
                                            int32_t dilation_w) {
  if (in_channels == 1 && out_channels == 1) {
    return conv_depthwise_limit(groups, in_channels, out_channels, taps, filter_w, stride_w,
                                dilation_w);
  }
  if (in_channels != out_channels ||
      (in_channels != 2 && in_channels != 4 && in_channels != 8)) {
    return "groups of 1, 2, 4 or 8 channels, as many in as out";
  }
  if (in_channels == 2 && groups % 2 != 0) return "an even number of groups of two channels";
  if (filter_w > kDepthwiseMaxWidth) return "filters at most 7 wide along w";
  if (dilation_w != 1) return "no dilation along w";
  if (stride_w != 1 && stride_w != 2) return "stride 1 or 2 along w";
  return nullptr;
}

// What the runtime hands a backward-weight launcher as its `args`.
struct ConvBwdWeightLaunch {
  const void* x;
  const void* dy;
  void* dw;
  float* accum;    // null for one split, or for splits summed in a cluster
  int32_t splits;  // of the reduction over positions, >= 1
  int32_t cluster_sum;  // 1: an sm_90 implicit GEMM's splits sum in a cluster
};

// Whether a plan of `splits` on the gathering wgmma backward-weight kernel
// (pipeline sm90_cpasync_wgmma, its code sm_90's) adds its partial sums
// within a cluster and stores dw, instead of adding them into the zeroed fp32
// workspace and converting it after: two more launches, which on ResNeXt's
// batch-1 layers took a quarter of the time (9.9 -> 7.7 us). The TMA
// template sums in clusters too where its clusters are all resident at once
// (the runtime's tma_weight_cluster_sum); the mma.sync one keeps the
// workspace (40% slower in clusters). One group a CTA: the grid's z holds at
// most 65535.
inline bool conv_weight_cluster_sum(int32_t kernel_arch, int32_t splits, int64_t groups) {
  return kernel_arch >= 90 && splits > 1 && splits <= kConvMaxClusterSplits &&
         groups <= 65535;
}

}  // namespace ckfmha::kernel
