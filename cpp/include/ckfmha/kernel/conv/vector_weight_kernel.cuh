// Grouped convolution backward-weight for groups of one, two, four or eight
// channels (as many in as out) with several channels a vector load: the
// direct instances' vector path where the tensors allow it
// (conv_vector_weight_limit, conv_vector_weight_fits). The one-lane path reads two
// bytes a lane and adds every tap's run into shared memory with float atomics,
// which compile to a compare-and-swap loop on sm_90; here a thread keeps its
// sums in registers over many output runs and adds them once.
//
// dw[g][k][tap][c] sums dy[position][g][k] x x[position's input at tap][g][c]
// over every output position. A thread loads kVec consecutive channels (whole
// groups, or four or eight one-channel groups) of dy and of x. A task is one
// filter row and a block of up to kCols of its columns; a CTA holds up to 12 or 16
// tasks, a warp or more each, for one block of vectors. The CTA takes strips
// of output runs (conv_vector_weight_run positions along w): a chunk of runs
// along w over a chunk of rows of one image. Every task walks the same strip down its rows in step,
// so the input rows one task reads the others read a row later, and dy's rows
// are read by all: the L1 cache serves them after the first. Per run a thread
// loads the run's dy and the window of inputs the run reads through its
// task's columns, widens both to fp32 a word or a group at a time and
// accumulates kCols x kVec x G sums. At the end a CTA adds its threads' sums
// (shuffles within a warp, then shared memory across a task's warps) into dw's
// fp32 workspace, or, where the CTAs of a block of dw form a cluster (or one
// CTA takes all its strips), they add them among themselves and store dw.
#pragma once

#include "ckfmha/kernel/conv/vector_fwd_kernel.cuh"
#include "ckfmha/kernel/params/conv_params.h"
#include "ckfmha/kernel/params/conv_vector_weight_layout.h"

#include <cooperative_groups.h>

#include <cstdint>

