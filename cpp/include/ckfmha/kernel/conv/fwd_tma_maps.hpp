// Host side: the tensor maps of the TMA convolution kernels (fwd_tma_kernel.cuh,
// bwd_weight_tma_kernel.cuh), encoded for every launch from the problem's
// shapes and pointers. x is described in im2col mode: the copy engine walks
// TileM output positions (w, then h, then d, then the batch) of the box of
// first-tap coordinates the outputs span (conv_tma_lower_corner,
// conv_tma_upper_corner), stepping by the stride, and reads TileK channels at
// each position shifted by the tap's offset, zeros outside the input. w is a
// plain 3D box (4D over a transposed filter view); backward-weight's dense
// dy (and pointwise x) a 2D one of (channels, positions).
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

template <class Element>
constexpr CUtensorMapDataType conv_tma_dtype() {
  return std::is_same_v<Element, cutlass::half_t> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                  : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
}

// An im2col map of a channels-last tensor (`channels` a position, strides in
// elements (batch, d, h, w)): each copy walks `box_pixels` consecutive
// positions of the output grid that `input`, `output`, `stride` and
// `padding` give per dim (d, h, w; the last `dims` of them real) and reads
// `box_channels` channels at each, shifted by the copy's tap offsets. 0, or
// -cudaErrorInvalidValue where the driver refuses it (the runtime's limit
// checks keep problems it would refuse away from the TMA kernels).
template <class Element>
int encode_conv_im2col_map(cute::TmaDescriptor* map, const void* base, int dims,
                           int64_t channels, int32_t batch, const int64_t* strides,
                           const int32_t* input, const int32_t* output, const int32_t* stride,
                           const int32_t* padding, int box_channels, int box_pixels,
                           CUtensorMapSwizzle swizzle) {
  constexpr int64_t kBytes = int64_t(sizeof(Element));
  // The axes from the innermost: channels, w, h, then d in 3D, then the batch.
  cuuint64_t dim[5];
  cuuint64_t stride_bytes[4];
  cuuint32_t step[5] = {1, 1, 1, 1, 1};
  int lower[3];
  int upper[3];
  int rank = 0;
  dim[rank++] = cuuint64_t(channels);
  for (int i = 0; i < dims; ++i) {
    const int axis = 2 - i;
    dim[rank] = cuuint64_t(input[axis]);
    stride_bytes[rank - 1] = cuuint64_t(strides[1 + axis] * kBytes);
    step[rank] = cuuint32_t(stride[axis]);
    lower[i] = int(conv_tma_lower_corner(padding[axis]));
    upper[i] = int(conv_tma_upper_corner(input[axis], output[axis], stride[axis], padding[axis]));
    ++rank;
  }
  dim[rank] = cuuint64_t(batch);
  stride_bytes[rank - 1] = cuuint64_t(strides[0] * kBytes);
  ++rank;
  const CUresult status = CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeIm2col)(
      map, conv_tma_dtype<Element>(), cuuint32_t(rank), const_cast<void*>(base), dim,
      stride_bytes, lower, upper, cuuint32_t(box_channels), cuuint32_t(box_pixels), step,
      CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return status == CUDA_SUCCESS ? 0 : -int(cudaErrorInvalidValue);
}

// The element stride between consecutive positions of a channels-last tensor
// ((batch, d, h, w) strides, `sizes` (d, h, w)) where every position lies one
// such stride past the one before, across rows, planes and images; 0 where
// they do not, or where the positions overflow a 32-bit copy coordinate.
inline int64_t uniform_position_stride(const int64_t* strides, const int32_t* sizes,
                                       int32_t batch) {
  const int64_t step = strides[3];
  int64_t expected = step * sizes[2];
  for (int d = 1; d >= 0; --d) {
    if (sizes[d] > 1 && strides[1 + d] != expected) return 0;
    expected *= sizes[d];
  }
  if (batch > 1 && strides[0] != expected) return 0;
  return int64_t(batch) * sizes[0] * sizes[1] * sizes[2] <= 0x7fffffff ? step : 0;
}

