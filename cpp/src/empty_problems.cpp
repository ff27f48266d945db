// Problems with a zero extent: what a run does with them, and the constant outputs it writes
// with CUDA memsets (no kernel, so none has to exist or be compiled for them).
#include "ckfmha/runtime/empty_problems.hpp"

#include "ckfmha/runtime/problem.hpp"
#include "ckfmha/runtime/status.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace ckfmha::runtime {

namespace {

int cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return CKFMHA_SUCCESS;
  cudaGetLastError();
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    return fail(CKFMHA_ERROR_NO_DEVICE, std::string(what) + ": no usable CUDA device (" +
                                            cudaGetErrorString(err) + ")");
  }
  return fail(CKFMHA_ERROR_CUDA, std::string(what) + " failed: " + cudaGetErrorName(err) + ": " +
                                     cudaGetErrorString(err));
}

struct Axis {
  int64_t extent;
  int64_t stride;  // elements
};

// The positions of a strided [batch, heads, rows] set of rows as nested axes, outermost first,
// with axes that nest evenly merged (a contiguous BHSD or BSHD tensor is one axis), so that
// the innermost axis is one 2-D memset and only the others loop.
std::vector<Axis> row_axes(int64_t const (&extent)[3], int64_t const (&stride)[3]) {
  std::vector<Axis> axes;
  for (int i = 0; i < 3; ++i) {
    if (extent[i] > 1) axes.push_back(Axis{extent[i], stride[i]});
  }
  std::stable_sort(axes.begin(), axes.end(),
                   [](Axis const& a, Axis const& b) { return a.stride > b.stride; });
  for (size_t i = axes.size(); i-- > 1;) {
    if (axes[i - 1].stride == axes[i].extent * axes[i].stride) {
      axes[i - 1] = Axis{axes[i - 1].extent * axes[i].extent, axes[i].stride};
      axes.erase(axes.begin() + long(i));
    }
  }
  if (axes.empty()) axes.push_back(Axis{1, 0});
  return axes;
}

// Sets every byte of `row_bytes`-byte rows at the positions of a strided [batch, heads, rows]
// set (element strides of `element_bytes` bytes from `base`) to `value`, on `stream`.
int memset_rows(void* base, int64_t const (&extent)[3], int64_t const (&stride)[3],
                int element_bytes, size_t row_bytes, int value, cudaStream_t stream,
                const char* name) {
  if (extent[0] == 0 || extent[1] == 0 || extent[2] == 0 || row_bytes == 0) {
    return CKFMHA_SUCCESS;
  }
  const std::vector<Axis> axes = row_axes(extent, stride);
  const Axis inner = axes.back();
  const size_t pitch = inner.extent > 1 ? size_t(inner.stride) * element_bytes : row_bytes;
  if (pitch < row_bytes) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT,
                std::string(name) + " overlaps itself: a stride of " +
                    std::to_string(inner.stride) + " elements is shorter than one row of " +
                    std::to_string(row_bytes) + " bytes");
  }
  int64_t outer = 1;
  for (size_t i = 0; i + 1 < axes.size(); ++i) outer *= axes[i].extent;
  for (int64_t n = 0; n < outer; ++n) {
    int64_t offset = 0, rest = n;
    for (size_t i = axes.size() - 1; i-- > 0;) {
      offset += (rest % axes[i].extent) * axes[i].stride;
      rest /= axes[i].extent;
    }
    char* first = static_cast<char*>(base) + offset * element_bytes;
    if (int s = cuda_status(cudaMemset2DAsync(first, pitch, value, row_bytes,
                                              size_t(inner.extent), stream),
                            "cudaMemset2DAsync")) {
      return s;
    }
  }
  return CKFMHA_SUCCESS;
}

// Sets fp32 elements at a strided [batch, heads, rows] set to `value`: one memset per byte of
// its bit pattern (every element's byte k is one 1-byte-wide, 4-byte-pitch plane).
int fill_floats(float* base, int64_t const (&extent)[3], int64_t const (&stride)[3], float value,
                cudaStream_t stream, const char* name) {
  unsigned char bytes[4];
  std::memcpy(bytes, &value, 4);
  for (int k = 0; k < 4; ++k) {
    if (int s = memset_rows(reinterpret_cast<char*>(base) + k, extent, stride, 4, 1, bytes[k],
                            stream, name)) {
      return s;
    }
  }
  return CKFMHA_SUCCESS;
}

}  // namespace

RunWork fwd_run_work(ckfmha_fwd_problem const& p) {
  if (p.batch == 0 || p.seqlen_q == 0) return RunWork::kNothing;
  // Group-mode and paged lengths come from device metadata; their seqlen_k is only a bound.
  if (p.seqlen_k == 0 && p.mode == CKFMHA_MODE_BATCH && p.kv_storage == CKFMHA_KV_CONTIGUOUS) {
    return RunWork::kFill;
  }
  return RunWork::kKernels;
}

