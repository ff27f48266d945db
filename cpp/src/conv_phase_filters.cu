// The backward-data plan's filter rearrangement (conv_aux_kernels.hpp): for
// each stride phase, w[g][k][taps][c] -> dst[g][c][phase taps][k] (packed
// groups on a block diagonal), every phase of a plan in one launch.
//
// Where a group has few channels the copy is elementwise, one thread per
// output element. Where it has at least 32 channels in and out, each
// (group, tap) is a K x C transpose: read row by row along c and written row
// by row along k through a shared-memory tile, so that both sides move whole
// sectors. Elementwise, a warp's reads there stride by taps x C elements and
// each touches a sector of its own. Coordinates are found once a tile, or
// in 32 bits where the count allows: 64-bit divisions for every element cost
// more than the copy.
#include "ckfmha/runtime/conv_aux_kernels.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace ckfmha::runtime {

namespace {

constexpr int kThreads = 256;
constexpr int kTile = 64;  // k and c per transposed tile
constexpr int kTileRows = kThreads / kTile;

// A launch's phases; blockIdx.z picks one. They share groups and channels.
struct PhaseBatch {
  ConvPhaseFilter phase[kConvPhaseFiltersPerLaunch];
};

__device__ int32_t phase_taps(ConvPhaseFilter const& f) {
  return f.taps[0] * f.taps[1] * f.taps[2];
}

__device__ int32_t filter_taps(ConvPhaseFilter const& f) {
  return f.filter[0] * f.filter[1] * f.filter[2];
}

// The filter index (row-major over its dims) of the phase's tap `tap`.
__device__ int32_t filter_index(ConvPhaseFilter const& f, int32_t tap) {
  int32_t index = 0;
  int32_t radix = 1;
  for (int d = 2; d >= 0; --d) {
    const int32_t t = tap % f.taps[d];
    tap /= f.taps[d];
    index += (f.first[d] - f.step[d] * t) * radix;
    radix *= f.filter[d];
  }
  return index;
}

// One thread per output element, over grid-stride steps. Index: the type
// the element's coordinates are found in (32-bit where the count allows;
// 64-bit division costs tens of instructions). Elements are copied as raw
// 2-byte values: the rearrangement is the same for fp16 and bf16. Packed
// groups (f.pack > 1) write their block-diagonal filter, zeros off the
// diagonal.
template <class Index>
__global__ void elementwise_kernel(PhaseBatch const __grid_constant__ batch) {
  ConvPhaseFilter const& f = batch.phase[blockIdx.z];
  const Index taps = phase_taps(f);
  const Index pack = f.pack;
  const Index in_channels = f.in_channels, out_channels = f.out_channels;
  const Index row = pack * out_channels, rows = pack * in_channels;  // a packed group's
  const Index count = Index(f.groups / f.pack) * rows * taps * row;
  const auto* src = static_cast<const uint16_t*>(f.w);
  auto* dst = static_cast<uint16_t*>(f.dst);
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < count;
       i += Index(gridDim.x) * blockDim.x) {
    Index rest = i / row;
    const Index packed_k = i - rest * row;
    Index next = rest / taps;
    const Index tap = rest - next * taps;
    rest = next / rows;
    const Index packed_c = next - rest * rows;
    const Index member = packed_c / in_channels;  // the group of the pack this row is
    if (packed_k / out_channels != member) {       // another group's column: off the diagonal
      dst[i] = 0;
      continue;
    }
    const Index k = packed_k - member * out_channels;
    const int64_t g = int64_t(rest) * f.pack + member;
    const int64_t source =
        ((g * f.out_channels + k) * filter_taps(f) + filter_index(f, int32_t(tap))) *
            f.in_channels + packed_c - member * in_channels;
    dst[i] = src[source];
  }
}

