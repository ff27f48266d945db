// The dQ reduce-adds of the Hopper backward main stage (key-split layout,
// d64, d96 and d128), issued by one thread of the producer warpgroup instead of
// by the consumers: each consumer warpgroup stages its half of a query
// tile's dQ in shared memory and arrives on dq_full; this thread adds the
// half to the fp32 accumulator with a TMA reduce-add and arrives on dq_empty
// once the copy has read the buffer. The consumers so never wait for a TMA
// issue or its read, nor meet at a barrier for them (NOTES 74).
#pragma once

#include "ckfmha/kernel/sm90/bwd_ring.cuh"

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

namespace ckfmha::kernel {

// Run by one thread, over the same walk as the consumers. The adds' order is
// not fixed across CTAs (fast mode).
template <class Traits>
__device__ __forceinline__ void bwd_sm90_add_dq_tiles(BwdSm90Params<Traits> const& params,
                                                      typename Traits::SharedStorage* storage,
                                                      BwdSm90QueryWalk const& walk, int iters,
                                                      int batch) {
  using namespace cute;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int kWarpgroups = Traits::kConsumerWarpgroups;
  BwdParams const& p = params.p;
  auto& bar = storage->bar;
  Tensor mdQ = params.tma_dq.get_tma_tensor(
      make_shape(p.workspace_rows, int(Traits::kHeadDim), p.nhead_q * p.batch));
  auto dq_tma = params.tma_dq.get_slice(Int<0>{});
  for (int it = 0; it < iters; ++it) {
    const int head = walk.head(it);
    CUTE_UNROLL
    for (int w = 0; w < kWarpgroups; ++w) {
      Barrier::wait(&bar.dq_full[w], it & 1);
      Tensor sdQ_half = make_tensor(
          make_smem_ptr(storage->dq.data() + w * cosize_v<typename Traits::SmemLayoutdQBox>),
          typename Traits::SmemLayoutdQBox{});
      // Whole 64-row tiles: the workspace pads each head's rows (rows past
      // seqlen_q add zeros there, as their P is 0).
      Tensor gdQ = local_tile(mdQ(_, _, batch * p.nhead_q + head), typename Traits::DqBox{},
                              make_coord(walk.m_block(it), w));
      copy(params.tma_dq, dq_tma.partition_S(sdQ_half), dq_tma.partition_D(gdQ));
      tma_store_arrive();
    }
    // Each half's buffer is free once its add has read it; the first half's
    // add was committed first.
    tma_store_wait<kWarpgroups - 1>();
    Barrier::arrive(&bar.dq_empty[0]);
    tma_store_wait<0>();
    CUTE_UNROLL
    for (int w = 1; w < kWarpgroups; ++w) Barrier::arrive(&bar.dq_empty[w]);
  }
  // The adds have landed before the CTA (and its shared memory) goes away
  // and before convert_dq reads the accumulator.
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

}  // namespace ckfmha::kernel
