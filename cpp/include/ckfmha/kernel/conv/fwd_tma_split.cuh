// The TMA forward's reduction split over the CTAs of a cluster
// (ConvFwdTmaParams::split_shift > 0, conv_fwd_tma_splits): every CTA of a
// cluster takes the same output tile, rank r multiplies its run of the
// k-tiles, and the partial sums meet in shared memory. The operand stages
// hold them: the producer waits at the same cluster barriers as the
// consumers, so no copy lands in a stage between the last k-tile and the
// next tile's loads. The launcher gives each cluster one tile; the kernel
// still walks several correctly.
#pragma once

#include "ckfmha/kernel/conv/cluster_split_sum.cuh"
#include "ckfmha/kernel/conv/gather.cuh"
#include "ckfmha/kernel/params/conv_params.h"

#include <cstdint>

namespace ckfmha::kernel::conv_detail {

// This CTA's share of a tile's k-tiles: [begin, end) of `count`, and the
// stride and first of the tiles its cluster walks.
struct ConvSplitRange {
  int32_t rank;
  int32_t splits;
  int32_t begin;
  int32_t end;
  int64_t first_tile;
  int64_t tile_step;

  // Whether the cluster takes another tile after `tile` of `tiles`.
  __device__ bool has_next(int64_t tile, int64_t tiles) const { return tile + tile_step < tiles; }
};

// The split instance's (kSplit) clusters are 2^split_shift CTAs along x, so
// a CTA's rank is blockIdx.x's low bits; the first `k_tiles mod splits` ranks
// take one k-tile more. Shifts and masks, no division: the k-tile loops' counters
// then stay in the compiler's uniform registers, as unsplit (a division by
// the split count, or the cluster's rank register, put them in per-thread
// ones, with more instructions around each k-tile's products).
template <bool kSplit>
__device__ __forceinline__ ConvSplitRange conv_split_range(int32_t split_shift,
                                                          int32_t k_tiles) {
  if constexpr (!kSplit) {
    // The unsplit instance: every k-tile, the grid's tiles in turn.
    return {0, 1, 0, k_tiles, int64_t(blockIdx.x), int64_t(gridDim.x)};
  }
  ConvSplitRange r;
  r.splits = 1 << split_shift;
  r.rank = int32_t(blockIdx.x & unsigned(r.splits - 1));
  const int32_t base = k_tiles >> split_shift;
  const int32_t extra = k_tiles & (r.splits - 1);
  r.begin = r.rank * base + min(r.rank, extra);
  r.end = r.begin + base + (r.rank < extra ? 1 : 0);
  r.first_tile = blockIdx.x >> split_shift;
  r.tile_step = gridDim.x >> split_shift;
  return r;
}

// Called by every consumer thread once the CTA's products of the tile are
// done (no wgmma reads the stages): the ranks' partial tiles summed through
// the stages (cluster_split_sum) and stored as 16-byte runs of 8 channels.
// `more`: the cluster takes another tile, whose partial sums must wait until
// every rank has read this one's (a third barrier; the producer waits at all
// three).
template <class Traits, class Acc, class Coords>
__device__ __forceinline__ void store_tile_split_sum(ConvFwdParams const& p, ConvRow const* rows,
                                                     typename Traits::Element* y_group,
                                                     int32_t first_channel, Acc const& acc,
                                                     Coords const& coords, float* scratch,
                                                     ConvSplitRange const& range, bool more,
                                                     int thread) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Element = typename Traits::Element;
  cluster_split_sum<Traits::kTileM, Traits::kTileN>(
      acc, coords, scratch, range.rank, range.splits, thread, Traits::kConsumerThreads,
      [&](int row, int run, float const (&sum)[8]) {
        const int64_t y_base = rows[row].y_base;
        const int32_t channel = first_channel + run * 8;
        if (y_base < 0 || channel >= p.out_channels) return;
        Element* dst = y_group + y_base + channel;
        if (p.vector_stores && channel + 8 <= p.out_channels) {
          *reinterpret_cast<uint4*>(dst) = pack_eight<Element>(sum);
        } else {
          for (int e = 0; e < 8 && channel + e < p.out_channels; ++e) dst[e] = Element(sum[e]);
        }
      });
  // Every rank has read its slots: the next tile may write them, and the
  // producers load into the stages again.
  if (more) conv_cluster_barrier<true>();
#endif
}

}  // namespace ckfmha::kernel::conv_detail
