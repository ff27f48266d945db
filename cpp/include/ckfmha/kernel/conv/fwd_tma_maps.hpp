// Host side: the tensor maps of the TMA forward (fwd_tma_kernel.cuh), encoded
// for every launch from the problem's shapes and pointers. x is described in
// im2col mode: the copy engine walks TileM output positions (w, then h, then
// d, then the batch) of the box of first-tap coordinates the outputs span
// (conv_tma_lower_corner, conv_tma_upper_corner), stepping by the stride, and
// reads TileK channels at each position shifted by the tap's offset, zeros
// outside the input. w is a plain 3D box.
#pragma once

#include "ckfmha/kernel/params/conv_params.h"

#include <cute/arch/copy_sm90_desc.hpp>
#include <cutlass/cuda_host_adapter.hpp>

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace ckfmha::kernel {

template <class Traits>
constexpr CUtensorMapSwizzle conv_tma_swizzle() {
  return Traits::kSwizzleBytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
}

template <class Traits>
constexpr CUtensorMapDataType conv_tma_dtype() {
  return std::is_same_v<typename Traits::Element, cutlass::half_t>
             ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
             : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
}

// 0, or -cudaErrorInvalidValue where the driver refuses a map (the runtime's
// conv_tma_limit check keeps problems it would refuse away from this kernel).
template <class Traits>
int encode_conv_fwd_tma_maps(ConvFwdParams const& p, cute::TmaDescriptor* x_map,
                             cute::TmaDescriptor* w_map) {
  constexpr int64_t kBytes = int64_t(sizeof(typename Traits::Element));
  constexpr int kDims = Traits::kSpatialDims;
  // The 3D form's axes (d, h, w) from the innermost: w, h, then d in 3D.
  cuuint64_t dim[5];
  cuuint64_t stride[4];
  cuuint32_t step[5] = {1, 1, 1, 1, 1};
  int lower[3];
  int upper[3];
  int rank = 0;
  dim[rank++] = cuuint64_t(int64_t(p.groups) * p.in_channels);
  for (int i = 0; i < kDims; ++i) {
    const int axis = 2 - i;
    dim[rank] = cuuint64_t(p.input[axis]);
    stride[rank - 1] = cuuint64_t(p.x_stride[1 + axis] * kBytes);
    step[rank] = cuuint32_t(p.stride[axis]);
    lower[i] = int(conv_tma_lower_corner(p.padding[axis]));
    upper[i] = int(conv_tma_upper_corner(p.input[axis], p.output[axis], p.stride[axis],
                                         p.padding[axis]));
    ++rank;
  }
  dim[rank] = cuuint64_t(p.batch);
  stride[rank - 1] = cuuint64_t(p.x_stride[0] * kBytes);
  ++rank;
  CUresult status = CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeIm2col)(
      x_map, conv_tma_dtype<Traits>(), cuuint32_t(rank), const_cast<void*>(p.x), dim, stride,
      lower, upper, cuuint32_t(Traits::kTileK), cuuint32_t(Traits::kTileM), step,
      CU_TENSOR_MAP_INTERLEAVE_NONE, conv_tma_swizzle<Traits>(),
      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS) return -int(cudaErrorInvalidValue);

  // w: (taps x channels, out channels, groups), dense.
  const cuuint64_t w_dim[3] = {cuuint64_t(p.reduction), cuuint64_t(p.out_channels),
                               cuuint64_t(p.groups)};
  const cuuint64_t w_stride[2] = {cuuint64_t(int64_t(p.reduction) * kBytes),
                                  cuuint64_t(int64_t(p.reduction) * p.out_channels * kBytes)};
  const cuuint32_t box[3] = {cuuint32_t(Traits::kTileK), cuuint32_t(Traits::kTileN), 1};
  const cuuint32_t w_step[3] = {1, 1, 1};
  status = CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
      w_map, conv_tma_dtype<Traits>(), 3, const_cast<void*>(p.w), w_dim, w_stride, box, w_step,
      CU_TENSOR_MAP_INTERLEAVE_NONE, conv_tma_swizzle<Traits>(),
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return status == CUDA_SUCCESS ? 0 : -int(cudaErrorInvalidValue);
}

}  // namespace ckfmha::kernel
