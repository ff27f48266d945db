// The backward-data plan's filter rearrangement (conv_aux_kernels.hpp): for
// each stride phase, w[g][k][taps][c] -> dst[g][c][phase taps][k], every
// phase of a plan in one launch.
//
// Where a group has few channels the copy is elementwise, one thread per
// output element. Where it has at least a tile's worth of both, each (group,
// tap) is a K x C transpose: read row by row along c and written row by row
// along k through a shared-memory tile, so that both sides move whole
// sectors. Elementwise, a warp's reads there stride by taps x C elements and
// each touches a sector of its own (a 512-channel 3x3 filter took 30 us).
#include "ckfmha/runtime/conv_aux_kernels.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace ckfmha::runtime {

namespace {

constexpr int kThreads = 256;
constexpr int kTile = 32;  // k and c per transposed tile
constexpr int kTileRows = kThreads / kTile;

struct PhaseBatch {
  ConvPhaseFilter phase[kConvPhaseFiltersPerLaunch];
  int64_t first[kConvPhaseFiltersPerLaunch + 1];  // each phase's first work item
  int32_t count;
};

__device__ int64_t phase_taps(ConvPhaseFilter const& f) {
  return int64_t(f.taps[0]) * f.taps[1] * f.taps[2];
}

__device__ int64_t filter_taps(ConvPhaseFilter const& f) {
  return int64_t(f.filter[0]) * f.filter[1] * f.filter[2];
}

// The filter index (row-major over its dims) of the phase's tap `tap`.
__device__ int64_t filter_index(ConvPhaseFilter const& f, int64_t tap) {
  int64_t index = 0;
  int64_t radix = 1;
  for (int d = 2; d >= 0; --d) {
    const int64_t t = tap % f.taps[d];
    tap /= f.taps[d];
    index += (f.first[d] - f.step[d] * t) * radix;
    radix *= f.filter[d];
  }
  return index;
}

// The phase that work item `item` belongs to, and the item's index in it.
__device__ int find_phase(PhaseBatch const& batch, int64_t* item) {
  int p = 0;
  while (p + 1 < batch.count && *item >= batch.first[p + 1]) ++p;
  *item -= batch.first[p];
  return p;
}

// Elements are copied as raw 2-byte values: the rearrangement is the same
// for fp16 and bf16.
__global__ void elementwise_kernel(PhaseBatch const __grid_constant__ batch) {
  const int64_t total = batch.first[batch.count];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t rest = i;
    ConvPhaseFilter const& f = batch.phase[find_phase(batch, &rest)];
    const int64_t taps = phase_taps(f);
    const int64_t k = rest % f.out_channels;
    rest /= f.out_channels;
    const int64_t tap = rest % taps;
    rest /= taps;
    const int64_t c = rest % f.in_channels;
    const int64_t g = rest / f.in_channels;
    const auto* src = static_cast<const uint16_t*>(f.w);
    auto* dst = static_cast<uint16_t*>(f.dst);
    const int64_t source =
        ((g * f.out_channels + k) * filter_taps(f) + filter_index(f, tap)) * f.in_channels + c;
    dst[((g * f.in_channels + c) * taps + tap) * f.out_channels + k] = src[source];
  }
}

__device__ int64_t tiles_along(int32_t channels) { return (channels + kTile - 1) / kTile; }

__global__ void __launch_bounds__(kThreads) transpose_kernel(
    PhaseBatch const __grid_constant__ batch) {
  // One column of padding keeps a warp's column reads off a single bank.
  __shared__ uint16_t tile[kTile][kTile + 1];
  const int lane = threadIdx.x % kTile;
  const int row = threadIdx.x / kTile;
  const int64_t total = batch.first[batch.count];
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
    int64_t rest = t;
    ConvPhaseFilter const& f = batch.phase[find_phase(batch, &rest)];
    const int64_t taps = phase_taps(f);
    const int64_t k0 = (rest % tiles_along(f.out_channels)) * kTile;
    rest /= tiles_along(f.out_channels);
    const int64_t c0 = (rest % tiles_along(f.in_channels)) * kTile;
    rest /= tiles_along(f.in_channels);
    const int64_t tap = rest % taps;
    const int64_t g = rest / taps;
    const auto* src = static_cast<const uint16_t*>(f.w);
    auto* dst = static_cast<uint16_t*>(f.dst);
    // Source row k of this (group, tap): its C channels are contiguous.
    const int64_t src_row = filter_taps(f) * f.in_channels;
    const int64_t src_base = (g * f.out_channels * filter_taps(f) + filter_index(f, tap)) *
                             f.in_channels;
    for (int r = row; r < kTile; r += kTileRows) {
      const int64_t k = k0 + r;
      const int64_t c = c0 + lane;
      if (k < f.out_channels && c < f.in_channels) tile[r][lane] = src[src_base + k * src_row + c];
    }
    __syncthreads();
    // Destination row c of this (group, tap): its K channels are contiguous.
    const int64_t dst_row = taps * f.out_channels;
    const int64_t dst_base = g * f.in_channels * dst_row + tap * f.out_channels;
    for (int r = row; r < kTile; r += kTileRows) {
      const int64_t c = c0 + r;
      const int64_t k = k0 + lane;
      if (k < f.out_channels && c < f.in_channels) dst[dst_base + c * dst_row + k] = tile[lane][r];
    }
    // The tile is refilled by the next iteration.
    __syncthreads();
  }
}

unsigned blocks_for(int64_t threads) {
  return unsigned(std::clamp<int64_t>((threads + kThreads - 1) / kThreads, 1, 65535 * 8));
}

int launch_batch(PhaseBatch const& batch, bool transpose, ckfmha_stream_t stream) {
  const int64_t items = batch.first[batch.count];
  if (items == 0) return 0;
  if (transpose) {
    transpose_kernel<<<unsigned(std::min<int64_t>(items, 65535 * 8)), kThreads, 0,
                       cudaStream_t(stream)>>>(batch);
  } else {
    elementwise_kernel<<<blocks_for(items), kThreads, 0, cudaStream_t(stream)>>>(batch);
  }
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? 0 : -int(err);
}

}  // namespace

int launch_conv_phase_filters(ConvPhaseFilter const* filters, int count, ckfmha_stream_t stream) {
  if (count <= 0) return 0;
  // Every phase of a plan has the same channels, so one choice serves all.
  const bool transpose =
      filters[0].in_channels >= kTile && filters[0].out_channels >= kTile;
  for (int begin = 0; begin < count; begin += kConvPhaseFiltersPerLaunch) {
    PhaseBatch batch{};
    batch.count = std::min(count - begin, kConvPhaseFiltersPerLaunch);
    for (int p = 0; p < batch.count; ++p) {
      ConvPhaseFilter const& f = filters[begin + p];
      batch.phase[p] = f;
      const int64_t taps = int64_t(f.taps[0]) * f.taps[1] * f.taps[2];
      const int64_t items =
          transpose ? int64_t(f.groups) * taps * ((f.in_channels + kTile - 1) / kTile) *
                          ((f.out_channels + kTile - 1) / kTile)
                    : int64_t(f.groups) * taps * f.in_channels * f.out_channels;
      batch.first[p + 1] = batch.first[p] + items;
    }
    if (int r = launch_batch(batch, transpose, stream)) return r;
  }
  return 0;
}

}  // namespace ckfmha::runtime
