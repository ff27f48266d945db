// One k-tile's products on wgmma, as the sm_90a convolution kernels issue
// them: every k-step of the shared-memory stage in one asynchronous batch.
// Each kernel waits for the batch in its own way (one batch left in flight
// while the next tile loads, or none).
#pragma once

#include <cute/tensor.hpp>

namespace ckfmha::kernel::conv_detail {

// acc += A(stage) * B(stage), committed as one batch; tCrA and tCrB are the
// warpgroup's fragments over (MMA, M or N, k-step, stage).
template <class TiledMma, class FragA, class FragB, class Acc>
__device__ __forceinline__ void issue_wgmma_batch(TiledMma& tiled_mma, FragA const& tCrA,
                                                  FragB const& tCrB, int stage, Acc& acc) {
  using namespace cute;
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  CUTE_UNROLL
  for (int kk = 0; kk < size<2>(tCrA); ++kk) {
    gemm(tiled_mma, tCrA(_, _, kk, stage), tCrB(_, _, kk, stage), acc);
  }
  warpgroup_commit_batch();
}

}  // namespace ckfmha::kernel::conv_detail
