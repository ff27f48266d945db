/*
 * What the C examples share: a check that turns a failed ckfmha call into an
 * exit status with ckfmha's message, the stop before the first launch on a
 * machine without a GPU, device copies of host buffers and a fixed input
 * pattern.
 *
 * The examples reach device memory only through ckfmha's own calls, so they
 * compile against ckfmha.h alone, without the CUDA headers, and a failing CUDA
 * runtime call comes back through the same check (CKFMHA_ERROR_CUDA, with
 * CUDA's error string in ckfmha_last_error()).
 */
#ifndef CKFMHA_EXAMPLES_C_API_EXAMPLE_H
#define CKFMHA_EXAMPLES_C_API_EXAMPLE_H

#include <ckfmha/ckfmha.h>

#include <stddef.h>
#include <stdio.h>

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

/* 16-bit inputs without float-to-half code: 0x3c00 (fp16 1.0, bf16 2^-7) with
 * its low mantissa bits cycling through `period` values; a period of at most
 * 1024 (fp16) or 128 (bf16) stays inside the mantissa, so every value is finite
 * and within a factor of two of the base. */
static inline void fill_pattern(unsigned short* host, size_t count, unsigned period) {
  for (size_t i = 0; i < count; ++i) host[i] = 0x3c00 ^ (unsigned short)(i % period);
}

#endif /* CKFMHA_EXAMPLES_C_API_EXAMPLE_H */
