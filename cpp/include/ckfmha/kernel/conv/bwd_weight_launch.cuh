// Host-side launchers of the conv_bwd_weight instances. The runtime has
// checked the problem, the pointers and the channel vector, chosen the split
// count (the direct kernel's: its CTAs) and, where partial sums are added,
// zeroed the fp32 workspace before a launcher runs.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel/common/launch.cuh"
#include "ckfmha/kernel/conv/bwd_weight_direct_kernel.cuh"
#include "ckfmha/kernel/conv/bwd_weight_kernel.cuh"
#include "ckfmha/kernel/conv/bwd_weight_sm90_kernel.cuh"
#include "ckfmha/kernel/conv/bwd_weight_tma_kernel.cuh"
#include "ckfmha/kernel/conv/vector_weight_launch.cuh"
#include "ckfmha/kernel/conv/fwd_launch.cuh"
#include "ckfmha/kernel/params/conv_params.h"
#include "ckfmha/kernel/params/launch_context.h"
#include "ckfmha/kernel_entry.h"

#include <algorithm>
#include <cstdint>

namespace ckfmha::kernel {

// The implicit GEMM's problem: the forward's geometry with w = dw (written)
// and y = dy (read), its groups packed (conv_weight_pack).
inline ConvBwdWeightParams make_conv_bwd_weight_params(ckfmha_conv_problem const& pr,
                                                       ConvBwdWeightLaunch const& la,
                                                       bool tma = false) {
  ConvBwdWeightParams bp{};
  bp.conv = make_conv_fwd_params(
      pr, ckfmha_conv_fwd_args{la.x, la.dw, const_cast<void*>(la.dy), nullptr, 0});
  bp.accum = la.accum;
  bp.group_in_channels = bp.conv.in_channels;
  bp.group_out_channels = bp.conv.out_channels;
  bp.group_reduction = bp.conv.reduction;
  bp.pack = conv_weight_pack(bp.conv.groups, bp.conv.in_channels, bp.conv.out_channels,
                             bp.conv.reduction, bp.conv.rows, tma);
  bp.conv.groups /= bp.pack;
  bp.conv.in_channels *= bp.pack;
  bp.conv.out_channels *= bp.pack;
  bp.conv.reduction *= bp.pack;
  bp.paired_stores = bp.pack == 1 && reinterpret_cast<uintptr_t>(la.dw) % 4 == 0 &&
                             bp.conv.reduction % 2 == 0
                         ? 1
                         : 0;
  return bp;
}

// Every implicit-GEMM template's grid: CTAs over dw's (packed) tiles, the
// splits of the positions and the groups. Sets bp.tiles_per_split; where the
// runtime asks for a cluster sum (la.cluster_sum), a tile's splits form one
// cluster (rounding them up to a power of two left empty CTAs holding slots:
// a second wave on training-batch layers). False where the tiles overflow the
// grid.
template <class Traits>
bool conv_bwd_weight_grid(ConvBwdWeightParams& bp, ConvBwdWeightLaunch const& la, dim3* grid) {
  const int64_t position_tiles = (bp.conv.rows + Traits::kTileK - 1) / Traits::kTileK;
  const bool apart = la.accum != nullptr || la.cluster_sum != 0;
  const int64_t splits = apart ? std::clamp<int64_t>(la.splits, 1, 65535) : 1;
  bp.tiles_per_split = std::max<int64_t>(1, (position_tiles + splits - 1) / splits);
  const int64_t used_splits = std::max<int64_t>(
      1, (position_tiles + bp.tiles_per_split - 1) / bp.tiles_per_split);
  if (la.cluster_sum != 0) {
    if (splits > kConvMaxClusterSplits || bp.conv.groups > 65535) return false;
    bp.cluster_sum = used_splits > 1 ? 1 : 0;
  }
  const int64_t tiles_m = (bp.conv.out_channels + Traits::kTileM - 1) / Traits::kTileM;
  const int64_t tiles_n = (int64_t(bp.conv.reduction) + Traits::kTileN - 1) / Traits::kTileN;
  if (tiles_m * tiles_n > 0x7fffffff) return false;
  *grid = dim3(unsigned(tiles_m * tiles_n), unsigned(used_splits),
               unsigned(std::min(bp.conv.groups, 65535)));
  return true;
}

// An implicit-GEMM launch. The sm_90 templates may sum a tile's splits in a
// cluster (bp.cluster_sum), each CTA then holding `cluster_smem` bytes: the
// gathering wgmma kernel's partial tile beside its stages
// (conv_weight_cluster_sum), the TMA kernel's slots within its stages.
template <class Traits, bool kClusterSum, class Params>
int launch_weight_gemm(void (*kernel)(Params), dim3 grid, ConvBwdWeightParams const& bp,
                       ckfmha_stream_t stream, Params const& params, int cluster_smem) {
  if (!bp.cluster_sum) {
    return launch_kernel(kernel, grid, Traits::kThreads, Traits::kSmemLaunchBytes, stream,
                         params);
  }
  if (!kClusterSum) return -int(cudaErrorInvalidValue);
  cudaFuncAttributes attributes{};
  if (cudaError_t err = cudaFuncGetAttributes(&attributes, kernel); err != cudaSuccess) {
    return -int(err);
  }
  if (attributes.binaryVersion < 90) return -int(cudaErrorInvalidValue);
  return launch_kernel_cluster(kernel, grid, dim3(1, grid.y, 1), Traits::kThreads, cluster_smem,
                               stream, params);
}

// Either gathering template.
template <class Traits, bool kClusterSum>
int launch_conv_bwd_weight_gemm(void (*kernel)(ConvBwdWeightGemmParams), void const* problem,
                                void const* args, ckfmha_stream_t stream) {
  auto const& pr = *static_cast<ckfmha_conv_problem const*>(problem);
  auto const& la = *static_cast<ConvBwdWeightLaunch const*>(args);
  ConvBwdWeightParams bp = make_conv_bwd_weight_params(pr, la);
  dim3 grid;
  if (!conv_bwd_weight_grid<Traits>(bp, la, &grid)) return -int(cudaErrorInvalidConfiguration);
  const int cluster_smem =
      std::max(Traits::kSmemLaunchBytes, int(Traits::kTileM * Traits::kTileN * sizeof(float)));
  return launch_weight_gemm<Traits, kClusterSum>(
      kernel, grid, bp, stream,
      ConvBwdWeightGemmParams{bp, PositionDecoder(bp.conv), PackedWeightDivisors(bp)},
      cluster_smem);
}

template <class Traits>
int launch_conv_bwd_weight_sm80(void const* problem, void const* args,
                                ckfmha_launch_context const* context, ckfmha_stream_t stream) {
  (void)context;  // no device metadata is read
  return launch_conv_bwd_weight_gemm<Traits, false>(&conv_bwd_weight_sm80_kernel<Traits>,
                                                    problem, args, stream);
}

template <class Traits>
int launch_conv_bwd_weight_sm90(void const* problem, void const* args,
                                ckfmha_launch_context const* context, ckfmha_stream_t stream) {
  (void)context;
  return launch_conv_bwd_weight_gemm<Traits, true>(&conv_bwd_weight_sm90_kernel<Traits>,
                                                   problem, args, stream);
}

// The template fed by the copy engine: x's map walks the forward's output
// grid as the forward's does, dy's walks dy itself (a 1x1 filter, stride 1,
// no padding), or either is a plain (channels, positions) matrix where its
// positions lie one stride apart (ConvBwdWeightTmaParams). The runtime has
// checked conv_weight_tma_limit.
template <class Traits>
int launch_conv_bwd_weight_tma(void const* problem, void const* args,
                               ckfmha_launch_context const* context, ckfmha_stream_t stream) {
  (void)context;
  using Element = typename Traits::Element;
  auto const& pr = *static_cast<ckfmha_conv_problem const*>(problem);
  auto const& la = *static_cast<ConvBwdWeightLaunch const*>(args);
  ConvBwdWeightTmaParams params{};
  params.weight = make_conv_bwd_weight_params(pr, la, /*tma=*/true);
  ConvBwdWeightParams& bp = params.weight;
  ConvFwdParams const& p = bp.conv;
  dim3 grid;
  if (!conv_bwd_weight_grid<Traits>(bp, la, &grid)) return -int(cudaErrorInvalidConfiguration);
  params.positions = PositionDecoder(p);
  params.packed = PackedWeightDivisors(bp);
  constexpr CUtensorMapSwizzle kSwizzle = CU_TENSOR_MAP_SWIZZLE_128B;
  const int64_t x_channels = int64_t(p.groups) * p.in_channels;
  const int64_t dy_channels = int64_t(p.groups) * p.out_channels;
  bool pointwise = true;
  for (int d = 0; d < 3; ++d) {
    pointwise = pointwise && p.filter[d] == 1 && p.stride[d] == 1 && p.padding[d] == 0;
  }
  const int64_t x_step = pointwise ? uniform_position_stride(p.x_stride, p.input, p.batch) : 0;
  const int64_t dy_step = uniform_position_stride(p.y_stride, p.output, p.batch);
  params.x_rows = x_step > 0 ? 1 : 0;
  params.dy_rows = dy_step > 0 ? 1 : 0;
  int err = x_step > 0
                ? encode_conv_rows_map<Element>(&params.x_map, p.x, x_channels, p.rows, x_step,
                                                Traits::kChunk, Traits::kTileK, kSwizzle)
                : encode_conv_im2col_map<Element>(
                      &params.x_map, p.x, Traits::kSpatialDims, x_channels, p.batch, p.x_stride,
                      p.input, p.output, p.stride, p.padding, Traits::kChunk, Traits::kTileK,
                      kSwizzle);
  if (err != 0) return err;
  const int32_t unit[3] = {1, 1, 1};
  const int32_t none[3] = {0, 0, 0};
  err = dy_step > 0
            ? encode_conv_rows_map<Element>(&params.dy_map, p.y, dy_channels, p.rows, dy_step,
                                            Traits::kChunk, Traits::kTileK, kSwizzle)
            : encode_conv_im2col_map<Element>(&params.dy_map, p.y, Traits::kSpatialDims,
                                              dy_channels, p.batch, p.y_stride, p.output,
                                              p.output, unit, none, Traits::kChunk,
                                              Traits::kTileK, kSwizzle);
  if (err != 0) return err;
  if (!bp.cluster_sum) {
    return launch_kernel(&conv_bwd_weight_tma_kernel<Traits, false>, grid, Traits::kThreads,
                         Traits::kSmemLaunchBytes, stream, params);
  }
  if (conv_split_scratch_bytes(Traits::kTileM, Traits::kTileN, grid.y) > Traits::kSmemBytes) {
    return -int(cudaErrorInvalidConfiguration);
  }
  int sms = 0;
  if (int err = current_device_sms(&sms)) return err;
  // One CTA an SM where they fit (the runtime's rule keeps a cluster plan's
  // CTAs within the SMs' cluster capacity at one an SM).
  const int64_t ctas = int64_t(grid.x) * grid.y * grid.z;
  return launch_weight_gemm<Traits, true>(
      &conv_bwd_weight_tma_kernel<Traits, true>, grid, bp, stream, params,
      conv_detail::conv_cluster_spread_smem(Traits::kSmemLaunchBytes, ctas, sms));
}

// Groups of up to 8 channels on the CUDA cores: `splits` CTAs per block of
// 32 groups take the (image, output tile) items in turn and add their sums
// into the fp32 workspace, which must be given. Where its vectors fit
// (conv_vector_weight_path), the vector path runs instead, sizes its own grid
// and on small problems stores dw without the workspace: the one-channel instance
// for one-channel groups, the 2- and 4-channel ones for groups of 2 or 4
// channels (as many in as out) that they hold, the 8-channel one for groups
// of 8 (each vector kernel instantiated costs its instance's compile time).
// Shared memory depends on the problem; the runtime checks it fits before
// choosing the kernel.
template <class Traits>
int launch_conv_bwd_weight_direct(void const* problem, void const* args,
                                  ckfmha_launch_context const* context, ckfmha_stream_t stream) {
  (void)context;
  auto const& pr = *static_cast<ckfmha_conv_problem const*>(problem);
  auto const& la = *static_cast<ConvBwdWeightLaunch const*>(args);
  ConvBwdWeightParams bp{};
  bp.conv = make_conv_fwd_params(
      pr, ckfmha_conv_fwd_args{la.x, la.dw, const_cast<void*>(la.dy), nullptr, 0});
  bp.accum = la.accum;
  using Element = typename Traits::Element;
  switch (conv_vector_weight_path(Traits::kMaxChannels, bp.conv)) {
    case 1:
      if constexpr (Traits::kMaxChannels == 1) {
        return launch_conv_bwd_weight_vector<Element, 1>(bp.conv, la.accum, stream);
      }
      break;
    case 2:
      if constexpr (Traits::kMaxChannels == 2 || Traits::kMaxChannels == 4) {
        return launch_conv_bwd_weight_vector<Element, 2>(bp.conv, la.accum, stream);
      }
      break;
    case 4:
      if constexpr (Traits::kMaxChannels == 4) {
        return launch_conv_bwd_weight_vector<Element, 4>(bp.conv, la.accum, stream);
      }
      break;
    case 8:
      if constexpr (Traits::kMaxChannels == 8) {
        return launch_conv_bwd_weight_vector<Element, 8>(bp.conv, la.accum, stream);
      }
      break;
    default:
      break;
  }
  if (la.accum == nullptr) return -int(cudaErrorInvalidValue);
  const int64_t smem = conv_detail::bwd_weight_direct_bytes<Traits>(bp.conv);
  if (smem > 227 * 1024) return -int(cudaErrorInvalidConfiguration);
  const int64_t tiles = int64_t((bp.conv.output[2] + Traits::kTileW - 1) / Traits::kTileW) *
                        ((bp.conv.output[1] + Traits::kTileH - 1) / Traits::kTileH) *
                        bp.conv.output[0];
  const int64_t items = tiles * bp.conv.batch;
  const int64_t group_blocks = (bp.conv.groups + Traits::kGroups - 1) / Traits::kGroups;
  if (group_blocks > 65535) return -int(cudaErrorInvalidConfiguration);
  const int64_t workers = std::clamp<int64_t>(la.splits, 1, std::min<int64_t>(items, 0x7fffffff));
  dim3 grid(unsigned(workers), unsigned(group_blocks), 1);
  return launch_kernel(&conv_bwd_weight_direct_kernel<Traits>, grid, Traits::kThreads, int(smem),
                       stream, bp);
}

}  // namespace ckfmha::kernel
