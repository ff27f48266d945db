// Grouped convolution: problem checks, the channel vector, and the choice of a
// tile by the implicit GEMM's shape.
#include "ckfmha/runtime/conv_plan.hpp"

#include "ckfmha/kernel/params/conv_params.h"
#include "ckfmha/kernel/params/conv_params_from_problem.h"
#include "ckfmha/kernel/params/conv_vector_weight_layout.h"
#include "ckfmha/runtime/conv_selection.hpp"
#include "ckfmha/runtime/dispatcher.hpp"
#include "ckfmha/runtime/learned_conv_plan.hpp"
#include "ckfmha/runtime/problem.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <tuple>

namespace ckfmha::runtime {

namespace {

constexpr const char* kDimNames[2][3] = {{"h", "w", ""}, {"d", "h", "w"}};

const char* dim_name(ckfmha_conv_problem const& p, int i) {
  return kDimNames[p.spatial_dims == 3 ? 1 : 0][i];
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The family whose kernels run a direction: backward-data's phases are
// forward convolutions of dy.
ckfmha_family family_of(ckfmha_conv_direction direction) {
  return direction == CKFMHA_CONV_BWD_WEIGHT ? CKFMHA_FAMILY_CONV_BWD_WEIGHT
                                              : CKFMHA_FAMILY_CONV_FWD;
}

bool is_weight(ckfmha_conv_direction direction) {
  return direction == CKFMHA_CONV_BWD_WEIGHT;
}

std::string join_dims(ckfmha_conv_problem const& p, int32_t const (&values)[3]) {
  std::ostringstream out;
  for (int i = 0; i < p.spatial_dims; ++i) out << (i ? "x" : "") << values[i];
  return out.str();
}

}  // namespace

const char* conv_direction_name(ckfmha_conv_direction direction) {
  switch (direction) {
    case CKFMHA_CONV_FWD: return "forward";
    case CKFMHA_CONV_BWD_DATA: return "backward-data";
    case CKFMHA_CONV_BWD_WEIGHT: return "backward-weight";
  }
  return "unknown";
}

std::string check_conv_direction(ckfmha_conv_direction direction) {
  if (direction == CKFMHA_CONV_FWD || direction == CKFMHA_CONV_BWD_DATA ||
      direction == CKFMHA_CONV_BWD_WEIGHT) {
    return {};
  }
  return "convolution direction " + std::to_string(int(direction)) +
         " is not supported; supported: forward (0), backward-data (1), backward-weight (2)";
}

std::string check_conv_problem(ckfmha_conv_problem const& p) {
  std::ostringstream msg;
  if (p.dtype != CKFMHA_DTYPE_FP16 && p.dtype != CKFMHA_DTYPE_BF16) {
    msg << "dtype " << dtype_name(p.dtype) << " is not supported for convolution; supported: "
        << "fp16, bf16 (fp32 accumulation)";
  } else if (p.spatial_dims != 2 && p.spatial_dims != 3) {
    msg << "spatial_dims " << p.spatial_dims << " is not supported; supported: 2 (NHWGC) and 3 "
        << "(NDHWGC)";
  } else if (p.batch < 0) {
    msg << "batch is " << p.batch << "; it must be >= 0";
  } else if (p.groups < 1 || p.in_channels < 1 || p.out_channels < 1) {
    msg << "groups, in_channels and out_channels (per group) must be >= 1; got " << p.groups
        << ", " << p.in_channels << ", " << p.out_channels;
  }
  if (!msg.str().empty()) return msg.str();
  int64_t taps = 1;
  for (int i = 0; i < p.spatial_dims; ++i) {
    const char* d = dim_name(p, i);
    if (p.input[i] < 1 || p.filter[i] < 1 || p.stride[i] < 1 || p.dilation[i] < 1 ||
        p.padding[i] < 0) {
      msg << "dim " << d << ": input " << p.input[i] << ", filter " << p.filter[i] << ", stride "
          << p.stride[i] << ", dilation " << p.dilation[i] << ", padding " << p.padding[i]
          << "; input, filter, stride and dilation must be >= 1 and padding >= 0";
      return msg.str();
    }
    const int64_t span = int64_t(p.dilation[i]) * (p.filter[i] - 1) + 1;
    const int64_t padded = int64_t(p.input[i]) + 2 * int64_t(p.padding[i]);
    if (padded < span) {
      msg << "dim " << d << ": the filter spans " << span << " positions (filter " << p.filter[i]
          << ", dilation " << p.dilation[i] << ") but the padded input has " << padded
          << " (input " << p.input[i] << " + 2 x padding " << p.padding[i]
          << "): the output would be empty";
      return msg.str();
    }
    const int64_t output = (padded - span) / p.stride[i] + 1;
    if (p.output[i] != output) {
      msg << "dim " << d << ": output is " << p.output[i] << " but input " << p.input[i]
          << ", filter " << p.filter[i] << ", stride " << p.stride[i] << ", padding "
          << p.padding[i] << " and dilation " << p.dilation[i] << " give " << output;
      return msg.str();
    }
    taps *= p.filter[i];
  }
  if (taps * p.in_channels > std::numeric_limits<int32_t>::max()) {
    msg << "filter taps x in_channels = " << taps * p.in_channels
        << " exceeds 2^31 - 1, the reduction length the kernels index";
    return msg.str();
  }
  for (int i = 0; i <= p.spatial_dims; ++i) {
    if (p.x_stride[i] < 0 || p.y_stride[i] < 1) {
      msg << (i == 0 ? std::string("batch") : std::string("dim ") + dim_name(p, i - 1))
          << " strides: x " << p.x_stride[i] << ", y " << p.y_stride[i]
          << "; x strides must be >= 0 and y strides >= 1";
      return msg.str();
    }
  }
  return {};
}

int64_t conv_output_rows(ckfmha_conv_problem const& p) {
  int64_t rows = p.batch;
  for (int i = 0; i < p.spatial_dims; ++i) rows *= p.output[i];
  return rows;
}

int64_t conv_filter_taps(ckfmha_conv_problem const& p) {
  int64_t taps = 1;
  for (int i = 0; i < p.spatial_dims; ++i) taps *= p.filter[i];
  return taps;
}

std::string describe(ckfmha_conv_problem const& p) {
  std::ostringstream out;
  out << "conv " << p.spatial_dims << "d " << dtype_name(p.dtype) << " batch=" << p.batch
      << " input=" << join_dims(p, p.input) << " groups=" << p.groups << " C=" << p.in_channels
      << " K=" << p.out_channels << " filter=" << join_dims(p, p.filter)
      << " stride=" << join_dims(p, p.stride) << " padding=" << join_dims(p, p.padding)
      << " dilation=" << join_dims(p, p.dilation) << " output=" << join_dims(p, p.output);
  return out.str();
}

int32_t widest_conv_vector(int64_t channels, int64_t const* strides, int count, const void* a,
                           const void* b) {
  const int64_t element_bytes = 2;
  for (int32_t v : {8, 4, 2}) {
    bool ok = channels % v == 0;
    for (int i = 0; ok && i < count; ++i) ok = strides[i] % v == 0;
    const auto bytes = uintptr_t(v * element_bytes);
    ok = ok && reinterpret_cast<uintptr_t>(a) % bytes == 0 &&
         reinterpret_cast<uintptr_t>(b) % bytes == 0;
    if (ok) return v;
  }
  return 1;
}

namespace {

// The layout of the direct backward-weight kernel `k`'s vector path for the
// problem (kernel::conv_vector_weight_layout), or none where `k` is no such
// kernel or x and dy (null: as if aligned) leave the problem to its lane path.
std::optional<kernel::ConvVectorWeightLayout> vector_weight_layout(
    ckfmha_kernel_entry const& k, ckfmha_conv_problem const& p, const void* x, const void* dy,
    int sm_count) {
  if (k.family != CKFMHA_FAMILY_CONV_BWD_WEIGHT || k.conv_max_channels == 0) return std::nullopt;
  const kernel::ConvFwdParams conv = kernel::make_conv_fwd_params(
      p, ckfmha_conv_fwd_args{x, nullptr, const_cast<void*>(dy), nullptr, 0});
  const int32_t channels = kernel::conv_vector_weight_path(k.conv_max_channels, conv);
  if (channels == 0) return std::nullopt;
  return kernel::conv_vector_weight_layout(channels, conv, sm_count, k.arch >= 90);
}

}  // namespace

int32_t conv_weight_direct_cluster(ckfmha_kernel_entry const& k, ckfmha_conv_problem const& p,
                                   const void* x, const void* dy, int sm_count) {
  const auto layout = vector_weight_layout(k, p, x, dy, sm_count);
  return layout && layout->stores_dw ? int32_t(layout->grid[0]) : 0;
}

std::string conv_weight_vector_shape(ckfmha_kernel_entry const& k, ckfmha_conv_problem const& p,
                                     int sm_count) {
  const auto l = vector_weight_layout(k, p, nullptr, nullptr, sm_count);
  if (!l) return "";
  std::ostringstream out;
  out << "runs of " << l->run << " positions along w, "
      << l->vectors_per_cta * kernel::conv_vector_weight_channels(p.in_channels, l->cols)
      << " channels a CTA, " << l->grid[0] << (l->grid[0] == 1 ? " CTA" : " CTAs")
      << " a block of dw";
  return out.str();
}

int32_t conv_vector_allowed(ckfmha_conv_problem const& p, const void* x, const void* w) {
  return widest_conv_vector(p.in_channels, p.x_stride, p.spatial_dims + 1, x, w);
}

namespace {

// Shared memory per block each arch grants (arch_specs.json's
// max_dynamic_smem_per_block).
int64_t max_smem_per_block(int arch) {
  switch (arch) {
    case 80: return 166912;
    case 86:
    case 89: return 101376;
    default: return arch >= 90 ? 232448 : 101376;
  }
}

// What a direct kernel (conv/direct_kernel.cuh, direct_tile) stages for a
// problem: the input tile its outputs read, in the input's dtype, and its 32
// groups' filters in fp32. The tile: warps output rows of `tile_m` positions.
int64_t direct_smem_bytes(ckfmha_kernel_entry const& k, ckfmha_conv_problem const& p) {
  const int skip = 3 - p.spatial_dims;
  auto dim = [&](int32_t const (&values)[3], int axis, int32_t fallback) {
    return axis >= skip ? int64_t(values[axis - skip]) : int64_t(fallback);
  };
  const int64_t tile_out[3] = {1, k.warps, k.tile_m};
  int64_t positions = 1, taps = 1;
  for (int axis = 0; axis < 3; ++axis) {
    const int64_t filter = dim(p.filter, axis, 1);
    positions *= (tile_out[axis] - 1) * dim(p.stride, axis, 1) +
                 (filter - 1) * dim(p.dilation, axis, 1) + 1;
    taps *= filter;
  }
  const int64_t groups = k.tile_n;
  const int64_t x_bytes = (positions * groups * p.in_channels * 2 + 15) / 16 * 16;
  // The backward-weight kernel keeps its partial dw where the forward keeps
  // the filters (bwd_weight_direct_kernel.cuh): as many fp32 words.
  return x_bytes + groups * p.out_channels * taps * p.in_channels * 4;
}

bool is_direct(ckfmha_kernel_entry const& k) { return k.conv_max_channels != 0; }

// Why the backward-weight vector path cannot take the problem's geometry
// (kernel::conv_vector_weight_limit), or null.
const char* vector_weight_limit(ckfmha_conv_problem const& p) {
  const int w = p.spatial_dims - 1;
  return kernel::conv_vector_weight_limit(p.groups, p.in_channels, p.out_channels,
                                          conv_filter_taps(p), p.filter[w], p.stride[w],
                                          p.dilation[w]);
}

// Why the forward's vector path cannot take the problem's geometry
// (kernel::conv_vector_fwd_limit), or null.
const char* vector_fwd_limit(ckfmha_conv_problem const& p) {
  const int w = p.spatial_dims - 1;
  return kernel::conv_vector_fwd_limit(p.groups, p.in_channels, p.out_channels,
                                       conv_filter_taps(p), p.filter[w], p.stride[w],
                                       p.dilation[w]);
}

// Which path a direct kernel of `bucket` channels takes (fwd_launch.cuh,
// bwd_weight_launch.cuh): several channels a vector load where the geometry
// and tensors allow (for one-channel groups the depthwise path; groups of 1
// on the one-channel instance, of 2 or 4 on the 2- and 4-channel ones, and
// for the weight gradient of 8 on the 8-channel one), else one group a lane.
std::string direct_path(ckfmha_conv_problem const& p, ckfmha_conv_direction direction,
                        int32_t bucket) {
  const char* lane = "32 groups a CTA, one a lane";
  const bool weight = is_weight(direction);
  const char* limit = weight ? vector_weight_limit(p) : vector_fwd_limit(p);
  // Each instance runs the vector path for its own groups only.
  const bool own = bucket == 1   ? p.in_channels == 1
                   : bucket == 8 ? p.in_channels == 8
                                 : p.in_channels == 2 || p.in_channels == 4;
  if (limit == nullptr && !own) {
    limit = bucket == 8 ? "groups of 8 channels on this instance"
                        : "the one-channel instance for one-channel groups";
  }
  const char* path = bucket == 1 ? "depthwise" : "vector";
  if (limit != nullptr) {
    return std::string(lane) + " (the " + path + " path's vectors need " + limit + ")";
  }
  // The forward loads eight channels at once; the weight gradient's sums
  // leave room for four in groups of 2 and 4 and in whole rows wider than 3
  // of one-channel groups (conv_vector_weight_channels).
  const int32_t channels =
      weight ? kernel::conv_vector_weight_load_channels(p.in_channels,
                                                        p.filter[p.spatial_dims - 1])
             : 8;
  const char* load = p.in_channels == 1 ? (channels == 4 ? "4 groups an 8-byte load"
                                                         : "8 groups a 16-byte load")
                     : p.in_channels == 2
                         ? (weight ? "2 groups of 2 channels an 8-byte load"
                                   : "4 groups of 2 channels a 16-byte load")
                     : p.in_channels == 4
                         ? (weight ? "a group of 4 channels an 8-byte load"
                                   : "2 groups of 4 channels a 16-byte load")
                         : "a group of 8 channels a 16-byte load";
  std::ostringstream out;
  out << load << " (the " << path << " path) where x and " << (weight ? "dy" : "y") << " are "
      << 2 * channels << "-byte aligned with strides in multiples of " << channels
      << " elements, else " << lane;
  return out.str();
}

int32_t weight_pack(ckfmha_conv_problem const& p, ckfmha_kernel_entry const& k);

// Why a TMA kernel cannot take this problem (kernel::conv_tma_limit, or for
// backward-weight kernel::conv_weight_tma_limit), or null. The tensor maps
// also take x's (and backward-weight's dy's) strides in bytes below 2^40.
const char* tma_limit(ckfmha_kernel_entry const& k, ckfmha_conv_problem const& p) {
  const bool weight = k.family == CKFMHA_FAMILY_CONV_BWD_WEIGHT;
  for (int i = 0; i <= p.spatial_dims; ++i) {
    if (p.x_stride[i] >= (int64_t(1) << 39)) return "x's strides must be below 2^40 bytes";
    if (weight && p.y_stride[i] >= (int64_t(1) << 39)) {
      return "dy's strides must be below 2^40 bytes";
    }
  }
  if (weight) {
    return kernel::conv_weight_tma_limit(p.spatial_dims, p.groups, p.in_channels,
                                         p.out_channels, weight_pack(p, k), p.input, p.output,
                                         p.filter, p.stride, p.padding, p.dilation);
  }
  return kernel::conv_tma_limit(p.spatial_dims, p.groups, p.in_channels, k.tile_k, p.input,
                                p.output, p.filter, p.stride, p.padding, p.dilation);
}

// Whether a direct backward-weight kernel surely runs the problem on its
// vector path (bwd_weight_launch.cuh), which keeps its sums in registers and
// stages nothing: groups of 4 on the 4-channel instance or of 8 on the
// 8-channel one, the geometry allows it and context.vector says x and dy are
// whole vectors of a group (the plan cannot tell for groups of 1 and 2, whose
// vectors span several groups). The dispatcher gives the 8-channel instance
// only such problems: its lane path is slower than the implicit GEMM (NOTES
// 108); a caller may still force it.
bool sure_weight_vector_path(ckfmha_kernel_entry const& k, ckfmha_conv_problem const& p,
                             ckfmha_conv_direction direction, ConvPlanContext const& context) {
  return is_weight(direction) && is_direct(k) &&
         (k.conv_max_channels == 8 ? p.in_channels == 8
                                   : k.conv_max_channels == 4 && p.in_channels == 4) &&
         context.vector >= p.in_channels && vector_weight_limit(p) == nullptr;
}

// The dispatcher gives the 8-channel direct instance reductions over at least
// this many output positions: fewer leave its threads a run or less to sum
// before their reduction (ResNeXt's 28x28 groups of 8 at batch 1, 784
// positions: 0.57x the implicit GEMM's speed; 8x28x28 at batch 1, 6272
// positions: 1.6x; NOTES 116).
constexpr int64_t kEightChannelMinPositions = 4096;

// reject_reason's verdict without its text: the selection walks the whole
// registry (attention kernels included) on every call.
bool fits(ckfmha_kernel_entry const& k, ckfmha_conv_problem const& p,
          ckfmha_conv_direction direction, ConvPlanContext const& context) {
  return k.family == family_of(direction) && k.dtype == p.dtype &&
         k.conv_spatial_dims == p.spatial_dims && k.conv_vector <= context.vector &&
         arch_runs_on(k, context.device_arch) &&
         (!is_conv_tma(k) || tma_limit(k, p) == nullptr) &&
         (!is_direct(k) ||
          (p.in_channels <= k.conv_max_channels && p.out_channels <= k.conv_max_channels &&
           (k.conv_max_channels > 4
                ? sure_weight_vector_path(k, p, direction, context) &&
                      conv_output_rows(p) >= kEightChannelMinPositions
                : sure_weight_vector_path(k, p, direction, context) ||
                      direct_smem_bytes(k, p) <= max_smem_per_block(context.device_arch)) &&
           (!is_weight(direction) || context.can_split)));
}

// Why a kernel does not fit. `forced`: the kernel was named by the caller,
// who may run the 8-channel direct kernel on its lane path (slow, but right).
std::string reject_reason(ckfmha_kernel_entry const& k, ckfmha_conv_problem const& p,
                          ckfmha_conv_direction direction, ConvPlanContext const& context,
                          bool forced = false) {
  std::ostringstream why;
  const ckfmha_family family = family_of(direction);
  if (k.family != family) {
    why << "family " << family_name(k.family) << ", problem needs " << family_name(family);
  } else if (!arch_runs_on(k, context.device_arch)) {
    why << "built for " << k.arch_name << ", which does not run on sm_" << context.device_arch;
  } else if (k.dtype != p.dtype) {
    why << "dtype " << dtype_name(k.dtype) << ", problem is " << dtype_name(p.dtype);
  } else if (k.conv_spatial_dims != p.spatial_dims) {
    why << k.conv_spatial_dims << " spatial dims, problem has " << p.spatial_dims;
  } else if (k.conv_vector > context.vector) {
    why << "loads " << k.conv_vector << " channels at once, but in_channels " << p.in_channels
        << ", the x strides or the pointers allow " << context.vector;
  } else if (k.conv_max_channels != 0 &&
             (p.in_channels > k.conv_max_channels || p.out_channels > k.conv_max_channels)) {
    why << "computes groups of at most " << k.conv_max_channels
        << " input and output channels, problem has " << p.in_channels << " and "
        << p.out_channels;
  } else if (k.conv_max_channels > 4 && !forced &&
             !sure_weight_vector_path(k, p, direction, context)) {
    // Only the weight gradient has direct kernels of 8 channels.
    const char* limit = vector_weight_limit(p);
    why << "runs only what its vector path takes (its lane path is slower than the implicit "
           "GEMM), which needs ";
    if (p.in_channels != 8) {
      why << "groups of 8 channels, as many in as out";
    } else if (limit != nullptr) {
      why << limit;
    } else {
      why << "x and dy as 16-byte vectors of a group, where the strides or the pointers allow "
          << context.vector << " channels";
    }
  } else if (k.conv_max_channels > 4 && !forced &&
             conv_output_rows(p) < kEightChannelMinPositions) {
    why << "takes reductions over at least " << kEightChannelMinPositions
        << " output positions (fewer leave its threads a run or less to sum), problem has "
        << conv_output_rows(p);
  } else if (k.conv_max_channels != 0 && !sure_weight_vector_path(k, p, direction, context) &&
             direct_smem_bytes(k, p) > max_smem_per_block(context.device_arch)) {
    why << "stages " << direct_smem_bytes(k, p) << " bytes of input tile and "
        << (is_weight(direction) ? "partial sums" : "filters")
        << " for this stride, dilation and filter, over sm_" << context.device_arch << "'s "
        << max_smem_per_block(context.device_arch) << " per block";
  } else if (is_conv_tma(k) && tma_limit(k, p) != nullptr) {
    why << "loads by the tensor-copy engine's im2col mode, which cannot take this problem: "
        << tma_limit(k, p) << " (in_channels " << p.in_channels;
    if (is_weight(direction)) {
      why << ", groups multiplied as one " << weight_pack(p, k) << ")";
    } else {
      why << ", tile_k " << k.tile_k << ")";
    }
  } else if (is_direct(k) && is_weight(direction) && !context.can_split) {
    why << "adds its sums into the fp32 workspace, and none was given";
  }
  return why.str();
}

// The groups backward-weight's implicit-GEMM kernels multiply as one.
int32_t weight_pack(ckfmha_conv_problem const& p, ckfmha_kernel_entry const& k) {
  return kernel::conv_weight_pack(p.groups, p.in_channels, p.out_channels,
                                  conv_filter_taps(p) * p.in_channels, conv_output_rows(p),
                                  is_conv_tma(k));
}

// CTAs of a kernel an SM runs at once. The wgmma kernels are built for two
// where their shared memory fits and their vectors are 4 or 8 channels
// (ConvFwdSm90Traits::kMinCtasPerSm); the
// mma.sync ones hold one or two 128x128 tiles and more of smaller ones.
int64_t resident_ctas(ckfmha_kernel_entry const& k) {
  if (is_conv_gather_wgmma(k)) {
    const int64_t smem = int64_t(k.stages) * (k.tile_m + k.tile_n) * k.tile_k * 2 +
                         int64_t(k.tile_m) * 32;  // + the row table, 32 bytes a row
    return 2 * smem <= 220 * 1024 && k.conv_vector >= 4 ? 2 : 1;
  }
  return std::clamp<int64_t>((2 * 128 * 128) / (int64_t(k.tile_m) * k.tile_n), 1, 4);
}

// Relative time of the implicit GEMM on a kernel's tile: waves of CTAs times
// one wave's time. A CTA's time per reduction step is the larger of its
// products (tile_m x tile_n) and its loads (64 x (tile_m + tile_n), equal at
// 128x128): the kernels wait on their gathers (ncu on an H100: 62% of cycles
// with no warp eligible at 28x28x128, 3x3), so a narrow tile saves loads in
// proportion to its width, not its area (NOTES 107). CTAs sharing an SM share
// its time. Padding shows up as extra CTAs, a last wave's idle SMs as a whole
// wave. Over several waves, CTAs that share an SM hide each other's prologue
// and epilogue (10% measured at 28x28x128, 3x3).
struct TileCost {
  double cost;
  double fill;  // useful / computed products
  int64_t ctas;
  int32_t splits = 1;  // of the reduction (backward-weight; the TMA forward's clusters)
};

// The TMA forward's time for `ctas` tiles. The copy engine's loads take no
// issue slots, but wgmma reads both operands from shared memory, each
// consumer warpgroup its own rows of x and all of w's: a narrow tile still
// pays for its operand rows, less than a gathering one (48 against 64 a row;
// forced on the suite's dense layers, 128x64 lost to 128x128 where both ran
// one wave, NOTES 112). Persistent CTAs walk the tiles: the busiest SM takes
// ceil(ctas / SMs) of them, whether one CTA or two hold them (fewer tiles than
// SMs run one an SM). Where SMs take several, a tile of one consumer
// warpgroup is slower than its products say (64x128 against 256x128 at
// ResNet-18's 28x28 layer, batch 32: 14% slower, NOTES 112): 1.3. Few tiles
// split their `reduction` columns over `splits` CTAs (kernel::
// conv_fwd_tma_splits), each taking 1/splits of them plus the split sum's
// time, that of 256 columns (4 steps of 64): ResNet-18's 7x7x512 layer at
// batch 32 ran 18.2 us on 64x128 tiles unsplit and 25.9 on 256x128 tiles in 4
// splits, which without that cost would have modelled faster.
double tma_tile_time(ckfmha_kernel_entry const& k, int64_t ctas, int32_t splits,
                     int64_t reduction, int sm_count) {
  const int64_t consumers = std::max(k.warps / 4 - 1, 1);
  const double step = std::max(double(k.tile_m) * k.tile_n,
                               48.0 * double(k.tile_m + consumers * k.tile_n));
  const int64_t per_sm = ceil_div(ctas * splits, std::max(sm_count, 1));
  const double lone = consumers < 2 && per_sm > 1 ? 1.3 : 1.0;
  const double share =
      1.0 / splits + (splits > 1 ? 256.0 / double(std::max<int64_t>(reduction, 1)) : 0.0);
  return double(per_sm) * step * lone * share;
}

// split_sms: the SMs the TMA forward's split counts on (fewer than sm_count
// beside concurrent convolutions).
TileCost tile_cost(ckfmha_kernel_entry const& k, ckfmha_conv_problem const& p, int sm_count,
                   int split_sms) {
  const int64_t rows = conv_output_rows(p);
  const int64_t tiles_m = ceil_div(rows, k.tile_m);
  const int64_t tiles_n = ceil_div(p.out_channels, k.tile_n);
  const int64_t ctas = tiles_m * tiles_n * p.groups;
  const double computed = double(tiles_m * k.tile_m) * double(tiles_n * k.tile_n);
  const double useful = double(rows) * double(p.out_channels);
  if (is_conv_tma(k)) {
    const int64_t reduction = conv_filter_taps(p) * p.in_channels;
    const int32_t splits = kernel::conv_fwd_tma_splits(ctas, reduction, split_sms);
    return {tma_tile_time(k, ctas, splits, reduction, sm_count), useful / computed, ctas, splits};
  }
  const int64_t resident = resident_ctas(k);
  const int64_t slots = std::max<int64_t>(1, int64_t(sm_count) * resident);
  const int64_t waves = ceil_div(ctas, slots);
  const double overlap = resident > 1 && waves > 1 ? 0.9 : 1.0;
  const double step = std::max(double(k.tile_m) * k.tile_n, 64.0 * (k.tile_m + k.tile_n));
  // One wave of fewer CTAs than the SMs hold shares an SM among only
  // ceil(ctas / SMs) of them: ResNeXt's batch-1 groups of 16 (64 CTAs) ran
  // 1.2-1.6x faster on 128x16 tiles than on 128x128, which the SMs' full
  // share of two 128x16 CTAs had modelled slower (NOTES 130).
  const int64_t sharing =
      waves == 1 ? std::min(resident, ceil_div(ctas, std::max(sm_count, 1))) : resident;
  const double wave_time = double(sharing) * step * overlap;
  return {double(waves) * wave_time, useful / computed, ctas};
}

// How close a backward-weight tile comes to the fastest plan, on average over
// the conv oracle's layers (8b0d0fe, the layers not held out; each tile at its
// best split count). The model above counts products and loads alike for
// every tile, where the tiles' latency differs: one warpgroup of 64x256 holds
// an SM alone with four warps (0.43), and 128x128 with 64-position steps keeps
// sixteen warps of two CTAs busy (0.93). Dividing each tile's modelled time by
// its factor took the rules from 72% to 87% of the fastest plan on the
// held-out layers (NOTES 111). Tiles not timed count 0.7.
double weight_tile_throughput(ckfmha_kernel_entry const& k) {
  enum Template { kMma, kWgmma, kTma };
  struct Measured {
    Template kind;
    int32_t m, n, k, stages;
    double throughput;
  };
  static constexpr Measured kMeasured[] = {
      {kWgmma, 128, 128, 64, 3, 0.93}, {kWgmma, 128, 128, 32, 6, 0.81},
      {kWgmma, 64, 128, 64, 4, 0.80},  {kWgmma, 64, 64, 64, 4, 0.75},
      {kWgmma, 128, 256, 64, 3, 0.55}, {kWgmma, 64, 256, 64, 3, 0.43},
      {kMma, 64, 128, 32, 3, 0.83},    {kMma, 128, 64, 32, 3, 0.79},
      {kMma, 128, 128, 64, 3, 0.74},   {kMma, 64, 64, 32, 4, 0.69},
      {kMma, 128, 128, 32, 3, 0.54},
      // The TMA tiles against the modelled products alone (their copies take
      // no issue slots), from every tile forced on the suite's 18 layers they
      // fit (H200, NOTES 119): 64x128 with two CTAs an SM was the fastest on
      // most; the geomean of each other tile's speed over its speed.
      {kTma, 64, 128, 64, 4, 1.0},     {kTma, 128, 128, 64, 6, 0.85},
      {kTma, 64, 192, 64, 3, 0.78},    {kTma, 128, 256, 64, 4, 0.68},
      {kTma, 64, 256, 64, 4, 0.67},
  };
  const Template kind = is_conv_tma(k) ? kTma : is_conv_gather_wgmma(k) ? kWgmma : kMma;
  for (Measured const& t : kMeasured) {
    if (t.kind == kind && t.m == k.tile_m && t.n == k.tile_n && t.k == k.tile_k &&
        t.stages == k.stages) {
      return t.throughput;
    }
  }
  return 0.7;
}

// An implicit-GEMM backward-weight kernel's grid on a problem before splits:
// its (packed) tiles, its k-tiles of positions, and the CTAs an SM holds. The
// wgmma kernels hold two CTAs an SM where their shared memory fits
// (ConvBwdWeightSm90Traits::kMinCtasPerSm, 4 KiB of position tables
// included); the mma.sync ones one or two 128x128 tiles and more of smaller
// ones; the TMA ones (ConvBwdWeightTmaTraits::kMinCtasPerSm) two where they
// have one consumer warpgroup and two CTAs' stages, barriers and the system's
// KiB each fit in 228 KiB.
struct WeightGemmShape {
  int64_t tiles = 1;
  int64_t k_tiles = 1;
  int64_t stage_bytes = 0;  // the operand stages of a CTA
  int64_t resident = 1;
  int64_t sms = 1;
  int64_t slots = 1;  // CTAs the SMs hold at once
};

WeightGemmShape weight_gemm_shape(ckfmha_kernel_entry const& k, ckfmha_conv_problem const& p,
                                  int sm_count) {
  WeightGemmShape s;
  const int64_t reduction = conv_filter_taps(p) * p.in_channels;
  // The kernels multiply packed groups (conv_weight_pack).
  const int64_t pack = weight_pack(p, k);
  s.tiles = ceil_div(p.out_channels * pack, k.tile_m) * ceil_div(reduction * pack, k.tile_n) *
            (p.groups / pack);
  s.k_tiles = std::max<int64_t>(1, ceil_div(conv_output_rows(p), k.tile_k));
  s.stage_bytes = int64_t(k.stages) * (k.tile_m + k.tile_n) * k.tile_k * 2;
  const int64_t wgmma_smem = s.stage_bytes + 2 * int64_t(k.tile_k) * 32;
  const int64_t tma_smem = s.stage_bytes + 16 * int64_t(k.stages) + 1024;
  if (is_conv_tma(k)) {
    s.resident = k.warps == 8 && 2 * tma_smem <= 228 * 1024 ? 2 : 1;
  } else if (is_conv_gather_wgmma(k)) {
    s.resident = 2 * wgmma_smem <= 220 * 1024 ? 2 : 1;
  } else {
    s.resident = std::clamp<int64_t>((2 * 128 * 128) / (int64_t(k.tile_m) * k.tile_n), 1, 4);
  }
  s.sms = std::max(sm_count, 1);
  s.slots = s.sms * s.resident;
  return s;
}

// Whether the TMA backward-weight kernel's `splits` CTAs of each tile sum
// their partial tiles in one cluster (through their operand stages,
// kernel::conv_split_scratch_bytes) and store dw, instead of adding them into
// the zeroed fp32 workspace and converting it after: two launches fewer. Only
// where every cluster is resident at once with one CTA an SM (the launcher
// spreads them so, kernel::conv_cluster_spread_smem): a GPC runs whole
// clusters, and at one CTA an SM the H200 held 15 clusters of 8 (120 of its
// 132 SMs) but 39 of 3, 22 of 5, 17 of 6 and 15 of 7 (77-89%; NOTES 123, 127),
// so a power of two takes 10/11 of the SMs and other counts 3/4.
bool tma_weight_cluster_sum(ckfmha_kernel_entry const& k, ckfmha_conv_problem const& p,
                            WeightGemmShape const& s, int64_t splits) {
  if (!is_conv_tma(k) || !kernel::conv_weight_cluster_sum(k.arch, int32_t(splits), p.groups)) {
    return false;
  }
  if (kernel::conv_split_scratch_bytes(k.tile_m, k.tile_n, splits) > s.stage_bytes) return false;
  const bool power_of_two = (splits & (splits - 1)) == 0;
  const int64_t capacity = power_of_two ? s.sms * 10 / 11 : s.sms * 3 / 4;
  return s.tiles * splits <= capacity;
}

// Backward-weight: the product tile is dw's (K x taps * C per group) and the
// reduction runs over every output position, so few output tiles split it
// over CTAs until one wave is full, down to two k-tiles a split (the partial
// sums' atomic adds cost about two k-tiles a CTA). Replayed on the conv
// oracle's timings (NOTES 109), that floor and target took the rules from 77%
// to 85% of the fastest plan on average; 16 k-tiles and two waves kept layers
// of 10-50 us on one split, 3-4x slower than the fastest.
//
// The TMA template instead takes the split count with the fewest k-tiles an
// SM (rounding the count up can leave a second wave of a few CTAs: ResNet-18's
// 14x14x256 layer on 128x128, 36 tiles x 4 splits on 132 SMs), each split
// costing a tile kSplitSumSteps k-tiles more for its sum (as above) and
// kWorkspaceSteps more where the splits add into the workspace, for the
// zeroing and conversion launches around the kernel (1-1.8 us in graphs on the
// H200, k-tiles of 0.2-0.3 us; NOTES 127), or kClusterSumSteps more where they
// sum in a cluster (tma_weight_cluster_sum). Since the workspace's epilogue
// stores pairs (NOTES 128), clusters cost 11-16 k-tiles in all on ResNet-18's
// and ResNet-50's batch-1 layers, 0.3-1.7 us more than the workspace at a like
// count, so no automatic plan takes one; split counts the caller forces still
// sum in a cluster where every cluster is resident at once.
constexpr double kSplitSumSteps = 2.0;
constexpr double kWorkspaceSteps = 8.0;
constexpr double kClusterSumSteps = 12.0;

TileCost weight_tile_cost(ckfmha_kernel_entry const& k, ckfmha_conv_problem const& p,
                          int sm_count, bool can_split) {
  if (is_direct(k)) {
    // Its CTAs take (image, output tile) items in turn: four per SM over the
    // blocks of 32 groups, at most one per item.
    const int64_t rows = ceil_div(p.output[p.spatial_dims - 2], k.warps);
    const int64_t cols = ceil_div(p.output[p.spatial_dims - 1], k.tile_m);
    const int64_t depth = p.spatial_dims == 3 ? p.output[0] : 1;
    const int64_t items = std::max<int64_t>(1, rows * cols * depth * p.batch);
    const int64_t blocks = ceil_div(p.groups, 32);
    const int64_t workers = std::clamp<int64_t>(ceil_div(4 * int64_t(sm_count), blocks), 1,
                                                std::min<int64_t>(items, 0x7fffffff));
    return {0.0, 1.0, workers * blocks, int32_t(workers)};
  }
  const WeightGemmShape shape = weight_gemm_shape(k, p, sm_count);
  const int64_t tiles = shape.tiles;
  const int64_t k_tiles = shape.k_tiles;
  const int64_t slots = shape.slots;
  // The time at `splits`, in k-tile steps: each wave's k-tiles and split sums,
  // and on the TMA template the workspace's launches or the cluster sum.
  auto steps = [&](int64_t splits) {
    const int64_t per_split = ceil_div(k_tiles, splits);
    const int64_t used = ceil_div(k_tiles, per_split);
    double time = double(ceil_div(tiles * used, slots)) *
                  (double(per_split) + (used > 1 ? kSplitSumSteps : 0.0));
    if (used > 1 && is_conv_tma(k)) {
      time += tma_weight_cluster_sum(k, p, shape, used) ? kClusterSumSteps : kWorkspaceSteps;
    }
    return time;
  };
  int64_t splits = 1;
  if (can_split && tiles < slots) {
    const int64_t most = std::min<int64_t>(65535, std::max<int64_t>(1, k_tiles / 2));
    splits = std::clamp<int64_t>(ceil_div(slots, tiles), 1, most);
    // A split must save more than its sum costs: at 4-5 k-tiles two splits
    // tie with one, and ResNeXt's batch-1 groups of 16 (4 k-tiles) ran 7.0 us
    // summed over two CTAs of a cluster against 6.0 unsplit (NOTES 128).
    if (!is_conv_tma(k) && steps(splits) >= steps(1)) splits = 1;
    if (is_conv_tma(k)) {
      const int64_t upto = splits;
      double fewest = 0.0;
      for (int64_t s = 1; s <= upto; ++s) {
        const double time = steps(s);
        if (s == 1 || time < fewest) {
          fewest = time;
          splits = s;
        }
      }
    }
  }
  const int64_t per_split = ceil_div(k_tiles, splits);
  splits = ceil_div(k_tiles, per_split);
  const int64_t ctas = tiles * splits;
  const double loads = is_conv_tma(k) ? 0.0 : 64.0 * (k.tile_m + k.tile_n);
  const double step = std::max(double(k.tile_m) * k.tile_n, loads) * (k.tile_k / 32.0);
  const double cost = double(shape.resident) * step * steps(splits) / weight_tile_throughput(k);
  const int64_t reduction = conv_filter_taps(p) * p.in_channels;
  const double useful = double(p.out_channels) * double(reduction) * p.groups;
  const double computed = double(tiles) * k.tile_m * k.tile_n;
  return {cost, useful / computed, ctas, int32_t(splits)};
}

// The first key of plan_conv's preference. Direct kernels of groups of up to
// 4 channels, then (backward-weight) the TMA template, then the 8-channel
// direct weight kernel, then the other implicit GEMMs. The TMA weight
// kernels, where they fit, ran groups of 8 channels (packed 8 at a time)
// at 1.04-1.19x cuDNN where the 8-channel direct kernel ran 0.35-0.52x
// (ResNeXt's second stage, the video layer; NOTES 119).
int kind_rank(ckfmha_kernel_entry const& k, ckfmha_conv_direction direction) {
  if (is_direct(k)) return is_weight(direction) && k.conv_max_channels > 4 ? 1 : 3;
  return is_weight(direction) && is_conv_tma(k) ? 2 : 0;
}

std::string why_none(std::vector<ckfmha_kernel_entry> const& kernels,
                     ckfmha_conv_problem const& p, ckfmha_conv_direction direction,
                     ConvPlanContext const& context) {
  const ckfmha_family family = family_of(direction);
  std::ostringstream msg;
  msg << "no compiled " << family_name(family) << " kernel fits " << describe(p) << " on sm_"
      << context.device_arch << " (channel vector " << context.vector << "). ";
  std::map<std::string, std::set<int32_t>> variants;
  for (auto const& k : kernels) {
    if (k.family != family || !arch_runs_on(k, context.device_arch)) continue;
    variants[std::string(dtype_name(k.dtype)) + " " + std::to_string(k.conv_spatial_dims) + "d"]
        .insert(k.conv_vector);
  }
  if (variants.empty()) {
    msg << "No " << family_name(family) << " kernels for sm_" << context.device_arch
        << " are registered (build them with `python -m ckfmha build`, or let a Python call "
           "compile them on first use).";
  } else {
    msg << "Available on sm_" << context.device_arch << " (channel vectors):";
    for (auto const& [shape, vectors] : variants) {
      msg << " " << shape << " {";
      bool first = true;
      for (int32_t v : vectors) {
        msg << (first ? "" : ", ") << v;
        first = false;
      }
      msg << "};";
    }
  }
  msg << " ckfmha_conv_explain lists each kernel's reason.";
  return msg.str();
}

}  // namespace

int32_t conv_weight_gemm_cluster(ckfmha_kernel_entry const& k, ckfmha_conv_problem const& p,
                                 int32_t splits, int sm_count) {
  if (k.family != CKFMHA_FAMILY_CONV_BWD_WEIGHT) return 0;
  if (is_conv_tma(k)) {
    return tma_weight_cluster_sum(k, p, weight_gemm_shape(k, p, sm_count), splits) ? splits : 0;
  }
  const bool cluster =
      is_conv_gather_wgmma(k) && kernel::conv_weight_cluster_sum(k.arch, splits, p.groups);
  return cluster ? splits : 0;
}

bool conv_kernel_fits(ckfmha_kernel_entry const& k, ckfmha_conv_problem const& p,
                      ckfmha_conv_direction direction, ConvPlanContext const& context) {
  return fits(k, p, direction, context);
}

ConvPlan plan_conv(std::vector<ckfmha_kernel_entry> const& kernels, ckfmha_conv_problem const& p,
                   ckfmha_conv_direction direction, ConvPlanContext const& context) {
  ConvPlan plan;
  if (std::string error = check_conv_direction(direction); !error.empty()) {
    plan.why = error;
    return plan;
  }
  if (context.forced != nullptr) {
    std::string why = reject_reason(*context.forced, p, direction, context, /*forced=*/true);
    if (!why.empty()) {
      plan.why = std::string("kernel ") + context.forced->name + " cannot run this problem: " + why;
      return plan;
    }
    plan.found = true;
    plan.kernel = *context.forced;
    plan.why = "kernel forced by name";
    if (is_weight(direction)) {
      plan.splits = weight_tile_cost(plan.kernel, p, context.sm_count, context.can_split).splits;
    }
    return plan;
  }
  // Preference (kind_rank): a direct kernel for groups of few channels (an
  // implicit GEMM pads their products to tensor-core tiles; backward-weight:
  // the TMA template before the 8-channel direct one), the widest channel vector,
  // SASS for this exact arch, the forward fed by the copy engine (where its
  // tile is at least half useful) over wgmma with gathers over mma.sync
  // (backward-weight: the measured throughput of
  // each tile, weight_tile_throughput, ranks the two templates instead), then
  // the tile with the lowest modelled cost, then generator order.
  const bool template_ranked = !is_weight(direction);
  std::tuple<int, int32_t, bool, int, double> best{};
  TileCost best_cost{};
  for (auto const& k : kernels) {
    if (!fits(k, p, direction, context)) continue;
    const TileCost cost = is_weight(direction)
                              ? weight_tile_cost(k, p, context.sm_count, context.can_split)
                              : tile_cost(k, p, context.sm_count,
                                          context.sm_count / std::max(context.concurrent, 1));
    // A TMA tile ranks first where it fills at least half its products (at
    // ResNeXt's groups of 32 output channels its 128-wide tiles ran at 0.59x
    // cuDNN where the gathering kernel's 16-wide one had run at 0.95x, NOTES
    // 112), or where all its tiles fit one wave: there the copy engine's
    // shorter prologue wins (ResNeXt's last stage at batch 1, 32 tiles a tenth
    // useful: 1.37x the gathering kernel's speed forward, 1.1-1.2x in the
    // backward-data phases, NOTES 115).
    const bool tma_first =
        is_conv_tma(k) && (cost.fill >= 0.5 || cost.ctas <= context.sm_count);
    int template_rank = 0;
    if (template_ranked) template_rank = tma_first ? 2 : is_conv_gather_wgmma(k) ? 1 : 0;
    std::tuple<int, int32_t, bool, int, double> score{
        kind_rank(k, direction), k.conv_vector, k.arch == context.device_arch, template_rank,
        -cost.cost};
    if (!plan.found || score > best) {
      plan.found = true;
      plan.kernel = k;
      best = score;
      best_cost = cost;
    }
  }
  if (!plan.found) {
    plan.why = why_none(kernels, p, direction, context);
    return plan;
  }
  plan.splits = best_cost.splits;
  std::string learned_note;
  if (context.learned && is_conv_tma(plan.kernel)) {
    // The cost model was trained before these templates existed: it ranks the
    // gathering kernels only. Said only where the learned selection would
    // otherwise apply (not in heuristic mode).
    std::string why_not;
    if (conv_learned_applies(direction, context.device_arch, &why_not)) {
      learned_note = " [learned selection not used: the conv cost model has no timings of the "
                     "TMA template]";
    } else if (!why_not.empty()) {
      learned_note = " [learned selection not used: " + why_not + "]";
    }
  } else if (context.learned &&
             apply_learned_conv_plan(kernels, p, direction, context, &plan, &learned_note)) {
    return plan;
  }
  std::ostringstream why;
  if (plan.kernel.conv_max_channels != 0) {
    why << "groups of " << p.in_channels << " input and " << p.out_channels
        << " output channels computed directly, ";
    why << direct_path(p, direction, plan.kernel.conv_max_channels);
    if (is_weight(direction) && plan.kernel.conv_max_channels <= 4) {
      // The vector path sizes its own grid (vector_weight_launch.cuh).
      why << ", " << plan.splits << " CTAs a block of groups taking its images' output tiles "
          << "in turn on the lane path";
    }
    plan.why = why.str() + learned_note;
    return plan;
  }
  why << (plan.kernel.arch == context.device_arch ? "SASS for this arch" : "compatible SASS")
      << ", ";
  if (is_conv_tma(plan.kernel) && is_weight(direction)) {
    why << "tensor copies of 64-channel runs (x's in im2col mode; dy's, and x's at 1x1 filters "
           "with stride 1 and no padding, as plain matrices where their positions lie one "
           "stride apart)";
  } else {
    why << (is_conv_tma(plan.kernel) ? "im2col tensor copies of " : "")
        << plan.kernel.conv_vector << "-channel loads";
  }
  why << ", tile " << plan.kernel.tile_m << "x"
      << plan.kernel.tile_n << ": " << best_cost.ctas << " CTAs on " << context.sm_count
      << " SMs, " << int(best_cost.fill * 100.0 + 0.5) << "% of the tiles' products useful";
  if (is_weight(direction)) {
    why << "; the reduction over positions in " << plan.splits << " split"
        << (plan.splits == 1 ? "" : "s");
    const int32_t pack = weight_pack(p, plan.kernel);
    if (pack > 1) {
      why << "; groups multiplied " << pack << " at a time as one of " << pack * p.out_channels
          << "x" << pack * p.in_channels << " channels, keeping each group's own products";
    }
  } else if (plan.splits > 1) {
    why << "; each tile's reduction split over the " << plan.splits
        << " CTAs of a cluster, their partial sums added in distributed shared memory";
  }
  plan.why = why.str() + learned_note;
  return plan;
}

std::string explain_conv(std::vector<ckfmha_kernel_entry> const& kernels,
                         ckfmha_conv_problem const& p, ckfmha_conv_direction direction,
                         ConvPlanContext const& context) {
  std::ostringstream out;
  out << "problem: " << conv_direction_name(direction) << " " << describe(p) << " on sm_"
      << context.device_arch << ", channel vector " << context.vector << "\n";
  ConvPlan plan = plan_conv(kernels, p, direction, context);
  const ckfmha_family family = family_of(direction);
  int listed = 0;
  for (auto const& k : kernels) {
    if (k.family != family) continue;
    ++listed;
    std::string why = reject_reason(k, p, direction, context);
    if (why.empty()) {
      const bool selected = plan.found && std::string(plan.kernel.name) == k.name;
      out << (selected ? "  selected  " : "  fits      ") << k.name << "\n";
    } else {
      out << "  rejected  " << k.name << ": " << why << "\n";
    }
  }
  if (listed == 0) out << "  (no " << family_name(family) << " kernels are registered)\n";
  out << explain_conv_predictions(kernels, p, direction, context);
  out << "plan: ";
  const int32_t cluster =
      plan.found ? conv_weight_direct_cluster(plan.kernel, p, nullptr, nullptr, context.sm_count)
                 : 0;
  const int32_t split_cluster =
      plan.found && is_weight(direction)
          ? conv_weight_gemm_cluster(plan.kernel, p, plan.splits, context.sm_count)
          : 0;
  if (split_cluster > 0) {
    out << "one stage, " << plan.kernel.name << " over " << plan.splits
        << " splits, a tile's in one cluster (up to " << split_cluster
        << " CTAs) adding their partial sums through distributed shared memory and storing dw, "
           "no workspace: "
        << plan.why << "\n";
  } else if (cluster > 0) {
    out << "one stage, " << plan.kernel.name << " on its vector path ("
        << conv_weight_vector_shape(plan.kernel, p, context.sm_count) << "): "
        << (cluster == 1 ? "one CTA sums" : std::to_string(cluster) + " CTAs in a cluster sum")
        << " each block of dw and store it, no workspace (where x and dy are aligned "
           "to its vectors; else they add into the zeroed fp32 workspace, converted after): "
        << plan.why << "\n";
  } else if (plan.found && is_weight(direction) &&
             (plan.splits > 1 || is_direct(plan.kernel))) {
    out << "zero the fp32 partial sums, " << plan.kernel.name;
    const std::string shape = is_direct(plan.kernel)
                                  ? conv_weight_vector_shape(plan.kernel, p, context.sm_count)
                                  : std::string();
    const bool lane = is_direct(plan.kernel) && plan.kernel.conv_max_channels <= 4;
    if (!is_direct(plan.kernel)) {
      out << " over " << plan.splits << " splits";
    } else if (!shape.empty()) {
      out << " on its vector path (" << shape << ")"
          << (lane ? " where x and dy are aligned to its vectors, else" : "");
    } else if (!lane) {
      out << " on its lane path";  // the 8-channel kernel forced off its vector path
    }
    if (lane) out << " over " << plan.splits << " CTAs a block of groups on the lane path";
    out << " adding into them, convert to dw: " << plan.why << "\n";
  } else if (plan.found) {
    out << "one stage, " << plan.kernel.name << ": " << plan.why << "\n";
  } else {
    out << "none: " << plan.why << "\n";
  }
  return out.str();
}

}  // namespace ckfmha::runtime
