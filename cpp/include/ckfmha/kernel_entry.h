/*
 * The ABI between generated kernel tables and the runtime registry.
 *
 * The generator writes one table per compiled unit (the library's built-in
 * set, or a JIT module) as an array of ckfmha_kernel_entry, returned by an
 * extern "C" function. The runtime reads tables only through this struct, so
 * a module built by a later JIT run plugs into an already loaded library as
 * long as CKFMHA_KERNEL_ABI_VERSION matches.
 */
#ifndef CKFMHA_KERNEL_ENTRY_H
#define CKFMHA_KERNEL_ENTRY_H

#include "ckfmha/ckfmha.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CKFMHA_KERNEL_ABI_VERSION 16

/* What the runtime hands every launch beside the caller's problem and
 * arguments. */
typedef struct ckfmha_launch_context {
  /* The launching device's record of out-of-range device metadata
   * (kernel/params/device_errors.h), mapped host memory; NULL: not recorded. */
  void* device_errors;
  /* conv_fwd kernels of the direct template (conv_max_channels != 0): the
   * filter to read in place of w's dense layout, a ckfmha::kernel::
   * ConvFilterView (kernel/params/conv_params.h); NULL: dense. The backward-
   * data plan reads w transposed and flipped through it, with no copy. */
  const void* conv_filter_view;
  /* conv_fwd kernels: convolutions running at once on the device (backward-
   * data's phases on side streams), this one among them; 0 or 1: alone. The
   * TMA forward's split over clusters counts on its share of the SMs. */
  int32_t conv_concurrent;
} ckfmha_launch_context;

/* problem/args point at the family's structs: ckfmha_fwd_problem/_args for fwd,
 * ckfmha_bwd_problem/_args for the three backward stages,
 * ckfmha_appendkv_problem/_args for fwd_appendkv, ckfmha_conv_problem and
 * ckfmha_conv_fwd_args for conv_fwd. context may be NULL. */
typedef int (*ckfmha_launch_fn)(const void* problem, const void* args,
                                const ckfmha_launch_context* context, ckfmha_stream_t stream);

/* How many CTAs of the kernel one SM of the current device holds at once, as
 * the CUDA occupancy calculator finds from the registers ptxas gave it, its
 * shared memory and its threads. Returns 0, or -cudaError_t when a CUDA call
 * fails. Only what is compiled knows its register count, so the split-KV
 * planner asks this rather than assuming the worst case. */
typedef int (*ckfmha_resident_ctas_fn)(int32_t* ctas_per_sm);

typedef struct ckfmha_kernel_entry {
  const char* name;
  /* Signature: what the kernel computes. */
  ckfmha_family family;
  ckfmha_dtype dtype;
  ckfmha_mode mode;
  int32_t hdim_q; /* row-wise backward stages: the one head dim they pass over, in both */
  int32_t hdim_v;
  ckfmha_mask_kind mask;
  ckfmha_bias bias;
  int32_t has_lse;
  int32_t has_dropout;
  int32_t has_softcap;
  int32_t has_sink;
  int32_t v_col_major; /* V stored [.., hdim_v, seqlen_k] (keys contiguous) */
  int32_t has_dbias;   /* backward: writes the elementwise bias gradient */
  ckfmha_rope rope;     /* fwd_appendkv: rotary embedding of appended keys */
  int32_t paged_kv;     /* fwd_appendkv: writes a paged cache through a block table */
  ckfmha_page_layout page_layout; /* fwd_pagedkv, batch_prefill: how pages hold keys */
  ckfmha_kv_quant kv_quant;       /* split-KV families: fp8 K/V (e4m3) or K/V in dtype */
  ckfmha_kv_quant q_quant;        /* fwd on sm_90a: fp8 queries (with fp8 K/V), or q in dtype */
  /* Algorithm: how. */
  int32_t arch;          /* 10*major+minor of the SASS target, e.g. 80, 90 */
  const char* arch_name; /* e.g. "sm_90a" */
  const char* pipeline;  /* e.g. "sm80_cpasync_mma" */
  int32_t tile_m;
  int32_t tile_n;
  int32_t tile_k;
  int32_t warps;
  int32_t stages;
  ckfmha_launch_fn launch;
  /* The split-KV families (fwd_splitkv, fwd_pagedkv, batch_prefill); NULL
   * for the others, whose planners do not count resident CTAs. */
  ckfmha_resident_ctas_fn resident_ctas;
  /* 1: the kernel takes only elementwise biases broadcast over the query rows
   * ([b, 1 or h, 1, sk], bias_stride[2] == 0); the dispatcher refuses it the
   * others. The generator sets it and the instance asserts it against its
   * traits (kBiasRowsOnly). */
  int32_t bias_rows_only;
  /* Convolution families (0 elsewhere): 2 or 3 spatial dims, and the channels
   * each load and store moves at once (8: 16-byte vectors of fp16/bf16; 4, 2,
   * 1 for channel counts, strides or pointers that 16 bytes do not divide). */
  int32_t conv_spatial_dims;
  int32_t conv_vector;
  /* 0: any channel count (implicit GEMM); 1, 2, 4 or 8: a kernel for groups
   * of at most that many input and output channels (computed directly). */
  int32_t conv_max_channels;
} ckfmha_kernel_entry;

typedef struct ckfmha_kernel_table {
  int32_t abi_version;
  int32_t count;
  const ckfmha_kernel_entry* entries;
} ckfmha_kernel_table;

/* Symbol of the table compiled into libckfmha itself. */
#define CKFMHA_BUILTIN_TABLE_SYMBOL "ckfmha_builtin_kernel_table"
/* Symbol every JIT-built module exports. */
#define CKFMHA_MODULE_TABLE_SYMBOL "ckfmha_module_kernel_table"
typedef const ckfmha_kernel_table* (*ckfmha_table_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* CKFMHA_KERNEL_ENTRY_H */
