// Host side: the scalars every launch reads the same way from its C API
// problem, forward or backward (the logit scale and soft-cap, the mask's
// window, dropout's threshold and Philox key), so the backward recomputes
// exactly the probabilities the forward produced.
#pragma once

#include "ckfmha/ckfmha.h"

#include <cmath>
#include <cstdint>

namespace ckfmha::kernel {

// Params: FwdParams or BwdParams; Problem: ckfmha_fwd_problem or ckfmha_bwd_problem.
template <class Params, class Problem>
inline void set_problem_scalars(Params& p, Problem const& problem) {
  p.scale = problem.scale;
  p.scale_log2 = problem.scale * float(M_LOG2E);
  p.softcap = problem.softcap;
  p.softcap_prescale = problem.softcap > 0.f ? problem.scale / problem.softcap : 0.f;

  switch (problem.mask) {
    case CKFMHA_MASK_CAUSAL_TOP_LEFT:
    case CKFMHA_MASK_CAUSAL_BOTTOM_RIGHT:
      p.window_left = -1;
      p.window_right = 0;
      break;
    case CKFMHA_MASK_WINDOW_TOP_LEFT:
    case CKFMHA_MASK_WINDOW_BOTTOM_RIGHT:
      p.window_left = problem.window_left;
      p.window_right = problem.window_right;
      break;
    default:
      p.window_left = -1;
      p.window_right = -1;
  }
  p.bottom_right = problem.mask == CKFMHA_MASK_CAUSAL_BOTTOM_RIGHT ||
                   problem.mask == CKFMHA_MASK_WINDOW_BOTTOM_RIGHT;

  // p < 1 is checked by the runtime; floor(p * 256) <= 255 then.
  p.dropout_threshold = uint32_t(problem.dropout_p * 256.f);
  p.dropout_rescale = problem.dropout_p > 0.f ? 1.f / (1.f - problem.dropout_p) : 1.f;
  p.philox_key0 = uint32_t(problem.dropout_seed);
  p.philox_key1 = uint32_t(problem.dropout_seed >> 32) ^ uint32_t(problem.dropout_offset >> 32);
  p.philox_offset = uint32_t(problem.dropout_offset);
}

}  // namespace ckfmha::kernel
