// The TMA forward's epilogue: a consumer warpgroup's accumulators into y
// through shared memory. The wgmma accumulator layout gives a thread pairs of
// channels in eight rows, so storing straight from registers writes 4 bytes a
// row per thread, a quarter of a 32-byte sector per instruction and warp. Here
// each warpgroup writes one chunk of its rows (kEpilogueCols channels) to
// shared memory, then its threads store whole 16-byte runs of 8 channels, a
// row's chunk contiguous across neighbouring threads.
#pragma once

#include "ckfmha/kernel/conv/gather.cuh"
#include "ckfmha/kernel/params/conv_params.h"

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <cstdint>

namespace ckfmha::kernel {

// acc and coords: this thread's wgmma accumulators of the tile and the same
// partition of an identity tensor over it ((2, 2, N / 8) values per 64-row
// block: channel pair, row half, 8-channel column). stage: this warpgroup's
// kRowsPerConsumer padded rows; warpgroup and thread: this consumer
// warpgroup's index and the thread's index within it.
template <class Traits, class Acc, class Coords>
__device__ __forceinline__ void store_tile_through_smem(
    ConvFwdParams const& p, ConvRow const* rows, typename Traits::Element* y_group,
    int32_t first_channel, Acc const& acc, Coords const& coords, char* stage, int warpgroup,
    int thread) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kCols = Traits::kEpilogueCols;
  constexpr int kPitch = Traits::kEpiloguePitch;
  constexpr int kRows = Traits::kRowsPerConsumer;
  constexpr int kStride = 64 * Traits::kConsumerWarpgroups;  // between a warpgroup's 64-row blocks
  constexpr int kRuns = kCols / 8;
  static_assert(rank(Acc{}) == 3 && size<0, 2>(Acc{}) == Traits::kTileN / 8,
                "wgmma accumulators: (channel pair, row half, column) x row blocks x 1");
  // Where a tile row lies among this warpgroup's rows.
  auto local_row = [](int r) { return (r / kStride) * 64 + r % 64; };

  CUTE_UNROLL
  for (int chunk = 0; chunk < Traits::kTileN / kCols; ++chunk) {
    CUTE_UNROLL
    for (int m = 0; m < size<1>(acc); ++m) {
      CUTE_UNROLL
      for (int column = 0; column < kRuns; ++column) {
        CUTE_UNROLL
        for (int half = 0; half < 2; ++half) {
          const auto lo = make_coord(make_coord(0, half, chunk * kRuns + column), m, 0);
          const auto hi = make_coord(make_coord(1, half, chunk * kRuns + column), m, 0);
          const int r = get<0>(coords(lo));
          const int c = get<1>(coords(lo)) - chunk * kCols;
          const Element a(acc(lo));
          const Element b(acc(hi));
          *reinterpret_cast<uint32_t*>(stage + local_row(r) * kPitch + c * int(sizeof(Element))) =
              uint32_t(a.raw()) | (uint32_t(b.raw()) << 16);
        }
      }
    }
    cutlass::arch::NamedBarrier::sync(128, 1 + warpgroup);
    for (int v = thread; v < kRows * kRuns; v += 128) {
      const int local = v / kRuns;
      const int run = v % kRuns;
      const int r = (local / 64) * kStride + warpgroup * 64 + local % 64;
      const int64_t y_base = rows[r].y_base;
      const int32_t channel = first_channel + chunk * kCols + run * 8;
      if (y_base < 0 || channel >= p.out_channels) continue;
      const uint4 value = *reinterpret_cast<const uint4*>(stage + local * kPitch + run * 16);
      Element* dst = y_group + y_base + channel;
      if (p.vector_stores && channel + 8 <= p.out_channels) {
        *reinterpret_cast<uint4*>(dst) = value;
      } else {
        const Element* elements = reinterpret_cast<const Element*>(&value);
        for (int e = 0; e < 8 && channel + e < p.out_channels; ++e) dst[e] = elements[e];
      }
    }
    // The chunk is stored before the next one overwrites it.
    cutlass::arch::NamedBarrier::sync(128, 1 + warpgroup);
  }
}

}  // namespace ckfmha::kernel
