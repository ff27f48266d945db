// 2^x on the FMA and integer pipes instead of the special-function unit.
//
// The softmax needs one exponential per score. The special-function unit
// (MUFU) retires 16 of them per clock per SM, a quarter of a warp's 32 lanes
// per clock on each of the four schedulers, so at head dim 64 a consumer
// warp's 64 exponentials per key tile take as long as the other warpgroup's
// products (entry 63 of benchmarks/NOTES.md). Computing a share of them here
// moves that work to the FMA pipe, which has cycles to spare.
//
// 2^x = 2^j * 2^f with j = round(x) and f = x - j in [-0.5, 0.5]: 2^f is a
// cubic (minimax for relative error, max 7.5e-5: below a bf16 or fp16
// rounding of the probability it feeds) and 2^j is added to its exponent
// field. The rounding uses the 1.5 * 2^23 trick, so no conversion
// instruction (those share the special-function pipe) is needed.
#pragma once

#include <cstdint>

namespace ckfmha::kernel {

// Valid for finite x <= 0 (softmax arguments after the row maximum is
// subtracted). Below about -125 the result is some number under 2^-124
// (denormals flush to zero in the fast-math build): a relative weight no
// softmax sum can see. A row of -inf (masked) scores must use exp2f, which
// returns the exact zeros such rows rely on.
__device__ __forceinline__ float exp2_fma(float x) {
  constexpr float kRoundMagic = 12582912.f;  // 1.5 * 2^23: x + it rounds x to an integer
  x = fmaxf(x, -126.f);
  const float rounded = x + kRoundMagic;  // j sits in the low mantissa bits
  const float f = x - (rounded - kRoundMagic);
  float poly = 0.05517132f;
  poly = fmaf(poly, f, 0.24261054f);
  poly = fmaf(poly, f, 0.69326099f);
  poly = fmaf(poly, f, 0.99992811f);
  // (bits of rounded) << 23 keeps j's low 9 bits there as a two's complement
  // shift of the exponent field; one multiply-add applies it.
  const uint32_t bits =
      __float_as_uint(rounded) * (1u << 23) + __float_as_uint(poly);
  return __uint_as_float(bits);
}

}  // namespace ckfmha::kernel
