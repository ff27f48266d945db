// Host side: how the backward-weight vector path (conv/vector_weight_kernel.cuh)
// splits a problem over CTAs, and whether it stores dw itself. The launcher
// sizes its grid from this; the runtime reads it to know whether the launch
// needs the fp32 workspace zeroed before and converted after.
#pragma once

#include "ckfmha/kernel/params/conv_params.h"

#include <algorithm>
#include <cstdint>

namespace ckfmha::kernel {

// Warps a CTA has at most, one CTA an SM: 16 (128 registers a thread) for
// one-channel groups; 12 (168 registers) for wider ones, whose 8-position
// runs hold 48 sums, 36 words of inputs and their widened floats (at 128
// registers they spilled 56-128 bytes; at 4-position runs 47% of the row
// loop's instructions were not products, against 35% now).
constexpr int32_t conv_vector_weight_warps(int32_t group_channels) {
  return group_channels == 1 ? 16 : 12;
}

// CTAs that may sum one block of dw together and store it: a cluster of up
// to 8 (the portable size), adding their partial sums through distributed
// shared memory. A launch that splits a block over more CTAs adds into the
// fp32 workspace, which costs a zeroing and a conversion launch around it.
constexpr int32_t kVectorWeightMaxCluster = 8;

// Whether the vector path of groups of `group_channels` channels runs a
// problem: its geometry (conv_vector_weight_limit), x and dy as vectors
// (aligned pointers, strides in whole vectors), and rows whose offsets count
// in 32 bits.
inline bool conv_vector_weight_fits(int32_t group_channels, ConvFwdParams const& conv) {
  const int32_t vec = conv_vector_weight_load_channels(group_channels, conv.filter[2]);
  if (conv.in_channels != group_channels ||
      conv_vector_weight_limit(conv.groups, conv.in_channels, conv.out_channels,
                               int64_t(conv.filter[0]) * conv.filter[1] * conv.filter[2],
                               conv.filter[2], conv.stride[2], conv.dilation[2]) != nullptr) {
    return false;
  }
  bool aligned = reinterpret_cast<uintptr_t>(conv.x) % (2 * vec) == 0 &&
                 reinterpret_cast<uintptr_t>(conv.y) % (2 * vec) == 0;
  for (int d = 0; d < 4; ++d) {
    aligned = aligned && conv.x_stride[d] % vec == 0 && conv.y_stride[d] % vec == 0;
  }
  constexpr int64_t kLimit = int64_t(1) << 30;
  return aligned && conv.x_stride[3] * (conv.input[2] + 8) < kLimit &&
         conv.y_stride[3] * (conv.output[2] + 8) < kLimit;
}

// The groups' channel count whose vector path a direct backward-weight
// instance of `max_channels` runs for this problem, or 0 for its lane path:
// the one-channel instance takes one-channel groups, the 8-channel one groups
// of 8, the 2- and 4-channel ones groups of 2 and (the 4-channel one) 4.
inline int32_t conv_vector_weight_path(int32_t max_channels, ConvFwdParams const& conv) {
  if (max_channels == 1 || max_channels == 8) {
    return conv_vector_weight_fits(max_channels, conv) ? max_channels : 0;
  }
  if (conv_vector_weight_fits(2, conv)) return 2;
  return max_channels == 4 && conv_vector_weight_fits(4, conv) ? 4 : 0;
}

struct ConvVectorWeightLayout {
  int32_t run;              // output positions along w a thread sums per row
  int32_t vectors_per_cta;  // vectors of channels a CTA covers (a power of two)
  int32_t cols;             // filter columns a task sums
  int32_t column_blocks;    // blocks of `cols` filter columns a row
  int32_t tasks_per_cta;    // (filter row, column block) pairs a CTA sums
  int32_t warps_per_task;
  int32_t w_slots, h_slots;  // a task's threads over a strip: runs along w by rows
  int32_t w_chunks;          // strips along w
  int32_t rows_per_strip;    // output rows a strip covers
  int64_t grid[3];           // strip CTAs, blocks of vectors, blocks of tasks
  // 1: the grid's x CTAs of a block (a cluster where more than one) sum its
  // dw among themselves and store it; 0: each adds into the fp32 workspace.
  int32_t stores_dw;
};

// A CTA takes the largest power-of-two block of vectors up to `max_vectors`
// that divides the problem's and up to conv_vector_weight_warps tasks (filter
// row, block of columns), that many warps shared between them. A task's threads
// cover a strip: as many runs of `run` positions along w as they hold (in even
// chunks) by the rows left over. Strips shorten, down to those rows, until the
// grid has eight strips a CTA on a wave of one CTA an SM (the unevenness of the
// CTAs' last strips then costs at most an eighth). A block's strip CTAs store
// dw themselves where they fit a cluster (`clusters`: the kernel runs on sm_90)
// and either none is lost (up to 8 of them) or there are at most 16 strips (a
// CTA then sums two: on those batch-1 layers the two launches around the
// workspace took longer than a strip); without clusters, where one CTA takes
// them all. Clusters are the strip CTAs rounded up to a power of two, and only
// where the whole grid fits one wave of one CTA an SM: on ConvNeXt's 7x7 maps
// of 768 groups at batch 32, 24 clusters of 8 CTAs (192) ran in 30.1 us, 24 of
// exactly 5 (120, of which 22 clusters fit at once) in 39.1 us, the workspace's
// 120 CTAs and its two launches in 22.3.
inline ConvVectorWeightLayout conv_vector_weight_layout_of_run(int32_t group_channels,
                                                               ConvFwdParams const& conv,
                                                               int32_t sms, bool clusters,
                                                               int32_t run,
                                                               int32_t max_vectors) {
  const int32_t g = group_channels;
  const int32_t cols = conv_vector_weight_cols(g, conv.filter[2]);
  const int32_t vec = conv_vector_weight_channels(g, cols);
  const int32_t warps = conv_vector_weight_warps(g);
  ConvVectorWeightLayout l{};
  l.run = run;
  const int64_t total_vectors = int64_t(conv.groups) * g / vec;
  const int64_t runs_w = (conv.output[2] + run - 1) / run;
  const int64_t images = int64_t(conv.batch) * conv.output[0];
  l.vectors_per_cta = max_vectors;
  while (total_vectors % l.vectors_per_cta != 0) l.vectors_per_cta /= 2;
  l.cols = cols;
  l.column_blocks = (conv.filter[2] + l.cols - 1) / l.cols;
  const int32_t tasks = conv.filter[0] * conv.filter[1] * l.column_blocks;
  const int32_t task_blocks = (tasks + warps - 1) / warps;
  l.tasks_per_cta = (tasks + task_blocks - 1) / task_blocks;
  l.warps_per_task = warps / l.tasks_per_cta;
  const int32_t slots = l.warps_per_task * 32 / l.vectors_per_cta;
  l.w_chunks = int32_t(std::max<int64_t>(1, (runs_w + slots - 1) / slots));
  l.w_slots = int32_t(std::max<int64_t>(1, (runs_w + l.w_chunks - 1) / l.w_chunks));
  l.h_slots = std::max(1, slots / l.w_slots);
  const int64_t group_blocks = total_vectors / l.vectors_per_cta;
  const int64_t blocks_yz = std::max<int64_t>(1, group_blocks * task_blocks);
  // One CTA an SM (its registers fill the SM): a grid past the SM count
  // would run a second wave for its last few CTAs.
  const int64_t wave_x = std::max<int64_t>(1, int64_t(sms) / blocks_yz);
  auto strips = [&](int64_t rows) {
    return images * ((conv.output[1] + rows - 1) / rows) * l.w_chunks;
  };
  int64_t rows = std::max(1, conv.output[1]);
  while (rows > l.h_slots && strips(rows) < 8 * wave_x) {
    rows = std::max<int64_t>(l.h_slots, (rows + 1) / 2);
  }
  l.rows_per_strip = int32_t(rows);
  const int64_t strip_ctas = std::max<int64_t>(1, std::min(strips(rows), wave_x));
  int64_t cluster = 0;
  if (strip_ctas == 1) {
    cluster = 1;
  } else if (clusters && (strip_ctas <= kVectorWeightMaxCluster ||
                          strips(rows) <= 2 * kVectorWeightMaxCluster)) {
    cluster = 1;
    while (cluster < std::min<int64_t>(strip_ctas, kVectorWeightMaxCluster)) cluster *= 2;
    // Clusters only where every CTA starts in the first wave: a GPC runs
    // whole clusters only, so clusters of 4 or 8 CTAs that fill an SM each
    // reach 120 of 132 SMs on the H200 (cudaOccupancyMaxActiveClusters: 66
    // of 2, 30 of 4, 15 of 8; 22 of 5), and an eleventh is kept free.
    const int64_t usable = cluster <= 2 ? sms : int64_t(sms) * 10 / 11;
    if (cluster * blocks_yz > usable) cluster = 0;
  }
  l.stores_dw = cluster > 0 ? 1 : 0;
  l.grid[0] = cluster > 0 ? cluster : strip_ctas;
  l.grid[1] = group_blocks;
  l.grid[2] = task_blocks;
  return l;
}

// The share of a layout's thread steps (a slot of a task's threads over one
// run of one row) that fall on output positions: runs past the row's end,
// slots past the strip's runs or rows, and strips' last row steps are lost.
inline double conv_vector_weight_position_use(ConvVectorWeightLayout const& l,
                                              ConvFwdParams const& conv) {
  const int64_t out_h = std::max(1, conv.output[1]);
  const int64_t full_chunks = out_h / l.rows_per_strip;
  const int64_t last_rows = out_h - full_chunks * l.rows_per_strip;
  auto steps = [&](int64_t rows) { return (rows + l.h_slots - 1) / l.h_slots; };
  const int64_t row_steps = full_chunks * steps(l.rows_per_strip) + steps(last_rows);
  const int64_t slots = int64_t(l.warps_per_task) * 32 / l.vectors_per_cta;
  return double(conv.output[2]) * double(out_h) /
         (double(l.run) * double(slots) * double(l.w_chunks) * double(row_steps));
}

// The layout of the vector path's kernel for the problem: runs of
// conv_vector_weight_run positions; the whole-row kernel of one-channel
// groups at stride 1 also has runs of 7, taken where they lose fewer thread
// steps (rows 7 x 2^k wide, as ImageNet models' 56, 28, 14 and 7: runs of 8
// leave a slot idle or an eighth of the last run empty there). CTAs of 8
// vectors, or of 4 where twice the slots a task lose fewer steps (MobileNet's
// 28x28 maps: 7 runs of 4 over 20 slots leave 6 idle, over 40 slots 5).
inline ConvVectorWeightLayout conv_vector_weight_layout(int32_t group_channels,
                                                        ConvFwdParams const& conv, int32_t sms,
                                                        bool clusters) {
  const int32_t cols = conv_vector_weight_cols(group_channels, conv.filter[2]);
  const int32_t run = conv_vector_weight_run(group_channels, cols, conv.stride[2]);
  const bool short_runs = conv_vector_weight_has_short_runs(group_channels, cols, conv.stride[2]);
  ConvVectorWeightLayout best{};
  double best_use = 0.0;
  for (int32_t max_vectors : {8, 4}) {
    for (int32_t r : {run, run - 1}) {
      if (r != run && !short_runs) continue;
      const ConvVectorWeightLayout l =
          conv_vector_weight_layout_of_run(group_channels, conv, sms, clusters, r, max_vectors);
      const double use = conv_vector_weight_position_use(l, conv);
      if (best_use == 0.0 || use > 1.01 * best_use) best = l, best_use = use;
    }
  }
  return best;
}

}  // namespace ckfmha::kernel
