// The softmax's row sums on the tensor cores (Traits::kRowSumsByProduct):
// each P V product also multiplies the same P registers by a constant tile
// of ones in shared memory, an 8-column wgmma per K step whose accumulator
// then holds, in every column, the sum of its row's probabilities over the
// key tile. That takes the add per score off the consumers' softmax, whose
// issue slots pace the fp8 forward (NOTES 84, 99); a thread then adds one
// sum per row and tile into its running sums. Every K step reads the same
// ones: one step's tile, 256 bytes.
//
// The product starts from zero at every key tile: a running sum kept in the
// accumulator lost most of each tile's addition once it had grown, the fp8
// wgmma's accumulation keeping only the leading bits (at 16k keys O came out
// 30% off). Every lane of a row's quad holds the row's whole sum.
#pragma once

#include <cute/tensor.hpp>

#include <cstdint>
#include <utility>

namespace ckfmha::kernel {

struct NoRowSums {};

// A consumer thread's side of the sums product: the tiled MMA and the ones
// tile's descriptor, (MMA, 1, 1).
template <class Traits>
struct FwdRowSumsMma {
  using Element = typename Traits::InputElement;
  using TiledMma = typename Traits::TiledMmaRowSums;
  using SmemOnes = decltype(cute::make_tensor(cute::make_smem_ptr(std::declval<Element*>()),
                                              typename Traits::SmemLayoutOnes{}));
  using Accumulator = decltype(cute::partition_fragment_C(
      TiledMma{}, cute::Shape<cute::Int<Traits::kBlockM>, cute::_8>{}));

  TiledMma mma;
  decltype(mma.get_thread_slice(0)) thr;
  decltype(thr.partition_fragment_B(std::declval<SmemOnes>())) tSrOnes;

  __device__ __forceinline__ FwdRowSumsMma(Element* ones, int tid)
      : thr(mma.get_thread_slice(tid)),
        tSrOnes(thr.partition_fragment_B(
            cute::make_tensor(cute::make_smem_ptr(ones), typename Traits::SmemLayoutOnes{}))) {}

  // acc = P x ones, P as the P V product's A registers (MMA, 1, K); issued
  // inside that product's wgmma batch.
  template <class Probs>
  __device__ __forceinline__ void issue(Probs const& tOrP, Accumulator& acc) {
    using namespace cute;
    mma.accumulate_ = GMMA::ScaleOut::Zero;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tOrP); ++k) {
      gemm(mma, tOrP(_, _, k), tSrOnes(_, _, 0), acc);
      mma.accumulate_ = GMMA::ScaleOut::One;
    }
  }
};

// Fills the ones tile, one element a thread, before the barrier that
// starts the roles (the wgmmas read it through the async proxy).
template <class Traits>
__device__ __forceinline__ void fill_ones(typename Traits::InputElement* ones, int thread) {
  static_assert(Traits::kOnesElements <= Traits::kThreads);
  if (thread < Traits::kOnesElements) ones[thread] = typename Traits::InputElement(1.f);
}

}  // namespace ckfmha::kernel
