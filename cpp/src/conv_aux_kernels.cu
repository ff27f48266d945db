// The convolution backward plans' small passes (conv_aux_kernels.hpp) other
// than the filter rearrangement (conv_phase_filters.cu): zeros and the fp32
// conversion, one thread per output element.
#include "ckfmha/runtime/conv_aux_kernels.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>
#include <cstdint>

namespace ckfmha::runtime {

namespace {

constexpr int kThreads = 256;

// Blocks for `count` threads, a grid-stride loop covering the rest.
unsigned blocks_for(int64_t count) {
  return unsigned(std::clamp<int64_t>((count + kThreads - 1) / kThreads, 1, 65535 * 8));
}

int launched() {
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? 0 : -int(err);
}

__global__ void zero_fill_kernel(ConvZeroFill z) {
  const int64_t count = z.extent[0] * z.extent[1] * z.extent[2] * z.extent[3] * z.row;
  auto* base = static_cast<uint16_t*>(z.base);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t rest = i / z.row;
    int64_t offset = i % z.row;
    for (int d = 3; d >= 0; --d) {
      offset += (rest % z.extent[d]) * z.stride[d];
      rest /= z.extent[d];
    }
    base[offset] = 0;
  }
}

template <class T>
__global__ void convert_kernel(float const* sums, T* out, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    if constexpr (sizeof(T) == 2 && std::is_same_v<T, __half>) {
      out[i] = __float2half_rn(sums[i]);
    } else {
      out[i] = __float2bfloat16_rn(sums[i]);
    }
  }
}

}  // namespace

int launch_conv_zero_fill(ConvZeroFill const& z, ckfmha_stream_t stream) {
  const int64_t count = z.extent[0] * z.extent[1] * z.extent[2] * z.extent[3] * z.row;
  if (count == 0) return 0;
  zero_fill_kernel<<<blocks_for(count), kThreads, 0, cudaStream_t(stream)>>>(z);
  return launched();
}

int zero_fp32(float* data, int64_t count, ckfmha_stream_t stream) {
  const cudaError_t err =
      cudaMemsetAsync(data, 0, size_t(count) * sizeof(float), cudaStream_t(stream));
  return err == cudaSuccess ? 0 : -int(err);
}

int launch_conv_convert_weights(float const* sums, void* dw, ckfmha_dtype dtype, int64_t count,
                                ckfmha_stream_t stream) {
  if (count == 0) return 0;
  auto s = cudaStream_t(stream);
  if (dtype == CKFMHA_DTYPE_FP16) {
    convert_kernel<<<blocks_for(count), kThreads, 0, s>>>(sums, static_cast<__half*>(dw), count);
  } else {
    convert_kernel<<<blocks_for(count), kThreads, 0, s>>>(sums, static_cast<__nv_bfloat16*>(dw),
                                                          count);
  }
  return launched();
}

}  // namespace ckfmha::runtime
