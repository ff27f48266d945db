/*
 * ckfmha public C API.
 *
 * Plain C structs and enums only: no C++ or CUDA types cross this boundary, so
 * the header can be used from C, Cython (ckfmha/__init__.pxd mirrors it) and
 * any FFI. Every function returns a ckfmha_status; on failure
 * ckfmha_last_error() holds a message (per thread) saying what was wrong and
 * what is supported.
 *
 * Pointers in argument structs are device pointers. Strides are in elements
 * and 64-bit, so tensors larger than 2^31 elements index correctly.
 */
#ifndef CKFMHA_CKFMHA_H
#define CKFMHA_CKFMHA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define CKFMHA_API __declspec(dllexport)
#else
#define CKFMHA_API __attribute__((visibility("default")))
#endif

#define CKFMHA_VERSION_MAJOR 0
#define CKFMHA_VERSION_MINOR 1
#define CKFMHA_VERSION_PATCH 0

/* Layout-compatible with cudaStream_t without requiring CUDA headers. */
typedef struct CUstream_st* ckfmha_stream_t;

typedef enum ckfmha_status {
  CKFMHA_SUCCESS = 0,
  CKFMHA_ERROR_INVALID_ARGUMENT = 1, /* malformed problem or arguments */
  CKFMHA_ERROR_UNSUPPORTED = 2,      /* well-formed, but no kernel covers it */
  CKFMHA_ERROR_CUDA = 3,             /* a CUDA runtime call failed */
  CKFMHA_ERROR_NO_DEVICE = 4,        /* no usable CUDA device */
  CKFMHA_ERROR_BUFFER_TOO_SMALL = 5, /* output buffer too small; size reported */
  CKFMHA_ERROR_NOT_FOUND = 6,        /* named kernel or module not found */
  CKFMHA_ERROR_INTERNAL = 7
} ckfmha_status;

typedef enum ckfmha_dtype {
  CKFMHA_DTYPE_FP16 = 0,
  CKFMHA_DTYPE_BF16 = 1,
  CKFMHA_DTYPE_FP32 = 2
} ckfmha_dtype;

typedef enum ckfmha_family {
  CKFMHA_FAMILY_FWD = 0
} ckfmha_family;

typedef enum ckfmha_mode {
  CKFMHA_MODE_BATCH = 0,
  CKFMHA_MODE_GROUP = 1 /* varlen with cu_seqlens */
} ckfmha_mode;

/* Mask a problem asks for. */
typedef enum ckfmha_mask {
  CKFMHA_MASK_NONE = 0,
  CKFMHA_MASK_CAUSAL_TOP_LEFT = 1,    /* key j visible to query i iff j <= i */
  CKFMHA_MASK_CAUSAL_BOTTOM_RIGHT = 2 /* iff j <= i + seqlen_k - seqlen_q */
} ckfmha_mask;

/* Mask a kernel is compiled for (one causal kernel serves both alignments). */
typedef enum ckfmha_mask_kind {
  CKFMHA_MASK_KIND_NONE = 0,
  CKFMHA_MASK_KIND_CAUSAL = 1
} ckfmha_mask_kind;

typedef enum ckfmha_layout {
  CKFMHA_LAYOUT_BHSD = 0, /* [batch, heads, seqlen, hdim] */
  CKFMHA_LAYOUT_BSHD = 1  /* [batch, seqlen, heads, hdim] */
} ckfmha_layout;

/*
 * Forward problem. Shapes: q [batch, nhead_q, seqlen_q, hdim_q],
 * k [batch, nhead_k, seqlen_k, hdim_q], v [batch, nhead_k, seqlen_k, hdim_v],
 * o [batch, nhead_q, seqlen_q, hdim_v], lse [batch, nhead_q, seqlen_q] fp32
 * contiguous. Each tensor's strides are given as (batch, head, seq) in
 * elements; the head-dim stride must be 1. nhead_q must be a multiple of
 * nhead_k (GQA/MQA).
 */
