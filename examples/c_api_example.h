/*
 * What the C examples share: a check that turns a failed ckfmha call into an
 * exit status with ckfmha's message, the stop before the first launch on a
 * machine without a GPU, device copies of host buffers, bf16 conversions,
 * fixed pseudo-random inputs and a float64 reference for one attention row.
 *
 * The examples reach device memory only through ckfmha's own calls, so they
 * compile against ckfmha.h alone, without the CUDA headers, and a failing CUDA
 * runtime call comes back through the same check (CKFMHA_ERROR_CUDA, with
 * CUDA's error string in ckfmha_last_error()).
 */
#ifndef CKFMHA_EXAMPLES_C_API_EXAMPLE_H
#define CKFMHA_EXAMPLES_C_API_EXAMPLE_H

#include <ckfmha/ckfmha.h>

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The exit status of an example whose problem no kernel of this build serves
 * (a library built with a narrow CKFMHA_KERNELS or CKFMHA_ARCHS): automake's
 * "skipped", so a test harness can tell it from a wrong result. */
#define EXAMPLE_SKIPPED 77

/* For main(): on failure, prints the call, the status and ckfmha's message, and
 * returns 1 (EXAMPLE_SKIPPED where the status says no kernel fits). */
#define CHECK(call)                                                                  \
  do {                                                                               \
    int status_ = (call);                                                            \
    if (status_ != CKFMHA_SUCCESS) {                                                 \
      fprintf(stderr, "%s: %s: %s\n", #call, ckfmha_status_name(status_),            \
              ckfmha_last_error());                                                  \
      return status_ == CKFMHA_ERROR_UNSUPPORTED ? EXAMPLE_SKIPPED : 1;              \
    }                                                                                \
  } while (0)

/* For main(), after the part that needs no device (planning for a named arch):
 * without a GPU there is nothing to launch, which is not a failure. */
#define RETURN_IF_NO_GPU()                                                           \
  do {                                                                               \
    int devices_ = 0;                                                                \
    CHECK(ckfmha_device_count(&devices_));                                           \
    if (devices_ == 0) {                                                             \
      printf("no GPU: stopping before the launch\n");                                \
      return 0;                                                                      \
    }                                                                                \
  } while (0)

/* A new device buffer holding `bytes` of host memory; the status of the call
 * that failed, so CHECK reports it. */
static inline int upload(void** device, const void* host, size_t bytes) {
  int status = ckfmha_device_malloc(device, bytes);
  return status != CKFMHA_SUCCESS ? status : ckfmha_memcpy_to_device(*device, host, bytes);
}

/* Round to nearest even, as the kernel stores its fp32 results (inputs here are finite). */
static inline uint16_t bf16_from_float(float x) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof bits);
  bits += 0x7fff + ((bits >> 16) & 1);
  return (uint16_t)(bits >> 16);
}

/* The float with these bits. */
static inline float float_from_bits(uint32_t bits) {
  float x;
  memcpy(&x, &bits, sizeof x);
  return x;
}

static inline float float_from_bf16(uint16_t h) { return float_from_bits((uint32_t)h << 16); }

/* The next value of a xorshift32 stream: fixed seeds give the same inputs every run. */
static inline uint32_t next_xorshift32(uint32_t* state) {
  *state ^= *state << 13;
  *state ^= *state >> 17;
  *state ^= *state << 5;
  return *state;
}

/* bf16 values uniform in [-1, 1) from a xorshift32 seed. */
static inline void fill_random_bf16(uint16_t* host, size_t count, uint32_t seed) {
  uint32_t state = seed;
  for (size_t i = 0; i < count; ++i) {
    const uint32_t r = next_xorshift32(&state);
    host[i] = bf16_from_float((float)(r >> 8) / (float)(1u << 23) - 1.0f);
  }
}

/* A finite fp16 value (normal or zero; the fp16 inputs here are normal and
 * fp16 outputs of softmax-weighted means of them stay in range). */
static inline float float_from_fp16(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1f;
  return float_from_bits(exponent == 0 ? sign
                                       : sign | ((exponent + 112) << 23) |
                                             ((uint32_t)(h & 0x3ff) << 13));
}

/* fp16 values of magnitude in [0.25, 1) (exponents 13 and 14) with random sign
 * and mantissa, from a xorshift32 seed: built from bits, no conversion. */
static inline void fill_random_fp16(uint16_t* host, size_t count, uint32_t seed) {
  uint32_t state = seed;
  for (size_t i = 0; i < count; ++i) {
    const uint32_t r = next_xorshift32(&state);
    host[i] = (uint16_t)(((r >> 31) << 15) | ((13 + ((r >> 30) & 1)) << 10) | ((r >> 8) & 0x3ff));
  }
}

/* Adds one output row's squared error and squared reference to the
 * running sums: the query row q attending to the `len` key and value rows
 * k_rows[j], v_rows[j] with softmax scale `scale`, computed in double (with
 * no keys the reference row is zeros); to_float reads the 16-bit elements
 * (float_from_bf16, float_from_fp16). A NaN output makes the error infinite.
 * `weights`: scratch for `len` doubles. Compare sqrt(error / reference), a
 * relative L2 error: outputs averaged over many random rows are small, so an
 * absolute bound could pass a zero output. */
static inline void add_attention_row_error(float (*to_float)(uint16_t), const uint16_t* q,
                                           const uint16_t* const* k_rows,
                                           const uint16_t* const* v_rows, int len, int hdim,
                                           double scale, const uint16_t* got, double* weights,
                                           double* error_sq, double* reference_sq) {
  double top = -INFINITY, sum = 0.0;
  for (int j = 0; j < len; ++j) {
    double dot = 0.0;
    for (int d = 0; d < hdim; ++d) {
      dot += (double)to_float(q[d]) * to_float(k_rows[j][d]);
    }
    weights[j] = dot * scale;
    if (weights[j] > top) top = weights[j];
  }
  for (int j = 0; j < len; ++j) sum += weights[j] = exp(weights[j] - top);
  for (int d = 0; d < hdim; ++d) {
    double want = 0.0;
    for (int j = 0; j < len; ++j) want += weights[j] * to_float(v_rows[j][d]);
    if (len > 0) want /= sum;
    const double error = (double)to_float(got[d]) - want;
    *error_sq += isnan(error) ? INFINITY : error * error;
    *reference_sq += want * want;
  }
}

#endif /* CKFMHA_EXAMPLES_C_API_EXAMPLE_H */