namespace ckfmha::kernel {

namespace conv_detail {

// `Words` 32-bit words (two channels each) from a 4 x Words-byte aligned address.
template <int Words>
__device__ __forceinline__ void load_words(const void* address, uint32_t (&out)[Words]) {
  static_assert(Words == 2 || Words == 4, "8- or 16-byte vectors");
  if constexpr (Words == 4) {
    const uint4 v = __ldg(static_cast<const uint4*>(address));
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  } else {
    const uint2 v = __ldg(static_cast<const uint2*>(address));
    out[0] = v.x, out[1] = v.y;
  }
}

}  // namespace conv_detail

// A strip's index as digits, least significant first: its chunk along w,
// its chunk of rows, its output depth and its image.
struct ConvStripDigits {
  int32_t w_chunk, row_chunk, od;
  int64_t n;
};

// `strip` as digits for `w_chunks` chunks along w and `row_chunks` of rows
// over `depth` output planes.
__host__ __device__ inline ConvStripDigits conv_strip_digits(int64_t strip, int32_t w_chunks,
                                                             int32_t row_chunks, int32_t depth) {
  ConvStripDigits d;
  d.w_chunk = int32_t(strip % w_chunks);
  strip /= w_chunks;
  d.row_chunk = int32_t(strip % row_chunks);
  strip /= row_chunks;
  d.od = int32_t(strip % depth);
  d.n = strip / depth;
  return d;
}

struct ConvVectorWeightParams {
  ConvFwdParams conv;       // y is dy; w is dw, stored where stores_dw
  float* accum;             // dw's fp32 sums, [group][k][tap][c], added into, or null
  int32_t vectors_per_cta;  // vectors of channels a CTA covers (a power of two)
  int32_t column_blocks;    // blocks of kCols filter columns a row
  int32_t tasks_per_cta;    // (filter row, column block) pairs a CTA sums
  int32_t warps_per_task;
  // A task's threads over a strip: w_slots runs along w by h_slots rows.
  int32_t w_slots, h_slots;
  int32_t w_chunks;        // strips along w
  int32_t rows_per_strip;  // output rows a strip covers
  // 1: the grid's x CTAs (a cluster, or one CTA) hold every strip of their
  // block and store its dw (ConvVectorWeightLayout::stores_dw).
  int32_t stores_dw;
  // The grid's x extent as strip digits: a CTA's strips advance by it.
  ConvStripDigits strip_step;
};

// kStrideW: the stride along w (1 or 2); kCols: filter columns a task sums
// (conv_vector_weight_cols: 3, 1 for eight-channel groups, or a whole row of
// up to 7 for one-channel groups); kGroupChannels: G, each group's input and
// output channels; kRun: output positions along w a thread sums per row
// (conv_vector_weight_run, or one fewer: conv_vector_weight_layout).
template <class Element, int kStrideW, int kCols, int kGroupChannels, int kRun>
__global__ void __launch_bounds__(conv_vector_weight_warps(kGroupChannels) * 32, 1)
    conv_bwd_weight_vector_kernel(ConvVectorWeightParams const __grid_constant__ dp) {
  using namespace conv_detail;
  static_assert(sizeof(Element) == 2, "fp16 or bf16");
  constexpr int kG = kGroupChannels;
  static_assert(kG == 1 || kG == 2 || kG == 4 || kG == 8, "groups of 1, 2, 4 or 8 channels");
  constexpr int kSpan = (kRun - 1) * kStrideW + kCols;
  constexpr int kVec = conv_vector_weight_channels(kG, kCols);
  constexpr int kWords = kVec / 2;
  // Channels widened together: a word (two one-channel groups, or one group
  // of two) or a four-channel group, so that each product's operands are in.
  constexpr int kUnit = kG > 2 ? kG : 2;
  constexpr int kUnitGroups = kUnit / kG;
  constexpr int kSums = kVec * kG;  // a column's sums: (group, k, c) of the vector
  ConvFwdParams const& p = dp.conv;
  extern __shared__ __align__(16) char smem[];
  float* sums = reinterpret_cast<float*>(smem);  // [warp][column][sum of the CTA]

  const int32_t cta_sums = dp.vectors_per_cta * kSums;
  const int32_t parts = dp.vectors_per_cta;  // threads a run
  const int32_t task_threads = dp.warps_per_task * 32;
  const int32_t local_task = threadIdx.x / task_threads;
  const int32_t lane = threadIdx.x - local_task * task_threads;
  const int32_t part = lane % parts;
  const int32_t slot = lane / parts;
  const int32_t w_slot = slot % dp.w_slots;
  const int32_t h_slot = slot / dp.w_slots;
  const int64_t cta_channel0 = int64_t(blockIdx.y) * dp.vectors_per_cta * kVec;
  const int64_t channel0 = cta_channel0 + part * kVec;
  const int32_t task = blockIdx.z * dp.tasks_per_cta + local_task;
  const int32_t filter_row = task / dp.column_blocks;
  const int32_t col0 = (task - filter_row * dp.column_blocks) * kCols;
  const int32_t fy = filter_row % p.filter[1];
  const int32_t fz = filter_row / p.filter[1];
  const int32_t tasks = p.filter[0] * p.filter[1] * dp.column_blocks;
  // Threads past the task count or the strip's slots sum nothing.
  const bool active = task < tasks && h_slot < dp.h_slots;
  const int32_t cols = active ? min(kCols, p.filter[2] - col0) : 0;

  float acc[kCols][kSums];
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
#pragma unroll
    for (int s = 0; s < kSums; ++s) acc[c][s] = 0.f;
  }