// A tiled map of such a tensor as (channels, positions): box_channels by
// box_rows positions a copy. 0, or -cudaErrorInvalidValue.
template <class Element>
int encode_conv_rows_map(cute::TmaDescriptor* map, const void* base, int64_t channels,
                         int64_t positions, int64_t step, int box_channels, int box_rows,
                         CUtensorMapSwizzle swizzle) {
  const cuuint64_t dim[2] = {cuuint64_t(channels), cuuint64_t(positions)};
  const cuuint64_t stride[1] = {cuuint64_t(step * int64_t(sizeof(Element)))};
  const cuuint32_t box[2] = {cuuint32_t(box_channels), cuuint32_t(box_rows)};
  const cuuint32_t step_one[2] = {1, 1};
  const CUresult status = CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
      map, conv_tma_dtype<Element>(), 2, const_cast<void*>(base), dim, stride, box, step_one,
      CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return status == CUDA_SUCCESS ? 0 : -int(cudaErrorInvalidValue);
}

// The transposed-filter variant's w map over p.filter_view: (the filter's
// input channels = the problem's output channels, the filter's taps, its
// output channels = the problem's input channels, groups), boxes of 64
// channels of one tap by TileK. The view must be the backward-data phases'
// (channels contiguous, taps whole runs of them). 0, or
// -cudaErrorInvalidValue.
template <class Traits>
int encode_conv_transposed_filter_map(ConvFwdParams const& p, cute::TmaDescriptor* w_map) {
  constexpr int64_t kBytes = int64_t(sizeof(typename Traits::Element));
  ConvFilterView const& v = p.filter_view;
  const int64_t run = p.out_channels;  // one tap's channels
  if (v.out_channel != 1 || v.in_channel % run != 0 || v.group % v.in_channel != 0) {
    return -int(cudaErrorInvalidValue);
  }
  const cuuint64_t w_dim[4] = {cuuint64_t(run), cuuint64_t(v.in_channel / run),
                               cuuint64_t(p.in_channels), cuuint64_t(p.groups)};
  const cuuint64_t w_stride[3] = {cuuint64_t(run * kBytes), cuuint64_t(v.in_channel * kBytes),
                                  cuuint64_t(v.group * kBytes)};
  const cuuint32_t box[4] = {cuuint32_t(Traits::kFilterRun), 1, cuuint32_t(Traits::kTileK), 1};
  const cuuint32_t w_step[4] = {1, 1, 1, 1};
  const CUresult status = CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
      w_map, conv_tma_dtype<typename Traits::Element>(), 4, const_cast<void*>(p.w), w_dim,
      w_stride, box, w_step, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return status == CUDA_SUCCESS ? 0 : -int(cudaErrorInvalidValue);
}

// 0, or -cudaErrorInvalidValue where the driver refuses a map (the runtime's
// conv_tma_limit check keeps problems it would refuse away from this kernel).
template <class Traits>
int encode_conv_fwd_tma_maps(ConvFwdParams const& p, cute::TmaDescriptor* x_map,
                             cute::TmaDescriptor* w_map) {
  constexpr int64_t kBytes = int64_t(sizeof(typename Traits::Element));
  if (int err = encode_conv_im2col_map<typename Traits::Element>(
          x_map, p.x, Traits::kSpatialDims, int64_t(p.groups) * p.in_channels, p.batch,
          p.x_stride, p.input, p.output, p.stride, p.padding, Traits::kTileK, Traits::kTileM,
          conv_tma_swizzle<Traits>())) {
    return err;
  }

  if constexpr (Traits::kFilterTransposed) {
    return encode_conv_transposed_filter_map<Traits>(p, w_map);
  }
  // w: (taps x channels, out channels, groups), dense.
  const cuuint64_t w_dim[3] = {cuuint64_t(p.reduction), cuuint64_t(p.out_channels),
                               cuuint64_t(p.groups)};
  const cuuint64_t w_stride[2] = {cuuint64_t(int64_t(p.reduction) * kBytes),
                                  cuuint64_t(int64_t(p.reduction) * p.out_channels * kBytes)};
  const cuuint32_t box[3] = {cuuint32_t(Traits::kTileK), cuuint32_t(Traits::kTileN), 1};
  const cuuint32_t w_step[3] = {1, 1, 1};
  const CUresult status = CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
      w_map, conv_tma_dtype<typename Traits::Element>(), 3, const_cast<void*>(p.w), w_dim,
      w_stride, box, w_step, CU_TENSOR_MAP_INTERLEAVE_NONE, conv_tma_swizzle<Traits>(),
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return status == CUDA_SUCCESS ? 0 : -int(cudaErrorInvalidValue);
}

}  // namespace ckfmha::kernel
