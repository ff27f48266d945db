// The backward-data plan's filter rearrangement (conv_aux_kernels.hpp): for
// each stride phase, w[g][k][taps][c] -> dst[g][c][phase taps][k] (packed
// groups on a block diagonal), every phase of a plan in one launch.
//
// Where a group has at least 32 channels in and out (unpacked), each (group,
// tap) is a K x C transpose through a shared-memory tile, read row by row
// along c and written row by row along k, so that both sides move whole
// sectors. Otherwise (few channels, or packed groups) a CTA stages a block of
// one group's filter, several taps, and writes its rows. A thread per output
// element instead reads with a stride of taps x C elements, each read a
// sector of its own. Coordinates are found once a tile or block, in 32 bits:
// divisions for every element cost more than the copy.
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

// Groups whose channels do not fill a transposed tile (few channels in or
// out, or packed groups): a CTA stages a block of one group's filter in
// shared memory, chunk_taps taps x chunk_k output x chunk_c input channels,
// read along c, then writes its dst rows along k. Each (c, tap) row of dst
// is pack x K long: the block's own K columns (of its member of the pack)
// come from the tile, and the CTA of the first k-chunk also writes the
// pack's other members' columns, zeros. A thread per output element had
// read each source element from a sector of its own: ResNeXt's groups of 32,
// packed in twos, took 11 us there before a 13-us convolution (ncu, NOTES
// 129).
constexpr int kBlockElements = 8192;  // 2-byte elements of the staged block
constexpr int kMostChunkTaps = 64;

struct BlockLaunch {
  PhaseBatch batch;
  int32_t chunk_taps, chunk_c, chunk_k;  // the block's extents
  int32_t tap_chunks, c_chunks;          // blockIdx.x = (k chunk, c chunk, tap chunk)
};

// Rows of the staged block an odd number of 2-byte elements long, so that a
// warp reading 32 consecutive k of one c spreads over the banks (rows of 32
// elements would put them all in two).
__host__ __device__ constexpr int32_t block_pitch(int32_t chunk_c) { return chunk_c | 1; }

// Grid: x = the (k, c, tap) chunks, y = groups over grid-stride steps, z =
// the phase.
__global__ void __launch_bounds__(kThreads) block_kernel(BlockLaunch const __grid_constant__ b) {
  __shared__ uint16_t tile[kBlockElements];  // [tap][k][c], rows block_pitch long
  __shared__ int32_t source_tap[kMostChunkTaps];
  ConvPhaseFilter const& f = b.batch.phase[blockIdx.z];
  const int32_t taps = phase_taps(f);
  const int32_t tap_chunk = int32_t(blockIdx.x) % b.tap_chunks;
  const int32_t c_chunk = int32_t(blockIdx.x) / b.tap_chunks % b.c_chunks;
  const int32_t k_chunk = int32_t(blockIdx.x) / b.tap_chunks / b.c_chunks;
  const int32_t t0 = tap_chunk * b.chunk_taps, c0 = c_chunk * b.chunk_c;
  const int32_t k0 = k_chunk * b.chunk_k;
  // This block's extents (the last chunks may be short, a phase's taps fewer).
  const int32_t n_taps = min(b.chunk_taps, taps - t0);
  const int32_t n_c = min(b.chunk_c, f.in_channels - c0);
  const int32_t n_k = min(b.chunk_k, f.out_channels - k0);
  if (n_taps <= 0) return;  // a phase of fewer taps than the launch's most
  const int32_t pitch = block_pitch(b.chunk_c);
  const int32_t K = f.out_channels, C = f.in_channels;
  const int32_t row = f.pack * K;  // dst elements of a (c, tap)
  // Columns a dst row of this CTA gets: its block's, and on the first k
  // chunk the other members' zeros.
  const int32_t zeros = k_chunk == 0 ? (f.pack - 1) * K : 0;
  const int32_t columns = n_k + zeros;
  const int64_t filter_taps_ = filter_taps(f);
  const auto* src = static_cast<const uint16_t*>(f.w);
  auto* dst = static_cast<uint16_t*>(f.dst);
  if (int(threadIdx.x) < n_taps) source_tap[threadIdx.x] = filter_index(f, t0 + threadIdx.x);
  __syncthreads();
  const int32_t loads = n_taps * n_k * n_c;
  const int32_t stores = n_c * n_taps * columns;
  for (int64_t g = blockIdx.y; g < f.groups; g += gridDim.y) {  // w's groups
    const int32_t member = int32_t(g % f.pack);
    for (int32_t i = threadIdx.x; i < loads; i += kThreads) {
      const int32_t c = i % n_c, rest = i / n_c;
      const int32_t k = rest % n_k, t = rest / n_k;
      const int64_t from = ((g * K + k0 + k) * filter_taps_ + source_tap[t]) * C + c0 + c;
      tile[(t * b.chunk_k + k) * pitch + c] = src[from];
    }
    __syncthreads();
    // dst[((g * C + c) * taps + t) * row + column]: g * C is the packed
    // group's first row of this member.
    for (int32_t i = threadIdx.x; i < stores; i += kThreads) {
      const int32_t j = i % columns, rest = i / columns;
      const int32_t t = rest % n_taps, c = rest / n_taps;
      int32_t column;
      uint16_t value = 0;
      if (j < n_k) {
        column = member * K + k0 + j;
        value = tile[(t * b.chunk_k + j) * pitch + c];
      } else {
        const int32_t z = j - n_k;  // the z-th column outside this member's K
        column = z < member * K ? z : z + K;
      }
      dst[((g * C + c0 + c) * taps + t0 + t) * row + column] = value;
    }
    // The tile is refilled for the next group.
    __syncthreads();
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
    BlockLaunch b{};
    b.batch = batch;
    // Chunks: all of a group's input channels where they fit a row of 64,
    // then as many output channels as the block holds, then taps until a
    // CTA writes about 4096 elements (a few per thread).
    b.chunk_c = std::min(f.in_channels, kTile);
    b.chunk_k = std::min(f.out_channels, kBlockElements / block_pitch(b.chunk_c));
    const int64_t row_elements = int64_t(b.chunk_c) * f.pack * f.out_channels;
    const int64_t fit = kBlockElements / (int64_t(b.chunk_k) * block_pitch(b.chunk_c));
    b.chunk_taps = int32_t(std::clamp<int64_t>(
        std::min<int64_t>(4096 / std::max<int64_t>(row_elements, 1), fit), 1,
        std::min<int64_t>(most_taps, kMostChunkTaps)));
    b.tap_chunks = int32_t((most_taps + b.chunk_taps - 1) / b.chunk_taps);
    b.c_chunks = (f.in_channels + b.chunk_c - 1) / b.chunk_c;
    const int64_t k_chunks = (f.out_channels + b.chunk_k - 1) / b.chunk_k;
    const int64_t chunks = int64_t(b.tap_chunks) * b.c_chunks * k_chunks;
    if (chunks > 0x7fffffff) return -int(cudaErrorInvalidConfiguration);
    const dim3 grid(unsigned(chunks), unsigned(std::min<int64_t>(f.groups, 65535)),
                    unsigned(count));
    block_kernel<<<grid, kThreads, 0, s>>>(b);
  }
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? 0 : -int(err);
}

}  // namespace

int launch_conv_phase_filters(ConvPhaseFilter const* filters, int count, ckfmha_stream_t stream) {
  if (count <= 0) return 0;
  // Every phase of a plan has the same channels, so one choice serves all.
  // Tiles at least half used: at least 32 channels in and out. Packed groups
  // take the block kernel (their zeros are part of the output).
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
