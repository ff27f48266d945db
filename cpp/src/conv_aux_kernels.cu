// The convolution backward plans' small passes (conv_aux_kernels.hpp): index
// arithmetic and copies, one thread per output element.
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

// Elements are copied as raw 2-byte values: the rearrangement is the same
// for fp16 and bf16.
__global__ void phase_filter_kernel(ConvPhaseFilter f) {
  const int64_t taps = int64_t(f.taps[0]) * f.taps[1] * f.taps[2];
  const int64_t count = int64_t(f.groups) * f.in_channels * taps * f.out_channels;
  const int64_t filter_taps = int64_t(f.filter[0]) * f.filter[1] * f.filter[2];
  const auto* src = static_cast<const uint16_t*>(f.w);
  auto* dst = static_cast<uint16_t*>(f.dst);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t rest = i;
    const int64_t k = rest % f.out_channels;
    rest /= f.out_channels;
    int64_t filter_index = 0;
    int64_t tap_rest = rest % taps;
    rest /= taps;
    int64_t radix = 1;
    for (int d = 2; d >= 0; --d) {
      const int64_t t = tap_rest % f.taps[d];
      tap_rest /= f.taps[d];
      filter_index += (f.first[d] - f.step[d] * t) * radix;
      radix *= f.filter[d];
    }
    const int64_t c = rest % f.in_channels;
    const int64_t g = rest / f.in_channels;
    dst[i] = src[((g * f.out_channels + k) * filter_taps + filter_index) * f.in_channels + c];
  }
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

int launch_conv_phase_filter(ConvPhaseFilter const& f, ckfmha_stream_t stream) {
  const int64_t count = int64_t(f.groups) * f.in_channels * f.out_channels * f.taps[0] *
                        f.taps[1] * f.taps[2];
  if (count == 0) return 0;
  phase_filter_kernel<<<blocks_for(count), kThreads, 0, cudaStream_t(stream)>>>(f);
  return launched();
}

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