  const int32_t runs_w = (p.output[2] + kRun - 1) / kRun;
  const int32_t row_chunks = (p.output[1] + dp.rows_per_strip - 1) / dp.rows_per_strip;
  const int64_t strips = int64_t(p.batch) * p.output[0] * row_chunks * dp.w_chunks;
  const int32_t span = (kRun - 1) * kStrideW + cols;
  const int32_t dh = fy * p.dilation[1] - p.padding[1];
  const int32_t dd = fz * p.dilation[0] - p.padding[0];
  const Element* x = static_cast<const Element*>(p.x) + channel0;
  const Element* dy = static_cast<const Element*>(p.y) + channel0;
  // Offsets within a row in 32 bits (the launch checks a row's extent fits):
  // a load's address is then one multiply-add from the row's pointer.
  const int32_t x_step = int32_t(p.x_stride[3]);
  const int32_t dy_step = int32_t(p.y_stride[3]);
  // Strips advance by gridDim.x, whose digits the launch gives, so a CTA's
  // strip is decoded once and then added to with carries: three divisions a
  // strip were 14% of the kernel's instructions where a thread walks one row
  // a strip (MobileNet's batch-32 layers, NOTES 129). A digit plus the step's
  // and a carry stays below twice its radix.
  ConvStripDigits at = conv_strip_digits(blockIdx.x, dp.w_chunks, row_chunks, p.output[0]);
  auto advance = [&] {
    ConvStripDigits const& step = dp.strip_step;
    at.w_chunk += step.w_chunk;
    int32_t carry = at.w_chunk >= dp.w_chunks;
    if (carry) at.w_chunk -= dp.w_chunks;
    at.row_chunk += step.row_chunk + carry;
    carry = at.row_chunk >= row_chunks;
    if (carry) at.row_chunk -= row_chunks;
    at.od += step.od + carry;
    carry = at.od >= p.output[0];
    if (carry) at.od -= p.output[0];
    at.n += step.n + carry;
  };
  for (int64_t strip = blockIdx.x; active && strip < strips; strip += gridDim.x, advance()) {
    const int32_t w_chunk = at.w_chunk, row_chunk = at.row_chunk, od = at.od;
    const int64_t n = at.n;
    const int32_t run_w = w_chunk * dp.w_slots + w_slot;
    if (run_w >= runs_w) continue;
    const int32_t ow0 = run_w * kRun;
    const int32_t id = od * p.stride[0] + dd;
    if (uint32_t(id) >= uint32_t(p.input[0])) continue;
    const int32_t iw0 = ow0 * kStrideW - p.padding[2] + col0;
    const Element* dy_strip =
        dy + n * p.y_stride[0] + od * p.y_stride[1] + int64_t(ow0) * p.y_stride[3];
    const Element* x_strip =
        x + n * p.x_stride[0] + id * p.x_stride[1] + int64_t(iw0) * p.x_stride[3];
    const int32_t oh_end = min(p.output[1], (row_chunk + 1) * dp.rows_per_strip);
#pragma unroll 1
    for (int32_t oh = row_chunk * dp.rows_per_strip + h_slot; oh < oh_end; oh += dp.h_slots) {
      const int32_t ih = oh * p.stride[1] + dh;
      // This filter row reads outside the input for every position of the run.
      if (uint32_t(ih) >= uint32_t(p.input[1])) continue;
      const Element* dy_run = dy_strip + oh * p.y_stride[2];
      // Each load's address one add from the last one's.
      uint32_t grads[kRun][kWords];
#pragma unroll
      for (int j = 0; j < kRun; ++j) {
#pragma unroll
        for (int i = 0; i < kWords; ++i) grads[j][i] = 0;
        if (ow0 + j < p.output[2]) load_words(dy_run, grads[j]);
        dy_run += dy_step;
      }
      const Element* x_at = x_strip + ih * p.x_stride[2];
      uint32_t window[kSpan][kWords];
#pragma unroll
      for (int s = 0; s < kSpan; ++s) {
        const int32_t iw = iw0 + s;
#pragma unroll
        for (int i = 0; i < kWords; ++i) window[s][i] = 0;
        if (s < span && uint32_t(iw) < uint32_t(p.input[2])) load_words(x_at, window[s]);
        x_at += x_step;
      }
#pragma unroll
      for (int u = 0; u < kVec / kUnit; ++u) {
        float g[kRun][kUnit], in[kSpan][kUnit];
#pragma unroll
        for (int h = 0; h < kUnit / 2; ++h) {
#pragma unroll
          for (int j = 0; j < kRun; ++j) {
            const float2 f = widen_pair<Element>(grads[j][u * kUnit / 2 + h]);
            g[j][2 * h] = f.x, g[j][2 * h + 1] = f.y;
          }
#pragma unroll
          for (int s = 0; s < kSpan; ++s) {
            const float2 f = widen_pair<Element>(window[s][u * kUnit / 2 + h]);
            in[s][2 * h] = f.x, in[s][2 * h + 1] = f.y;
          }
        }
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
#pragma unroll
          for (int j = 0; j < kRun; ++j) {
#pragma unroll
            for (int q = 0; q < kUnitGroups; ++q) {
#pragma unroll
              for (int k = 0; k < kG; ++k) {
#pragma unroll
                for (int ci = 0; ci < kG; ++ci) {
                  float& sum = acc[c][((u * kUnitGroups + q) * kG + k) * kG + ci];
                  sum = fmaf(in[j * kStrideW + c][q * kG + ci], g[j][q * kG + k], sum);
                }
              }
            }
          }
        }
      }
    }
  }

  // A warp's lanes of one part (the same vector) add their sums by shuffles;
  // the warp's first run of parts writes them to its own slots (a
  // shared-memory float atomic is a compare-and-swap loop, and 16 lanes on
  // one word spun it for tens of microseconds on batch-1 layers). Then each
  // of the CTA's (task, column, sum) sums adds its task's warps and goes into
  // the workspace with one atomic add.
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
#pragma unroll
    for (int s = 0; s < kSums; ++s) {
      for (int offset = 16; offset >= parts; offset /= 2) {
        acc[c][s] += __shfl_xor_sync(0xffffffffu, acc[c][s], offset);
      }
    }
  }
  const int32_t warp = threadIdx.x / 32;
  const int32_t per_warp = kCols * cta_sums;
  if (threadIdx.x % 32 < parts) {
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
#pragma unroll
      for (int s = 0; s < kSums; ++s) {
        sums[warp * per_warp + c * cta_sums + part * kSums + s] = acc[c][s];
      }
    }
  }
  __syncthreads();
  const int64_t taps = int64_t(p.filter[0]) * p.filter[1] * p.filter[2];
  const int64_t cta_group0 = cta_channel0 / kG;
  const int32_t cta_totals = dp.tasks_per_cta * per_warp;
  // Where dw's element (task t, column c, sum s of the CTA) lies, or -1 past
  // the filter; the same in dw and in the workspace.
  auto dw_index = [&](int32_t t, int32_t c, int32_t s) -> int64_t {
    const int32_t sum_task = blockIdx.z * dp.tasks_per_cta + t;
    if (sum_task >= tasks) return -1;
    const int32_t row = sum_task / dp.column_blocks;
    const int32_t col = (sum_task - row * dp.column_blocks) * kCols + c;
    if (col >= p.filter[2]) return -1;
    // s enumerates (group of the CTA, k, c); the CTA's groups are consecutive.
    const int32_t ci = s % kG, k = s / kG % kG;
    const int64_t group = cta_group0 + s / (kG * kG);
    const int64_t tap = int64_t(row) * p.filter[2] + col;
    return ((group * kG + k) * taps + tap) * kG + ci;
  };
  auto task_total = [&](int32_t i) {
    const int32_t t = i / per_warp, c = (i - t * per_warp) / cta_sums;
    const int32_t s = i - t * per_warp - c * cta_sums;
    float sum = 0.f;
    for (int32_t w = 0; w < dp.warps_per_task; ++w) {
      sum += sums[(t * dp.warps_per_task + w) * per_warp + c * cta_sums + s];
    }
    return sum;
  };
  auto element_of = [&](int32_t i) {
    const int32_t t = i / per_warp, c = (i - t * per_warp) / cta_sums;
    return dw_index(t, c, i - t * per_warp - c * cta_sums);
  };
  Element* dw = static_cast<Element*>(const_cast<void*>(p.w));  // dw here
  if (!dp.stores_dw) {
    for (int32_t i = threadIdx.x; i < cta_totals; i += blockDim.x) {
      const int64_t at = element_of(i);
      if (at >= 0) atomicAdd(dp.accum + at, task_total(i));
    }
  } else if (gridDim.x == 1) {
    for (int32_t i = threadIdx.x; i < cta_totals; i += blockDim.x) {
      const int64_t at = element_of(i);
      if (at >= 0) dw[at] = Element(task_total(i));
    }
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Each CTA writes its totals past the warps' slots; once the cluster
    // has, CTA r adds every CTA's totals for the elements i = r, r + n, ...
    // of blockDim-wide chunks and stores them. The last barrier keeps each
    // CTA's shared memory alive until the others have read it.
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    float* totals = sums + blockDim.x / 32 * per_warp;
    for (int32_t i = threadIdx.x; i < cta_totals; i += blockDim.x) totals[i] = task_total(i);
    cluster.sync();
    const int32_t ranks = int32_t(cluster.num_blocks());
    const int32_t rank = int32_t(cluster.block_rank());
    for (int32_t i = rank * blockDim.x + threadIdx.x; i < cta_totals;
         i += ranks * blockDim.x) {
      const int64_t at = element_of(i);
      if (at < 0) continue;
      float sum = 0.f;
      for (int32_t r = 0; r < ranks; ++r) sum += cluster.map_shared_rank(totals, r)[i];
      dw[at] = Element(sum);
    }
    cluster.sync();
#else
    __trap();  // the launcher forms clusters on sm_90 only
#endif
  }
}

}  // namespace ckfmha::kernel