typedef struct ckfmha_fwd_problem {
  ckfmha_dtype dtype;
  ckfmha_mode mode;
  int32_t batch;
  int32_t nhead_q;
  int32_t nhead_k;
  int32_t seqlen_q;
  int32_t seqlen_k;
  int32_t hdim_q;
  int32_t hdim_v;
  ckfmha_mask mask;
  float scale; /* softmax scale applied to q.k */
  int32_t store_lse;
  int64_t q_stride[3];
  int64_t k_stride[3];
  int64_t v_stride[3];
  int64_t o_stride[3];
} ckfmha_fwd_problem;

typedef struct ckfmha_fwd_args {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse; /* required when store_lse, else ignored */
} ckfmha_fwd_args;

/* ---- errors and versions ---- */
CKFMHA_API const char* ckfmha_last_error(void);
CKFMHA_API const char* ckfmha_status_name(int status);
CKFMHA_API int ckfmha_version(int* major, int* minor, int* patch);

/* ---- problems ---- */
/* Fills a problem with contiguous strides for the given layout, no mask,
 * scale 1/sqrt(hdim_q), no LSE. */
CKFMHA_API int ckfmha_fwd_problem_init(ckfmha_fwd_problem* problem, ckfmha_dtype dtype,
                                       ckfmha_layout layout, int32_t batch, int32_t nhead_q,
                                       int32_t nhead_k, int32_t seqlen_q, int32_t seqlen_k,
                                       int32_t hdim_q, int32_t hdim_v);
/* Checks shapes and strides without looking for a kernel. */
CKFMHA_API int ckfmha_fwd_problem_validate(const ckfmha_fwd_problem* problem);

/* ---- devices and memory (so bindings need not link the CUDA runtime) ---- */
CKFMHA_API int ckfmha_device_count(int* count);
/* arch as 10*major+minor, e.g. 90 for sm_90 */
CKFMHA_API int ckfmha_device_arch(int device, int* arch);
CKFMHA_API int ckfmha_current_device(int* device);
CKFMHA_API int ckfmha_device_malloc(void** ptr, size_t bytes);
CKFMHA_API int ckfmha_device_free(void* ptr);
CKFMHA_API int ckfmha_memcpy_to_device(void* dst, const void* src, size_t bytes);
CKFMHA_API int ckfmha_memcpy_to_host(void* dst, const void* src, size_t bytes);
CKFMHA_API int ckfmha_memset_device(void* dst, int value, size_t bytes);
CKFMHA_API int ckfmha_stream_synchronize(ckfmha_stream_t stream);

/* ---- registry ---- */
CKFMHA_API int ckfmha_registry_count(int* count);
/* Copies kernel `index`'s name into buf (NUL-terminated). */
CKFMHA_API int ckfmha_registry_name(int index, char* buf, size_t buf_len);
/* JSON array of every registered kernel; *needed gets the size incl. NUL. */
CKFMHA_API int ckfmha_registry_json(char* buf, size_t buf_len, size_t* needed);
/* Loads a kernel module (a shared library built by the JIT) and registers its
 * kernels; *added gets how many were new. */
CKFMHA_API int ckfmha_registry_load_module(const char* path, int* added);

/* ---- dispatch ---- */
/* arch < 0 means the current device's arch. Writes the chosen kernel's name. */
CKFMHA_API int ckfmha_fwd_select(const ckfmha_fwd_problem* problem, int arch, char* name_buf,
                                 size_t buf_len);
/* Text explaining, kernel by kernel, why each does or does not fit. */
CKFMHA_API int ckfmha_fwd_explain(const ckfmha_fwd_problem* problem, int arch, char* buf,
                                  size_t buf_len, size_t* needed);
/* Selects a kernel for the current device and launches it on `stream`.
 * kernel_name may be NULL (automatic) or force a registered kernel. */
CKFMHA_API int ckfmha_fwd_run(const ckfmha_fwd_problem* problem, const ckfmha_fwd_args* args,
                              const char* kernel_name, ckfmha_stream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* CKFMHA_CKFMHA_H */
