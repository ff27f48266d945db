// Register-level GEMM steps shared by both products of the forward kernel.
// Each k-step loads its shared-memory fragments, then issues its MMAs; ptxas
// hoists the ldmatrix loads of later steps on its own (an explicit
// one-step-ahead prefetch compiled to identical registers and spills; see
// benchmarks/NOTES.md, entry 2).
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
  CUTE_UNROLL
  for (int k = 0; k < size<2>(frag_a); ++k) {
    copy(copy_a, smem_a(_, _, k), view_a(_, _, k));
    copy(copy_b, smem_b(_, _, k), view_b(_, _, k));
    gemm(mma, frag_a(_, _, k), frag_b(_, _, k), acc);
  }
}

// acc += A * B with A already in registers (the probabilities P).
template <class TiledMma, class Acc, class FragA, class FragB, class ViewB, class SmemB,
          class CopyB>
__device__ __forceinline__ void gemm_regs_smem(TiledMma& mma, Acc& acc, FragA const& frag_a,
                                               FragB& frag_b, ViewB& view_b, SmemB const& smem_b,
                                               CopyB const& copy_b) {
  using namespace cute;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(frag_a); ++k) {
    copy(copy_b, smem_b(_, _, k), view_b(_, _, k));
    gemm(mma, frag_a(_, _, k), frag_b(_, _, k), acc);
  }
}

}  // namespace ckfmha::kernel