// Grid: x = a (group, tap)'s tiles, y = (group, tap) pairs over grid-stride
// steps, z = the phase. A thread moves kTile x kTile / kThreads elements a
// tile, its addresses one add apart: the per-tile setup (the pair's
// coordinates, the filter index) is then a small part of its work (32 x 32
// tiles of 4 elements a thread issued 106 instructions an element).
__global__ void __launch_bounds__(kThreads) transpose_kernel(
    PhaseBatch const __grid_constant__ batch) {
  // Rows two elements longer than the tile: a warp reading a column meets
  // 32 different banks (rows an odd number of words apart).
  __shared__ uint16_t tile[kTile][kTile + 2];
  ConvPhaseFilter const& f = batch.phase[blockIdx.z];
  const int lane = threadIdx.x % kTile;
  const int row = threadIdx.x / kTile;
  const int32_t tiles_k = (f.out_channels + kTile - 1) / kTile;
  const int32_t k0 = int32_t(blockIdx.x % tiles_k) * kTile;
  const int32_t c0 = int32_t(blockIdx.x / tiles_k) * kTile;
  const int32_t taps = phase_taps(f);
  const int64_t pairs = int64_t(f.groups) * taps;
  const auto* src = static_cast<const uint16_t*>(f.w);
  auto* dst = static_cast<uint16_t*>(f.dst);
  // Source row k of a (group, tap): its C channels are contiguous.
  const int64_t src_row = int64_t(filter_taps(f)) * f.in_channels;
  // Destination row c: its K channels are contiguous.
  const int64_t dst_row = int64_t(taps) * f.out_channels;
  // The rows this thread loads (k) and stores (c) that exist: it walks
  // every kTileRows-th from `row`.
  const int32_t load_rows = min(kTile, f.out_channels - k0);
  const int32_t store_rows = min(kTile, f.in_channels - c0);
  const bool load_lane = c0 + lane < f.in_channels;
  const bool store_lane = k0 + lane < f.out_channels;
  for (int64_t pair = blockIdx.y; pair < pairs; pair += gridDim.y) {
    const int64_t g = pair / taps;
    const int32_t tap = int32_t(pair - g * taps);
    if (load_lane) {
      const uint16_t* from =
          src + (g * f.out_channels * filter_taps(f) + filter_index(f, tap)) * f.in_channels +
          (k0 + row) * src_row + c0 + lane;
      for (int r = row; r < load_rows; r += kTileRows, from += kTileRows * src_row) {
        tile[r][lane] = *from;
      }
    }
    __syncthreads();
    if (store_lane) {
      uint16_t* to = dst + g * f.in_channels * dst_row + int64_t(tap) * f.out_channels +
                     (c0 + row) * dst_row + k0 + lane;
      for (int r = row; r < store_rows; r += kTileRows, to += kTileRows * dst_row) {
        *to = tile[lane][r];
      }
    }
    // The tile is refilled by the next step.
    __syncthreads();
  }
}

int64_t taps_of(ConvPhaseFilter const& f) { return int64_t(f.taps[0]) * f.taps[1] * f.taps[2]; }

int launch_batch(PhaseBatch const& batch, int count, bool transpose, ckfmha_stream_t stream) {
  ConvPhaseFilter const& f = batch.phase[0];
  int64_t most_taps = 0;
  for (int p = 0; p < count; ++p) most_taps = std::max(most_taps, taps_of(batch.phase[p]));
  if (most_taps == 0 || f.groups == 0 || f.in_channels == 0 || f.out_channels == 0) return 0;
  const auto s = cudaStream_t(stream);
  if (transpose) {
    const int64_t tiles = int64_t((f.out_channels + kTile - 1) / kTile) *
                          ((f.in_channels + kTile - 1) / kTile);
    if (tiles > 0x7fffffff) return -int(cudaErrorInvalidConfiguration);
    const dim3 grid(unsigned(tiles), unsigned(std::min<int64_t>(f.groups * most_taps, 65535)),
                    unsigned(count));
    transpose_kernel<<<grid, kThreads, 0, s>>>(batch);
  } else {
    const int64_t most =
        int64_t(f.groups) * f.pack * f.in_channels * f.out_channels * most_taps;
    const dim3 grid(
        unsigned(std::clamp<int64_t>((most + kThreads - 1) / kThreads, 1, 65535 * 8)), 1,
        unsigned(count));
    if (most < (int64_t(1) << 31)) {
      elementwise_kernel<uint32_t><<<grid, kThreads, 0, s>>>(batch);
    } else {
      elementwise_kernel<int64_t><<<grid, kThreads, 0, s>>>(batch);
    }
  }
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? 0 : -int(err);
}

}  // namespace

int launch_conv_phase_filters(ConvPhaseFilter const* filters, int count, ckfmha_stream_t stream) {
  if (count <= 0) return 0;
  // Every phase of a plan has the same channels, so one choice serves all.
  // Tiles at least half used: at least 32 channels in and out. Packed groups
  // copy elementwise (their zeros are part of the output).
  const bool transpose = filters[0].pack == 1 && filters[0].in_channels >= kTile / 2 &&
                         filters[0].out_channels >= kTile / 2;
  for (int begin = 0; begin < count; begin += kConvPhaseFiltersPerLaunch) {
    PhaseBatch batch{};
    const int n = std::min(count - begin, kConvPhaseFiltersPerLaunch);
    for (int p = 0; p < n; ++p) batch.phase[p] = filters[begin + p];
    if (int r = launch_batch(batch, n, transpose, stream)) return r;
  }
  return 0;
}

}  // namespace ckfmha::runtime
