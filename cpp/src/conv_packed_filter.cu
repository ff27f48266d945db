// The forward plan's packed filter (conv_aux_kernels.hpp).
//
// Packed row g * K + k of the output (g = q * pack + m: the packed group q's
// member m, its output channel k) holds pack runs of C channels for each tap,
// of which run m is w's row (g, k) at that tap and the others zeros. One
// thread writes one vector of a row: C is a multiple of 8 wherever the plan
// packs (kernel::conv_tma_pack), so a vector of up to 8 channels lies in one
// run, either a copy of w or zeros.
#include "ckfmha/runtime/conv_aux_kernels.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace ckfmha::runtime {

namespace {

constexpr int kThreads = 256;

// Vector: 16 bytes (8 channels) where w and dst are aligned to them, else one
// 2-byte element (the copy is the same for fp16 and bf16). Index: the type
// coordinates are found in, 32-bit where the count allows (64-bit division
// costs tens of instructions).
template <class Vector, class Index>
__global__ void __launch_bounds__(kThreads) packed_filter_kernel(
    ConvPackedFilter const __grid_constant__ f) {
  constexpr int kChannels = int(sizeof(Vector) / 2);
  const Index run = Index(f.in_channels / kChannels);  // vectors of one group's C
  const Index row = run * Index(f.pack);               // vectors of a packed (row, tap)
  const Index taps = Index(f.taps);
  const Index out_channels = Index(f.out_channels);
  const Index count = Index(f.groups) * out_channels * taps * row;
  const auto* src = static_cast<const Vector*>(f.w);
  auto* dst = static_cast<Vector*>(f.dst);
  for (Index i = Index(blockIdx.x) * kThreads + threadIdx.x; i < count;
       i += Index(gridDim.x) * kThreads) {
    const Index line = i / row;  // (g * K + k) * taps + tap
    const Index v = i - line * row;
    const Index member = v / run;                   // the run's group within the pack
    const Index g = line / taps / out_channels;     // w's group of this row
    if (g % Index(f.pack) != member) {
      dst[i] = Vector{};
      continue;
    }
    dst[i] = src[line * run + v - member * run];
  }
}

template <class Vector>
void launch(ConvPackedFilter const& f, int64_t count, cudaStream_t stream) {
  const auto blocks = unsigned(std::clamp<int64_t>((count + kThreads - 1) / kThreads, 1,
                                                   int64_t(65535) * 8));
  if (count < (int64_t(1) << 31)) {
    packed_filter_kernel<Vector, uint32_t><<<blocks, kThreads, 0, stream>>>(f);
  } else {
    packed_filter_kernel<Vector, int64_t><<<blocks, kThreads, 0, stream>>>(f);
  }
}

}  // namespace

int launch_conv_packed_filter(ConvPackedFilter const& f, ckfmha_stream_t stream) {
  const int64_t elements =
      int64_t(f.groups) * f.out_channels * f.taps * f.in_channels * f.pack;
  if (elements == 0) return 0;
  const auto s = cudaStream_t(stream);
  const bool wide = f.in_channels % 8 == 0 && reinterpret_cast<uintptr_t>(f.w) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(f.dst) % 16 == 0;
  if (wide) {
    launch<uint4>(f, elements / 8, s);
  } else {
    launch<uint16_t>(f, elements, s);
  }
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? 0 : -int(err);
}

}  // namespace ckfmha::runtime