RunWork bwd_run_work(ckfmha_bwd_problem const& p) {
  if (p.batch == 0 || (p.seqlen_q == 0 && p.seqlen_k == 0)) {
    // dsink [nhead_q] is never empty: 0 without queries.
    return p.has_sink ? RunWork::kFill : RunWork::kNothing;
  }
  if (p.seqlen_q == 0 || p.seqlen_k == 0) {
    return p.mode == CKFMHA_MODE_BATCH ? RunWork::kFill : RunWork::kKernels;
  }
  return RunWork::kKernels;
}

RunWork appendkv_run_work(ckfmha_appendkv_problem const& p) {
  const bool rotates_q = p.rotate_q && p.seqlen_q > 0;
  if (p.batch == 0 || (p.seqlen_new == 0 && !rotates_q)) return RunWork::kNothing;
  return RunWork::kKernels;
}

ckfmha_fwd_problem fwd_launch_problem(ckfmha_fwd_problem const& p) {
  ckfmha_fwd_problem launch = p;
  if (launch.seqlen_k == 0) {
    launch.seqlen_k = 1;
    launch.store_dropout_randval = 0;  // [batch, nhead_q, seqlen_q, 0]: nothing to store
  }
  return launch;
}

ckfmha_bwd_problem bwd_launch_problem(ckfmha_bwd_problem const& p) {
  ckfmha_bwd_problem launch = p;
  if (launch.seqlen_q == 0 || launch.seqlen_k == 0) {
    launch.seqlen_q = std::max(launch.seqlen_q, 1);
    launch.seqlen_k = std::max(launch.seqlen_k, 1);
    launch.store_dbias = 0;  // [batch, nhead_q, seqlen_q, seqlen_k] with a zero axis
  }
  // No sequence has queries: dsink is 0 (zero_bwd_dsink), sink need not be read.
  if (p.seqlen_q == 0) launch.has_sink = 0;
  return launch;
}

int fill_fwd_without_keys(ckfmha_fwd_problem const& p, ckfmha_fwd_args const& a,
                          ckfmha_stream_t stream) {
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  const int bytes = element_bytes(p.dtype);
  const int64_t rows[3] = {p.batch, p.nhead_q, p.seqlen_q};
  if (int status = memset_rows(a.o, rows, p.o_stride, bytes, size_t(p.hdim_v) * bytes, 0, s, "o")) {
    return status;
  }
  if (!p.store_lse) return CKFMHA_SUCCESS;
  const int64_t lse_stride[3] = {p.lse_stride[0], p.lse_stride[1], 1};
  if (!p.has_sink) return fill_floats(a.lse, rows, lse_stride, -INFINITY, s, "lse");
  // LSE = sink[h]: the values are read back first, so this call waits for the stream.
  std::vector<float> sink(size_t(p.nhead_q));
  if (int status = cuda_status(cudaMemcpyAsync(sink.data(), a.sink, sink.size() * sizeof(float),
                                               cudaMemcpyDeviceToHost, s),
                               "cudaMemcpyAsync(sink)")) {
    return status;
  }
  if (int status = cuda_status(cudaStreamSynchronize(s), "cudaStreamSynchronize")) return status;
  const int64_t head_rows[3] = {p.batch, 1, p.seqlen_q};
  for (int32_t h = 0; h < p.nhead_q; ++h) {
    if (int status = fill_floats(a.lse + h * p.lse_stride[1], head_rows, lse_stride, sink[h], s,
                                 "lse")) {
      return status;
    }
  }
  return CKFMHA_SUCCESS;
}

int zero_bwd_dsink(ckfmha_bwd_problem const& p, ckfmha_bwd_args const& a,
                   ckfmha_stream_t stream) {
  return cuda_status(cudaMemsetAsync(a.dsink, 0, size_t(p.nhead_q) * sizeof(float),
                                     reinterpret_cast<cudaStream_t>(stream)),
                     "cudaMemsetAsync(dsink)");
}

int zero_bwd_gradients(ckfmha_bwd_problem const& p, ckfmha_bwd_args const& a,
                       ckfmha_stream_t stream) {
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  if (p.has_sink) {
    if (int status = zero_bwd_dsink(p, a, stream)) return status;
  }
  if (p.batch == 0) return CKFMHA_SUCCESS;  // dsink was all there was to write
  const int bytes = element_bytes(p.dtype);
  const int64_t query_rows[3] = {p.batch, p.nhead_q, p.seqlen_q};
  const int64_t key_rows[3] = {p.batch, p.nhead_k, p.seqlen_k};
  if (int status = memset_rows(a.dq, query_rows, p.dq_stride, bytes, size_t(p.hdim_q) * bytes, 0,
                               s, "dq")) {
    return status;
  }
  if (int status = memset_rows(a.dk, key_rows, p.dk_stride, bytes, size_t(p.hdim_q) * bytes, 0,
                               s, "dk")) {
    return status;
  }
  return memset_rows(a.dv, key_rows, p.dv_stride, bytes, size_t(p.hdim_v) * bytes, 0, s, "dv");
}

}  // namespace ckfmha::runtime
