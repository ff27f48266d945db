// The backward-data plan's stride phases (conv_bwd_plan.hpp), and the
// backward-weight plan's vector and workspace.
#include "ckfmha/runtime/conv_bwd_plan.hpp"

#include "ckfmha/runtime/learned_conv_plan.hpp"

#include "ckfmha/runtime/dispatcher.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <sstream>
#include <utility>

namespace ckfmha::runtime {

namespace {

// One spatial dim of one phase.
struct DimPhase {
  int32_t positions = 0;  // dx positions of the phase
  int32_t taps = 0;       // filter taps that reach them (0: none)
  int32_t first = 0;      // the largest such tap
  int32_t step = 1;       // distance between consecutive ones
  int32_t padding = 0;    // the forward problem's, in dy's coordinates
  int32_t dilation = 1;
};

DimPhase dim_phase(int32_t input, int32_t filter, int32_t stride, int32_t padding,
                   int32_t dilation, int32_t phase) {
  DimPhase d;
  d.positions = (input - phase + stride - 1) / stride;
  const int32_t common = std::gcd(stride, dilation);
  d.step = stride / common;
  // Tap r reaches the phase when phase + padding - r * dilation divides by
  // the stride; that repeats every `step` taps, so the top `step` decide.
  for (int32_t r = filter - 1; r >= 0 && r >= filter - d.step; --r) {
    if ((int64_t(phase) + padding - int64_t(r) * dilation) % stride == 0) {
      d.first = r;
      d.taps = r / d.step + 1;
      d.dilation = dilation / common;
      d.padding = int32_t((int64_t(r) * dilation - phase - padding) / stride);
      break;
    }
  }
  return d;
}

size_t round_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

// The phase's filter as a view of w (3D form, dense [groups, K, z, y, x,
// C]): the phase's output channel is w's input channel and the reverse, and
// its tap i along a dim is w's first - step * i there.
kernel::ConvFilterView phase_view(ConvPhaseFilter const& f) {
  kernel::ConvFilterView v{};
  int64_t tap_stride[3];
  tap_stride[2] = f.in_channels;
  tap_stride[1] = tap_stride[2] * f.filter[2];
  tap_stride[0] = tap_stride[1] * f.filter[1];
  v.in_channel = tap_stride[0] * f.filter[0];  // w's output channel
  v.group = v.in_channel * f.out_channels;
  v.out_channel = 1;  // w's input channel
  for (int d = 0; d < 3; ++d) {
    v.first += int64_t(f.first[d]) * tap_stride[d];
    v.tap[d] = -int64_t(f.step[d]) * tap_stride[d];
  }
  return v;
}

}  // namespace

std::vector<ConvDataPhase> conv_data_phases(ckfmha_conv_problem const& p,
                                            size_t* workspace_bytes, int32_t pack) {
  const int dims = p.spatial_dims;
  int32_t phases_per_dim[3] = {1, 1, 1};
  for (int i = 0; i < dims; ++i) phases_per_dim[i] = std::min(p.stride[i], p.input[i]);
  std::vector<ConvDataPhase> phases;
  size_t offset = 0;
  int32_t phase[3] = {0, 0, 0};
  const int64_t count = int64_t(phases_per_dim[0]) * phases_per_dim[1] * phases_per_dim[2];
  for (int64_t index = 0; index < count; ++index) {
    int64_t rest = index;
    for (int i = dims - 1; i >= 0; --i) {
      phase[i] = int32_t(rest % phases_per_dim[i]);
      rest /= phases_per_dim[i];
    }
    ConvDataPhase ph;
    ckfmha_conv_problem& f = ph.forward;
    f = p;
    f.groups = p.groups / pack;
    f.in_channels = p.out_channels * pack;
    f.out_channels = p.in_channels * pack;
    f.x_stride[0] = p.y_stride[0];
    f.y_stride[0] = p.x_stride[0];
    const int skip = 3 - dims;
    for (int axis = 0; axis < 3; ++axis) {
      ph.filter.filter[axis] = ph.filter.taps[axis] = ph.filter.step[axis] = 1;
      ph.filter.first[axis] = 0;
    }
    for (int i = 0; i < dims; ++i) {
      const DimPhase d =
          dim_phase(p.input[i], p.filter[i], p.stride[i], p.padding[i], p.dilation[i], phase[i]);
      ph.empty = ph.empty || d.taps == 0;
      f.input[i] = p.output[i];
      f.filter[i] = std::max(d.taps, 1);
      f.stride[i] = 1;
      f.padding[i] = d.padding;
      f.dilation[i] = d.dilation;
      f.output[i] = d.positions;
      f.x_stride[1 + i] = p.y_stride[1 + i];
      f.y_stride[1 + i] = p.x_stride[1 + i] * p.stride[i];
      ph.dx_offset += int64_t(phase[i]) * p.x_stride[1 + i];
      ph.filter.filter[skip + i] = p.filter[i];
      ph.filter.taps[skip + i] = d.taps;
      ph.filter.first[skip + i] = d.first;
      ph.filter.step[skip + i] = d.step;
    }
    ph.filter.groups = p.groups;
    ph.filter.in_channels = p.in_channels;
    ph.filter.out_channels = p.out_channels;
    ph.filter.pack = pack;
    ph.view = phase_view(ph.filter);
    if (!ph.empty) {
      ph.filter_offset = offset;
      const int64_t taps =
          int64_t(ph.filter.taps[0]) * ph.filter.taps[1] * ph.filter.taps[2];
      offset +=
          round_up(size_t(p.groups) * pack * p.in_channels * p.out_channels * taps * 2);
    }
    phases.push_back(ph);
  }
  if (workspace_bytes != nullptr) *workspace_bytes = offset;
  return phases;
}

int32_t conv_running_phases(std::vector<ConvDataPhase> const& phases) {
  int32_t running = 0;
  for (ConvDataPhase const& ph : phases) running += ph.empty ? 0 : 1;
  return std::max(running, 1);
}

bool reads_filter_view(ConvDataPhase const& phase, const void* w) {
  // A view cannot hold a packed filter's zeros.
  if (phase.filter.pack != 1) return false;
  ckfmha_kernel_entry const& k = phase.plan.kernel;
  if (k.conv_max_channels != 0) return true;
  const bool aligned = reinterpret_cast<uintptr_t>(w) % 16 == 0;
  if (is_conv_tma(k)) return aligned;
  // The gathering wgmma kernels read 16-byte vectors along the view's
  // output channels (w's input channels, one apart): whole vectors of them.
  // Their mma.sync twins read the rearranged copy.
  return is_conv_gather_wgmma(k) && k.conv_vector == 8 &&
         phase.forward.out_channels % 8 == 0 && aligned;
}

size_t conv_data_workspace_bytes(ckfmha_conv_problem const& p) {
  // The packed filters are the larger: room for either plan.
  size_t bytes = 0;
  conv_data_phases(p, &bytes, kernel::conv_tma_pack(p.groups, p.out_channels));
  return bytes;
}

std::string check_conv_bwd_data(ckfmha_conv_problem const& p) {
  const int64_t taps = conv_filter_taps(p);
  if (taps * p.out_channels > std::numeric_limits<int32_t>::max()) {
    return "filter taps x out_channels = " + std::to_string(taps * p.out_channels) +
           " exceeds 2^31 - 1, the reduction length the backward-data kernels index";
  }
  for (int i = 0; i <= p.spatial_dims; ++i) {
    if (p.x_stride[i] < 1) {
      return "dx strides must be >= 1 (it is written); x_stride[" + std::to_string(i) +
             "] is " + std::to_string(p.x_stride[i]);
    }
  }
  return {};
}

namespace {

// The context a phase is planned in: the caller's, at the channel vector the
// phase allows, without the learned selection (it decides for all phases),
// beside the other phases that run.
ConvPlanContext phase_context(ConvPlanContext const& context, ConvDataPhase const& phase,
                              std::vector<ConvDataPhase> const& phases) {
  ConvPlanContext out = context;
  out.vector = phase.vector;
  out.learned = false;
  out.concurrent = conv_running_phases(phases);
  return out;
}

// The forward kernels that fit every phase that runs, as the learned
// selection weighs them.
std::vector<ConvCandidate> bwd_data_candidates(std::vector<ckfmha_kernel_entry> const& kernels,
                                               ckfmha_conv_problem const& p,
                                               ConvPlanContext const& context,
                                               std::vector<ConvDataPhase> const& phases) {
  return conv_candidates(kernels, p, CKFMHA_CONV_BWD_DATA, context.device_arch, context.sm_count,
                         [&](ckfmha_kernel_entry const& k) {
                           for (ConvDataPhase const& ph : phases) {
                             if (!ph.empty && !conv_kernel_fits(k, ph.forward, CKFMHA_CONV_FWD,
                                                                phase_context(context, ph,
                                                                              phases))) {
                               return false;
                             }
                           }
                           return true;
                         });
}

void apply_learned_bwd_data(std::vector<ckfmha_kernel_entry> const& kernels,
                            ckfmha_conv_problem const& p, ConvPlanContext const& context,
                            ConvDataPlan* plan) {
  std::string why_not;
  if (!conv_learned_applies(CKFMHA_CONV_BWD_DATA, context.device_arch, &why_not)) {
    if (!why_not.empty()) plan->learned = "learned selection not used: " + why_not;
    return;
  }
  for (ConvDataPhase const& ph : plan->phases) {
    if (!ph.empty && ph.plan.found && is_conv_tma(ph.plan.kernel)) {
      // As in plan_conv: the model has no timings of the TMA template.
      plan->learned = "learned selection not used: the conv cost model has no timings of the "
                      "TMA template";
      return;
    }
  }
  auto candidates = bwd_data_candidates(kernels, p, context, plan->phases);
  if (candidates.empty()) return;
  // The choice depends on the narrowest vector a phase allows.
  ConvPlanContext key_context = context;
  for (ConvDataPhase const& ph : plan->phases) {
    if (!ph.empty) key_context.vector = std::min(key_context.vector, ph.vector);
  }
  const int index = learned_conv_index(p, CKFMHA_CONV_BWD_DATA, key_context, &candidates,
                                       &plan->learned);
  if (index < 0) return;
  for (ConvDataPhase& ph : plan->phases) {
    if (ph.empty) continue;
    ConvPlanContext forced = phase_context(context, ph, plan->phases);
    forced.forced = candidates[size_t(index)].kernel;
    ph.plan = plan_conv(kernels, ph.forward, CKFMHA_CONV_FWD, forced);
    ph.plan.why = plan->learned;
  }
}

// The phases with `pack` groups as one, each with the rules' kernel (or the
// forced one).
ConvDataPlan plan_phases(std::vector<ckfmha_kernel_entry> const& kernels,
                         ckfmha_conv_problem const& p, ConvPlanContext const& context,
                         const void* dy, const void* workspace, int32_t pack) {
  ConvDataPlan plan;
  plan.pack = pack;
  plan.phases = conv_data_phases(p, &plan.workspace_bytes, pack);
  for (size_t i = 0; i < plan.phases.size(); ++i) {
    ConvDataPhase& ph = plan.phases[i];
    if (ph.empty) continue;
    const void* filter =
        workspace == nullptr ? nullptr : static_cast<const char*>(workspace) + ph.filter_offset;
    ph.vector = conv_vector_allowed(ph.forward, dy, filter);
    ph.plan = plan_conv(kernels, ph.forward, CKFMHA_CONV_FWD,
                        phase_context(context, ph, plan.phases));
    if (!ph.plan.found) {
      plan.why = "backward-data phase " + std::to_string(i) + " (" + describe(ph.forward) +
                 "): " + ph.plan.why;
      return plan;
    }
  }
  plan.found = true;
  return plan;
}

bool every_phase_on_tma(ConvDataPlan const& plan) {
  for (ConvDataPhase const& ph : plan.phases) {
    if (!ph.empty && !is_conv_tma(ph.plan.kernel)) return false;
  }
  return true;
}

}  // namespace

ConvDataPlan plan_conv_bwd_data(std::vector<ckfmha_kernel_entry> const& kernels,
                                ckfmha_conv_problem const& p, ConvPlanContext const& context,
                                const void* dy, const void* workspace) {
  ConvDataPlan plan = plan_phases(kernels, p, context, dy, workspace, 1);
  const int32_t pack = kernel::conv_tma_pack(p.groups, p.out_channels);
  int64_t positions = p.batch;
  for (int i = 0; i < p.spatial_dims; ++i) positions *= p.input[i];
  // A forced TMA kernel fits groups of 8-32 channels only packed.
  const bool worth_packing = !plan.found || (positions >= kernel::kTmaPackMinPositions &&
                                             !every_phase_on_tma(plan));
  if (pack > 1 && worth_packing) {
    ConvDataPlan packed = plan_phases(kernels, p, context, dy, workspace, pack);
    if (packed.found && every_phase_on_tma(packed)) plan = std::move(packed);
  }
  if (plan.found && context.forced == nullptr && context.learned) {
    apply_learned_bwd_data(kernels, p, context, &plan);
  }
  return plan;
}

std::string explain_conv_bwd_data(std::vector<ckfmha_kernel_entry> const& kernels,
                                  ckfmha_conv_problem const& p, ConvPlanContext const& context) {
  std::ostringstream out;
  out << "problem: " << conv_direction_name(CKFMHA_CONV_BWD_DATA) << " " << describe(p)
      << " on sm_" << context.device_arch << "\n";
  ConvDataPlan plan = plan_conv_bwd_data(kernels, p, context, nullptr, nullptr);
  if (plan.found && conv_learned_applies(CKFMHA_CONV_BWD_DATA, context.device_arch, nullptr)) {
    out << format_conv_predictions(p, CKFMHA_CONV_BWD_DATA, context.sm_count,
                                   bwd_data_candidates(kernels, p, context, plan.phases));
  }
  if (!plan.learned.empty()) out << plan.learned << "\n";
  out << "plan: " << plan.phases.size() << " stride phase"
      << (plan.phases.size() == 1 ? "" : "s") << " of dx, each a forward convolution of dy "
      << "with the filter taps that reach it (workspace " << plan.workspace_bytes
      << " bytes for the filters of phases whose kernels read them rearranged)";
  int convolutions = 0;
  for (ConvDataPhase const& ph : plan.phases) convolutions += ph.empty ? 0 : 1;
  if (convolutions > 1) out << "; their convolutions run concurrently on side streams";
  out << "\n";
  if (plan.pack > 1) {
    out << "groups multiplied " << plan.pack << " at a time as one of "
        << plan.pack * p.out_channels << " input and " << plan.pack * p.in_channels
        << " output channels through block-diagonal filters (zeros between the groups), so "
           "that the TMA template takes whole 64-channel chunks\n";
  }
  for (size_t i = 0; i < plan.phases.size(); ++i) {
    ConvDataPhase const& ph = plan.phases[i];
    out << "  phase " << i << ": ";
    if (ph.empty) {
      out << "no filter tap reaches these positions: zeros\n";
      continue;
    }
    out << describe(ph.forward) << "\n    ";
    if (ph.plan.found) {
      out << ph.plan.kernel.name << ": " << ph.plan.why << "\n";
      if (reads_filter_view(ph, nullptr)) {
        out << "    its filter is read from w in place (transposed and flipped by index), "
               "not rearranged\n";
      }
    } else {
      out << "none: " << (plan.why.empty() ? ph.plan.why : plan.why) << "\n";
      break;
    }
  }
  return out.str();
}

int32_t conv_weight_vector_allowed(ckfmha_conv_problem const& p, const void* x,
                                   const void* dy) {
  // A vector divides both channel counts when it divides their gcd.
  int64_t strides[8];
  const int count = p.spatial_dims + 1;
  for (int i = 0; i < count; ++i) {
    strides[i] = p.x_stride[i];
    strides[count + i] = p.y_stride[i];
  }
  return widest_conv_vector(std::gcd(p.in_channels, p.out_channels), strides, 2 * count, x, dy);
}

size_t conv_weight_workspace_bytes(ckfmha_conv_problem const& p) {
  return size_t(p.groups) * p.out_channels * size_t(conv_filter_taps(p)) * p.in_channels *
         sizeof(float);
}

}  // namespace ckfmha::runtime
