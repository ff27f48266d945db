// Selection rules every operation shares: arch compatibility, mask kinds,
// template preference and the 16-byte vector stride checks.
#include "ckfmha/runtime/dispatcher.hpp"

#include "ckfmha/runtime/problem.hpp"

#include <cstdint>
#include <sstream>
#include <string_view>

namespace ckfmha::runtime {

namespace {

// Every kernel moves 16-byte vectors: each row, head and batch start must
// sit on a multiple of 16 bytes, i.e. 8 fp16/bf16 or 4 fp32 elements.
constexpr int64_t kVectorBytes = 16;

}  // namespace

int64_t vector_elems(ckfmha_dtype dtype) { return kVectorBytes / element_bytes(dtype); }

std::string arch_label(int arch) { return "sm_" + std::to_string(arch); }

std::string check_vector_strides(const char* tensor, int64_t const (&stride)[3],
                                 int64_t vector) {
  static const char* kAxis[3] = {"batch", "head", "seq"};
  for (int i = 0; i < 3; ++i) {
    if (stride[i] % vector != 0) {
      std::ostringstream msg;
      msg << tensor << " " << kAxis[i] << " stride " << stride[i] << " is not a multiple of "
          << vector << " elements (16-byte vector loads)";
      return msg.str();
    }
  }
  return {};
}

namespace {

bool is_window(ckfmha_mask mask) {
  return mask == CKFMHA_MASK_WINDOW_TOP_LEFT || mask == CKFMHA_MASK_WINDOW_BOTTOM_RIGHT;
}

bool is_causal(ckfmha_mask mask) {
  return mask == CKFMHA_MASK_CAUSAL_TOP_LEFT || mask == CKFMHA_MASK_CAUSAL_BOTTOM_RIGHT;
}

}  // namespace

// A window kernel computes any mask with bounds (causal is left -1, right 0);
// a causal kernel only causal ones; a no-mask kernel only unmasked problems.
bool mask_fits(ckfmha_mask_kind kind, ckfmha_mask mask) {
  switch (kind) {
    case CKFMHA_MASK_KIND_NONE: return mask == CKFMHA_MASK_NONE;
    case CKFMHA_MASK_KIND_CAUSAL: return is_causal(mask);
    case CKFMHA_MASK_KIND_WINDOW: return mask != CKFMHA_MASK_NONE;
  }
  return false;
}

ckfmha_mask_kind preferred_mask_kind(ckfmha_mask mask) {
  if (mask == CKFMHA_MASK_NONE) return CKFMHA_MASK_KIND_NONE;
  return is_window(mask) ? CKFMHA_MASK_KIND_WINDOW : CKFMHA_MASK_KIND_CAUSAL;
}

// Higher is faster where both fit; an unknown pipeline ranks lowest. The
// generator builds first-use kernels in the same order
// (generator/enumerate.py, PIPELINE_PREFERENCE).
int pipeline_rank(const char* pipeline) {
  std::string_view name = pipeline ? pipeline : "";
  if (name == "sm90_tma_wgmma") return 2;
  if (name == "sm80_cpasync_mma") return 1;
  return 0;
}

std::string packed_token_counts_problem(ckfmha_kernel_entry const& kernel, ckfmha_mode mode,
                                        int64_t total_q, int64_t total_k) {
  std::string_view name = kernel.pipeline ? kernel.pipeline : "";
  if (mode != CKFMHA_MODE_GROUP || name != "sm90_tma_wgmma") return {};
  constexpr int64_t kMaxTmaRows = INT32_MAX;
  if (total_q <= 0 || total_k <= 0) {
    return "group mode on sm90_tma_wgmma needs total_q and total_k (its TMA descriptors "
           "span the packed tokens); the problem leaves them 0";
  }
  if (total_q > kMaxTmaRows || total_k > kMaxTmaRows) {
    return "total_q/total_k exceed 2^31 - 1, the TMA descriptors' coordinate range";
  }
  return {};
}

bool arch_runs_on(ckfmha_kernel_entry const& kernel, int device_arch) {
  // Arch-specific ("a") targets run only on their exact arch; plain SASS runs
  // on later minor versions of the same major.
  std::string_view name = kernel.arch_name ? kernel.arch_name : "";
  if (!name.empty() && name.back() == 'a') return kernel.arch == device_arch;
  return kernel.arch / 10 == device_arch / 10 && kernel.arch <= device_arch;
}

bool mask_kind_preferred(ckfmha_mask_kind kind, ckfmha_mask mask) {
  return kind == preferred_mask_kind(mask);
}

}  // namespace ckfmha::runtime
