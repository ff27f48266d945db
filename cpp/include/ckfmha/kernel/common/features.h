// Compile-time feature switches of every kernel, forward and backward. Each is
// a template parameter so a kernel without a feature carries none of its
// instructions.
#pragma once

namespace ckfmha::kernel {

enum class MaskMode {
  kNone,    // every key visible (up to seqlen_k)
  kCausal,  // j <= i + offset: a window with right bound 0 and no left bound
  kWindow,  // run-time left/right bounds; also serves causal problems
};

enum class BiasMode {
  kNone,
  kElementwise,  // additive tensor [batch, head, seqlen_q, seqlen_k], broadcastable
  kAlibi,        // -slope * |i + seqlen_k - seqlen_q - j|
};

}  // namespace ckfmha::kernel
