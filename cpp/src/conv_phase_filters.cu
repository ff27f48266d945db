// The backward-data plan's filter rearrangement (conv_aux_kernels.hpp): for
// each stride phase, w[g][k][taps][c] -> dst[g][c][phase taps][k] (packed
// groups on a block diagonal), every phase of a plan in one launch.
//
// Where a group has at least 32 channels in and out (unpacked), each (group,
// tap) is a K x C transpose through a shared-memory tile, read row by row
// along c and written row by row along k, so that both sides move whole
// sectors. Otherwise (few channels, or packed groups) a thread writes a
// 16-byte vector of a dst row where it can. Coordinates are found once a
// tile or vector, in 32 bits where the count allows: divisions for every
// element cost more than the copy.
#include "ckfmha/runtime/conv_aux_kernels.hpp"

#include <cuda_runtime.h>
#include <cutlass/fast_math.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace ckfmha::runtime {

namespace {

constexpr int kThreads = 256;
constexpr int kTile = 64;  // k and c per transposed tile
constexpr int kTileRows = kThreads / kTile;

// A phase's divisors as multiplications by their reciprocals (set on the
// host): a run-time division is a chain of some 20 dependent instructions,
// and a row-kernel thread writing one vector ran ten of them before its
// loads (NOTES 129). The taps' serve both kernels (a tap index is 32-bit),
// the rest the row kernel's 32-bit indices.
struct PhaseDivisors {
  cutlass::FastDivmod taps[3];   // the phase's taps per dim
  cutlass::FastDivmod row;       // vectors of a dst row
  cutlass::FastDivmod channels;  // C
  cutlass::FastDivmod pack;
  cutlass::FastDivmod out;       // K
};

// A launch's phases; blockIdx.z picks one. They share groups and channels.
struct PhaseBatch {
  ConvPhaseFilter phase[kConvPhaseFiltersPerLaunch];
  PhaseDivisors divisors[kConvPhaseFiltersPerLaunch];
};

// a = q * d + r: for 0 <= a < 2^31 by multiplication, else by division.
__device__ __forceinline__ void divide(uint32_t a, cutlass::FastDivmod const& d, uint32_t& q,
                                       uint32_t& r) {
  int quotient, remainder;
  d(quotient, remainder, int(a));
  q = uint32_t(quotient);
  r = uint32_t(remainder);
}

__device__ __forceinline__ void divide(int64_t a, cutlass::FastDivmod const& d, int64_t& q,
                                       int64_t& r) {
  q = a / d.divisor;
  r = a - q * d.divisor;
}

__device__ int32_t phase_taps(ConvPhaseFilter const& f) {
  return f.taps[0] * f.taps[1] * f.taps[2];
}

__device__ int32_t filter_taps(ConvPhaseFilter const& f) {
  return f.filter[0] * f.filter[1] * f.filter[2];
}

// The filter index (row-major over its dims) of the phase's tap `tap`.
__device__ int32_t filter_index(ConvPhaseFilter const& f, PhaseDivisors const& div, int32_t tap) {
  int32_t index = 0;
  int32_t radix = 1;
  for (int d = 2; d >= 0; --d) {
    int32_t rest, t;
    div.taps[d](rest, t, tap);
    tap = rest;
    index += (f.first[d] - f.step[d] * t) * radix;
    radix *= f.filter[d];
  }
  return index;
}

// Groups whose channels do not fill a transposed tile (few channels in or
// out, or packed groups): a thread writes kWidth consecutive elements of a
// dst row, 8 (16 bytes) where K is a multiple of 8 and dst is aligned to 16
// bytes, so that a vector lies in one member's block of the pack. Zeros off
// the diagonal are whole vectors; a diagonal vector's elements are kWidth
// loads issued together, one per output channel k, each from a sector of its
// own. One element a thread took about 240 instructions an element (the
// coordinates and the filter index for each), and ResNeXt's groups of 32,
// packed in twos, 11 us under ncu before a 13-us convolution (NOTES 129); a
// CTA staging a block of a group's filter in shared memory took as long on
// its 160 CTAs, each thread's loads waited on one after another.
//
// Grid: x = a tap's vectors over grid-stride steps, y = the phase's taps
// over grid-stride steps, z = the phase: a thread finds its tap's filter
// index once for all its vectors. Where a thread writes one vector
// (ResNeXt's last stage) that saved nothing: about 290 instructions a
// vector, at 0.7-0.8 a cycle, 5 us under ncu, most of them the filter
// index's six divisions and the coordinates' four (NOTES 129). With 32-bit
// indices (counts under 2^31) those are multiplications by the host's
// reciprocals (PhaseDivisors), wider ones keep the divisions: 4.6e5 against
// 6.8e5 instructions, 4 against 5 us under ncu, though the graphed layer
// did not move (NOTES 130).
template <int kWidth, class Index>
__global__ void __launch_bounds__(kThreads) row_kernel(PhaseBatch const __grid_constant__ batch) {
  using Vector = std::conditional_t<kWidth == 8, uint4, uint16_t>;
  ConvPhaseFilter const& f = batch.phase[blockIdx.z];
  PhaseDivisors const& div = batch.divisors[blockIdx.z];
  const int32_t taps = phase_taps(f);
  const Index K = Index(f.out_channels), C = Index(f.in_channels), pack = Index(f.pack);
  const Index row = pack * K / kWidth;  // vectors of a (c, tap) row of dst
  // Rows of dst: line = g * C + c over w's groups g, so that g * C is the
  // first row of member g % pack in its packed group.
  const Index count = Index(f.groups) * C * row;  // vectors of one tap
  const int64_t channel_step = int64_t(filter_taps(f)) * f.in_channels;  // k to k + 1 in w
  const auto* src = static_cast<const uint16_t*>(f.w);
  auto* dst = static_cast<Vector*>(f.dst);
  for (int32_t tap = blockIdx.y; tap < taps; tap += gridDim.y) {
    const int64_t source_tap = int64_t(filter_index(f, div, tap)) * f.in_channels;
    for (Index i = Index(blockIdx.x) * kThreads + threadIdx.x; i < count;
         i += Index(gridDim.x) * kThreads) {
      Index line, v, g, c, unused, member, owner;
      divide(i, div.row, line, v);  // v: the vector within its row
      const Index first = v * kWidth;  // its first packed k
      divide(line, div.channels, g, c);
      divide(g, div.pack, unused, member);
      divide(first, div.out, owner, unused);
      const int64_t at = (int64_t(line) * taps + tap) * row + v;
      if (owner != member) {  // another member's columns: off the diagonal
        dst[at] = Vector{};
        continue;
      }
      // w[g][k][source tap][c] for k = first - member * K.
      const int64_t source =
          (int64_t(g) * K + first - member * K) * channel_step + source_tap + c;
      uint16_t values[kWidth];
#pragma unroll
      for (int j = 0; j < kWidth; ++j) values[j] = src[source + j * channel_step];
      Vector vector;
      static_assert(sizeof(vector) == sizeof(values));
      memcpy(&vector, values, sizeof(vector));
      dst[at] = vector;
    }
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
  PhaseDivisors const& div = batch.divisors[blockIdx.z];
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
      const int64_t source_tap = g * f.out_channels * filter_taps(f) + filter_index(f, div, tap);
      const uint16_t* from =
          src + source_tap * f.in_channels + (k0 + row) * src_row + c0 + lane;
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

int launch_batch(PhaseBatch& batch, int count, bool transpose, ckfmha_stream_t stream) {
  ConvPhaseFilter const& f = batch.phase[0];
  int64_t most_taps = 0;
  for (int p = 0; p < count; ++p) most_taps = std::max(most_taps, taps_of(batch.phase[p]));
  if (most_taps == 0 || f.groups == 0 || f.in_channels == 0 || f.out_channels == 0) return 0;
  for (int p = 0; p < count; ++p) {
    for (int d = 0; d < 3; ++d) {
      batch.divisors[p].taps[d] = cutlass::FastDivmod(batch.phase[p].taps[d]);
    }
  }
  const auto s = cudaStream_t(stream);
  if (transpose) {
    const int64_t tiles = int64_t((f.out_channels + kTile - 1) / kTile) *
                          ((f.in_channels + kTile - 1) / kTile);
    if (tiles > 0x7fffffff) return -int(cudaErrorInvalidConfiguration);
    const dim3 grid(unsigned(tiles), unsigned(std::min<int64_t>(f.groups * most_taps, 65535)),
                    unsigned(count));
    transpose_kernel<<<grid, kThreads, 0, s>>>(batch);
  } else {
    bool wide = true;  // 16-byte vectors: every phase's K a multiple of 8, dst aligned
    for (int p = 0; p < count; ++p) {
      ConvPhaseFilter const& ph = batch.phase[p];
      wide = wide && ph.out_channels % 8 == 0 && reinterpret_cast<uintptr_t>(ph.dst) % 16 == 0;
    }
    // A tap's vectors (the phases share groups and channels).
    const int64_t per_tap =
        int64_t(f.groups) * f.pack * f.in_channels * f.out_channels / (wide ? 8 : 1);
    const dim3 grid(
        unsigned(std::clamp<int64_t>((per_tap + kThreads - 1) / kThreads, 1, 65535 * 8)),
        unsigned(std::min<int64_t>(most_taps, 65535)), unsigned(count));
    const bool narrow_index = per_tap < (int64_t(1) << 31);
    for (int p = 0; p < count; ++p) {
      ConvPhaseFilter const& ph = batch.phase[p];
      PhaseDivisors& div = batch.divisors[p];
      div.row = cutlass::FastDivmod(int(int64_t(ph.pack) * ph.out_channels / (wide ? 8 : 1)));
      div.channels = cutlass::FastDivmod(ph.in_channels);
      div.pack = cutlass::FastDivmod(ph.pack);
      div.out = cutlass::FastDivmod(ph.out_channels);
    }
    if (wide) {
      narrow_index ? row_kernel<8, uint32_t><<<grid, kThreads, 0, s>>>(batch)
                   : row_kernel<8, int64_t><<<grid, kThreads, 0, s>>>(batch);
    } else {
      narrow_index ? row_kernel<1, uint32_t><<<grid, kThreads, 0, s>>>(batch)
                   : row_kernel<1, int64_t><<<grid, kThreads, 0, s>>>(batch);
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
  // take the row kernel (their zeros are part of the output).
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
