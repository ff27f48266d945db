// Reinterpretations of mma.sync m16n8k16 register fragments.
//
// An accumulator fragment has layout ((2,2), MMA_M, MMA_N): per atom a thread
// holds columns {c, c+1} (first mode) of rows {r, r+8} (second mode). Softmax
// wants it as a (rows, cols) matrix; the P*V product wants it as an A operand.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

namespace ckfmha::kernel {

// ((2,2),M,N) -> ((2,M),(2,N)): row index first, column index second.
template <class Layout>
__device__ __forceinline__ constexpr auto accum_as_rows_cols(Layout const& acc) {
  using namespace cute;
  return make_layout(make_layout(get<1>(get<0>(acc)), get<1>(acc)),
                     make_layout(get<0>(get<0>(acc)), get<2>(acc)));
}

// ((2,2),M,N) -> ((2,2,2),M,N/2). Two neighbouring 8-column accumulator atoms
// hold exactly the register contents of one 16-deep A fragment, so P never
// leaves registers between the two GEMMs.
template <class Layout>
__device__ __forceinline__ constexpr auto accum_as_operand_a(Layout const& acc) {
  using namespace cute;
  static_assert(size<2>(Layout{}) % 2 == 0, "need an even number of 8-column atoms");
  auto n_split = logical_divide(get<2>(acc), Int<2>{});
  return make_layout(make_layout(get<0>(get<0>(acc)), get<1>(get<0>(acc)), get<0>(n_split)),
                     get<1>(acc), get<1>(n_split));
}

// wgmma (m64nNk16) accumulators: ((2,2,N/8), M, N) per thread, the modes of
// the first being a pair of neighbouring columns, rows r and r+8, and 8-column
// chunks. As with mma.sync, a row is spread over the four lanes of a quad.
template <class Layout>
__device__ __forceinline__ constexpr auto gmma_accum_as_rows_cols(Layout const& acc) {
  using namespace cute;
  auto values = get<0>(acc);
  return make_layout(make_layout(get<1>(values), get<1>(acc)),
                     make_layout(get<0>(values), get<2>(values), get<2>(acc)));
}

// ((2,2,N/8), M, 1) -> ((2,2,2), M, N/16): two neighbouring 8-column chunks of
// the S accumulator are one 16-deep A fragment of the register-sourced wgmma
// that computes P V, so P stays in registers.
template <class Layout>
__device__ __forceinline__ constexpr auto gmma_accum_as_operand_a(Layout const& acc) {
  using namespace cute;
  static_assert(size<2>(Layout{}) == 1, "one wgmma spans the whole key tile");
  auto values = get<0>(acc);
  auto chunks = logical_divide(get<2>(values), Int<2>{});
  return make_layout(make_layout(get<0>(values), get<1>(values), get<0>(chunks)), get<1>(acc),
                     get<1>(chunks));
}

// Element-wise conversion of a compact register fragment into another of the
// same size (the converter packs pairs into single cvt instructions).
template <class SrcEngine, class SrcLayout, class DstEngine, class DstLayout>
__device__ __forceinline__ void convert_fragment_into(cute::Tensor<SrcEngine, SrcLayout> const& src,
                                                      cute::Tensor<DstEngine, DstLayout>& dst) {
  using From = typename SrcEngine::value_type;
  using To = typename DstEngine::value_type;
  constexpr int kSize = decltype(cute::size(src))::value;
  static_assert(decltype(cute::size(dst))::value == kSize);
  cutlass::NumericArrayConverter<To, From, kSize> convert;
  *reinterpret_cast<cutlass::Array<To, kSize>*>(dst.data()) =
      convert(*reinterpret_cast<cutlass::Array<From, kSize> const*>(src.data()));
}

// The same, into a new fragment with the source's layout.
template <class To, class Engine, class Layout>
__device__ __forceinline__ auto convert_fragment(cute::Tensor<Engine, Layout> const& src) {
  auto dst = cute::make_tensor<To>(src.layout());
  convert_fragment_into(src, dst);
  return dst;
}

}  // namespace ckfmha::kernel
