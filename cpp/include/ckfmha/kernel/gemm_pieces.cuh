// Register-level GEMM steps shared by both products of the forward kernel.
// Shared-memory fragments for step k+1 are loaded before the MMAs of step k
// are issued, so ldmatrix latency hides under tensor-core work.
#pragma once

#include <cute/tensor.hpp>

namespace ckfmha::kernel {

// acc += A * B with both operands streamed from shared memory.
template <class TiledMma, class Acc, class FragA, class ViewA, class SmemA, class CopyA,
          class FragB, class ViewB, class SmemB, class CopyB>
__device__ __forceinline__ void gemm_smem_smem(TiledMma& mma, Acc& acc, FragA& frag_a,
                                               ViewA& view_a, SmemA const& smem_a,
                                               CopyA const& copy_a, FragB& frag_b, ViewB& view_b,
                                               SmemB const& smem_b, CopyB const& copy_b) {
  using namespace cute;
#ifndef CKFMHA_QK_PREFETCH
  CUTE_UNROLL
  for (int k = 0; k < size<2>(frag_a); ++k) {
    copy(copy_a, smem_a(_, _, k), view_a(_, _, k));
    copy(copy_b, smem_b(_, _, k), view_b(_, _, k));
    gemm(mma, frag_a(_, _, k), frag_b(_, _, k), acc);
  }
#else
  copy(copy_a, smem_a(_, _, 0), view_a(_, _, 0));
  copy(copy_b, smem_b(_, _, 0), view_b(_, _, 0));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(frag_a); ++k) {
    if (k + 1 < size<2>(frag_a)) {
      copy(copy_a, smem_a(_, _, k + 1), view_a(_, _, k + 1));
      copy(copy_b, smem_b(_, _, k + 1), view_b(_, _, k + 1));
    }
    gemm(mma, frag_a(_, _, k), frag_b(_, _, k), acc);
  }
#endif
}

// acc += A * B with A already in registers (the probabilities P).
template <class TiledMma, class Acc, class FragA, class FragB, class ViewB, class SmemB,
          class CopyB>
__device__ __forceinline__ void gemm_regs_smem(TiledMma& mma, Acc& acc, FragA const& frag_a,
                                               FragB& frag_b, ViewB& view_b, SmemB const& smem_b,
                                               CopyB const& copy_b) {
  using namespace cute;
#ifndef CKFMHA_PV_PREFETCH
  CUTE_UNROLL
  for (int k = 0; k < size<2>(frag_a); ++k) {
    copy(copy_b, smem_b(_, _, k), view_b(_, _, k));
    gemm(mma, frag_a(_, _, k), frag_b(_, _, k), acc);
  }
#else
  copy(copy_b, smem_b(_, _, 0), view_b(_, _, 0));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(frag_a); ++k) {
    if (k + 1 < size<2>(frag_a)) copy(copy_b, smem_b(_, _, k + 1), view_b(_, _, k + 1));
    gemm(mma, frag_a(_, _, k), frag_b(_, _, k), acc);
  }
#endif
}

}  // namespace ckfmha::kernel
