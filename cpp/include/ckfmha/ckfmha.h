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
  CKFMHA_ERROR_INTERNAL = 7,
  /* A kernel met device metadata (cu_seqlens, page ids, key counts) that
   * pointed outside the buffers; it read and wrote nothing there. Reported
   * by the next call on that device, see ckfmha_check_device_errors. */
  CKFMHA_ERROR_DEVICE_METADATA = 8
} ckfmha_status;

typedef enum ckfmha_dtype {
  CKFMHA_DTYPE_FP16 = 0,
  CKFMHA_DTYPE_BF16 = 1,
  CKFMHA_DTYPE_FP32 = 2
} ckfmha_dtype;

/* Kernel families. A plan may chain several: split-KV runs fwd_splitkv then
 * fwd_splitkv_combine; backward runs bwd_dot_do_o, bwd_dq_dk_dv, bwd_convert_dq. */
typedef enum ckfmha_family {
  CKFMHA_FAMILY_FWD = 0,
  CKFMHA_FAMILY_FWD_SPLITKV = 1,
  CKFMHA_FAMILY_FWD_SPLITKV_COMBINE = 2,
  CKFMHA_FAMILY_FWD_PAGEDKV = 3,
  CKFMHA_FAMILY_FWD_APPENDKV = 4,
  CKFMHA_FAMILY_BATCH_PREFILL = 5,
  CKFMHA_FAMILY_BWD_DOT_DO_O = 6,
  CKFMHA_FAMILY_BWD_DQ_DK_DV = 7,
  CKFMHA_FAMILY_BWD_CONVERT_DQ = 8,
  CKFMHA_FAMILY_CONV_FWD = 9, /* grouped convolution, forward (ckfmha_conv_*); also the
                                backward-data plan's stages */
  CKFMHA_FAMILY_CONV_BWD_WEIGHT = 10 /* grouped convolution, backward-weight */
} ckfmha_family;

typedef enum ckfmha_mode {
  CKFMHA_MODE_BATCH = 0,
  CKFMHA_MODE_GROUP = 1 /* varlen with cu_seqlens */
} ckfmha_mode;

/* Mask a problem asks for. Causal masks are windows (left unbounded, right 0);
 * window masks take window_left/window_right from the problem. "Top-left"
 * aligns query 0 with key 0, "bottom-right" aligns the last query with the
 * last key: with off = 0 or seqlen_k - seqlen_q, key j is visible to query i
 * iff (left < 0 || j >= i + off - left) && (right < 0 || j <= i + off + right). */
typedef enum ckfmha_mask {
  CKFMHA_MASK_NONE = 0,
  CKFMHA_MASK_CAUSAL_TOP_LEFT = 1,
  CKFMHA_MASK_CAUSAL_BOTTOM_RIGHT = 2,
  CKFMHA_MASK_WINDOW_TOP_LEFT = 3,
  CKFMHA_MASK_WINDOW_BOTTOM_RIGHT = 4
} ckfmha_mask;

/* Mask a kernel is compiled for: a causal kernel serves both causal
 * alignments; a window kernel serves every mask except none. */
typedef enum ckfmha_mask_kind {
  CKFMHA_MASK_KIND_NONE = 0,
  CKFMHA_MASK_KIND_CAUSAL = 1,
  CKFMHA_MASK_KIND_WINDOW = 2
} ckfmha_mask_kind;

/* Additive logit bias. */
typedef enum ckfmha_bias {
  CKFMHA_BIAS_NONE = 0,
  CKFMHA_BIAS_ELEMENTWISE = 1, /* bias tensor [batch, nhead_q, seqlen_q, seqlen_k] in the input dtype */
  CKFMHA_BIAS_ALIBI = 2        /* -slope[b, h] * |i + seqlen_k - seqlen_q - j|, fp32 slopes */
} ckfmha_bias;

/* Where a forward problem's K and V live (see the paged K/V note below). */
typedef enum ckfmha_kv_storage {
  CKFMHA_KV_CONTIGUOUS = 0,   /* k, v tensors as the problem's strides describe */
  CKFMHA_KV_PAGED_TABLE = 1,  /* page caches + a vLLM block table [batch, max_pages_per_seq] */
  CKFMHA_KV_PAGED_INDPTR = 2  /* page caches + SGLang kv_indices and kv_indptr [batch + 1] */
} ckfmha_kv_storage;

/* How a page holds its keys. */
typedef enum ckfmha_page_layout {
  CKFMHA_PAGE_LAYOUT_LINEAR = 0,    /* k, v [num_pages, page_size, nhead_k, hdim] (vLLM flash) */
  CKFMHA_PAGE_LAYOUT_VECTORIZED = 1 /* vLLM's older k [pages, nhead_k, hdim/8, page_size, 8],
                                       v [pages, nhead_k, hdim, page_size] (2-byte dtypes) */
} ckfmha_page_layout;

/* How K and V are stored when they are not in the problem's dtype. */
typedef enum ckfmha_kv_quant {
  CKFMHA_KV_QUANT_NONE = 0,    /* k, v in the problem's dtype */
  CKFMHA_KV_QUANT_FP8_E4M3 = 1 /* k, v one byte per element, e4m3 (float8_e4m3fn), scaled */
} ckfmha_kv_quant;

typedef enum ckfmha_layout {
  CKFMHA_LAYOUT_BHSD = 0, /* [batch, heads, seqlen, hdim] */
  CKFMHA_LAYOUT_BSHD = 1  /* [batch, seqlen, heads, hdim] */
} ckfmha_layout;

/*
 * Forward problem.
 *
 * Batch mode: q [batch, nhead_q, seqlen_q, hdim_q], k [batch, nhead_k,
 * seqlen_k, hdim_q], v [batch, nhead_k, seqlen_k, hdim_v], o [batch, nhead_q,
 * seqlen_q, hdim_v]; each tensor's strides are (batch, head, seq) in elements
 * and the head-dim stride is 1 (v_col_major: v's seq stride is 1 and
 * v_stride[2] is its head-dim stride). Pointers must be 16-byte aligned and
 * strides multiples of 8 elements, except for column-major v, which may start
 * at any element and have any strides (misaligned keys are loaded one by one).
 *
 * Group mode (varlen): `batch` sequences packed along the token axis;
 * cu_seqlens_q/k (int32, batch+1 entries, device memory) give each sequence's
 * start, and seqlen_q/seqlen_k must be at least the longest sequence (the grid
 * is sized from them). Batch strides are ignored; rows are tokens. total_q and
 * total_k, the packed tensors' token counts, are required (0 means no
 * tokens): kernels check every sequence range they read from cu_seqlens
 * against them (see "Device metadata" below), and the Hopper template's TMA
 * descriptors span them.
 *
 * Device metadata (cu_seqlens, block tables, kv_indptr/kv_indices,
 * seqlens_k) is read by the kernels, so the host cannot check it without a
 * synchronisation. Kernels bound it instead: a sequence whose range leaves
 * the packed tensors, runs backwards or passes seqlen_q/seqlen_k, whose
 * kv_indptr range leaves kv_indices, or whose key count passes what its
 * pages hold is skipped (its outputs are undefined); a page id outside
 * [0, num_pages) is read as a page of zeros. Nothing outside the caller's
 * buffers is read or written, and the next call on the device fails with
 * CKFMHA_ERROR_DEVICE_METADATA naming the kind and a sequence
 * (ckfmha_check_device_errors asks at once).
 *
 * The logits are scale * q.k, then optionally softcap * tanh(logits /
 * softcap), plus bias; masked logits are -inf. A sink adds exp(sink[h]) to
 * each row's softmax denominator without a value row. Dropout zeroes
 * probabilities after the softmax (the LSE is of the undropped softmax) and
 * scales kept ones by 1/(1-p).
 */
typedef struct ckfmha_fwd_problem {
  ckfmha_dtype dtype;
  ckfmha_mode mode;
  int32_t batch;
  int32_t nhead_q;
  int32_t nhead_k;
  int32_t seqlen_q; /* group mode: max over sequences */
  int32_t seqlen_k; /* group mode: max over sequences */
  int32_t hdim_q;
  int32_t hdim_v;
  ckfmha_mask mask;
  int32_t window_left;  /* window masks only; -1 = unbounded */
  int32_t window_right; /* window masks only; -1 = unbounded */
  float scale;          /* softmax scale applied to q.k */
  float softcap;        /* > 0 enables logit soft-capping */
  ckfmha_bias bias;
  int32_t has_sink;     /* sink logits, fp32 [nhead_q] */
  float dropout_p;      /* in [0, 1); 0 disables dropout */
  uint64_t dropout_seed;
  uint64_t dropout_offset;
  int32_t store_dropout_randval; /* write the uint8 random values (see ckfmha_fwd_args) */
  int32_t skip_min_seqlen_q;     /* group mode: sequences shorter than this are skipped */
  int32_t v_col_major;
  int32_t store_lse;
  int64_t q_stride[3];
  int64_t k_stride[3];
  int64_t v_stride[3];
  int64_t o_stride[3];
  int64_t lse_stride[2];  /* (batch, head); rows contiguous. Group mode: batch ignored, rows are tokens */
  int64_t bias_stride[3]; /* (batch, head, row); 0 broadcasts; columns contiguous */
  int64_t alibi_stride;   /* batch stride of the slopes [batch, nhead_q]; 0 shares one row */
  /* Group mode: tokens in the packed q/o and k/v tensors (0 = not given).
   * Kernels that address the packed tensors with TMA descriptors (the sm90
   * template) need them; without them the dispatcher picks another kernel. */
  int64_t total_q;
  int64_t total_k;
  /* Split-KV: 0 lets the dispatcher choose (a two-stage split-KV plan where it
   * pays and args.workspace is given, see ckfmha_fwd_workspace_size, or the
   * split-KV kernel alone as one split writing O directly, which needs no
   * workspace); 1 forces the one-stage forward; n > 1 forces a split-KV plan
   * with n key splits. */
  int32_t num_splits;
  /*
   * Paged K/V cache (kv_storage != CKFMHA_KV_CONTIGUOUS): k and v point at
   * page caches [num_pages, page_size, nhead_k, hdim_q / hdim_v] and
   * k_stride/v_stride are (page, head, token in page) strides. With
   * page_layout vectorized (fp16/bf16), k is [num_pages, nhead_k, hdim / 8,
   * page_size, 8] with k_stride (page, head, 8-channel chunk) and each chunk's
   * [page_size, 8] dense, and v is [num_pages, nhead_k, hdim, page_size] with
   * v_stride (page, head, channel) and each channel's keys contiguous. Sequence b's
   * keys are the tokens of its pages in order: block_table row b (its first
   * max_pages_per_seq entries, rows block_table_stride apart) or
   * kv_indices[kv_indptr[b] .. kv_indptr[b + 1]); args.seqlens_k[b] keys of
   * them (optional with kv_indptr: every key of the pages), at most what the
   * pages hold. page_size is a power of two >= 1. Batch mode runs a
   * fwd_pagedkv plan (q as above, e.g. a decode step); group mode a
   * batch_prefill plan (ragged queries from cu_seqlens_q, no cu_seqlens_k).
   * seqlen_k is an upper bound of the sequences' key counts (it sizes the
   * split count). Both plans are split-KV plans (the combine stage follows)
   * and need args.workspace, except with one split, which writes O directly; masks, soft-cap, LSE and GQA apply, with
   * positions local to each sequence (bottom-right: the last query sees the
   * sequence's last key).
   */
  ckfmha_kv_storage kv_storage;
  ckfmha_page_layout page_layout;
  int32_t page_size;
  int32_t max_pages_per_seq;  /* CKFMHA_KV_PAGED_TABLE: table entries per sequence */
  int64_t block_table_stride; /* CKFMHA_KV_PAGED_TABLE: elements between table rows */
  int32_t num_pages;          /* paged: pages in the k and v caches (page ids are checked) */
  int64_t num_kv_indices;     /* CKFMHA_KV_PAGED_INDPTR: entries of kv_indices */
  /*
   * fp8 K/V (kv_quant CKFMHA_KV_QUANT_FP8_E4M3): k and v hold e4m3 bytes and
   * stand for k_scale * k and v_scale * v; strides stay in elements (= bytes)
   * and must be multiples of 16. q and o stay in dtype (fp16 or bf16). The
   * scales are read on the device from args.k_scale / args.v_scale (fp32: one
   * value, or nhead_k values with kv_scale_per_head), so a captured graph
   * follows their updates; where those pointers are NULL, the scalars below
   * are used (positive and finite). Served by the split-KV families
   * (contiguous K/V, linear pages) on sm_89 and later, which convert e4m3 to
   * dtype exactly before the tensor-core products.
   */
  ckfmha_kv_quant kv_quant;
  int32_t kv_scale_per_head;
  float k_scale; /* set to 1 by ckfmha_fwd_problem_init */
  float v_scale;
  /*
   * fp8 queries (q_quant CKFMHA_KV_QUANT_FP8_E4M3, which needs kv_quant fp8
   * too): q holds e4m3 bytes standing for q_scale * q, and both products run
   * in e4m3 on the tensor cores: P is quantised to e4m3 for the P V product.
   * o stays in dtype (fp16 or bf16). The scale is read from args.q_scale
   * when given (one value, or nhead_q values with kv_scale_per_head), else
   * the scalar. Served by the Hopper forward (sm_90a), batch and group mode.
   */
  ckfmha_kv_quant q_quant;
  float q_scale; /* set to 1 by ckfmha_fwd_problem_init */
  /*
   * Per-block scales (fp8 queries only): q, k and v each carry one fp32 scale
   * per block of CKFMHA_FP8_SCALE_BLOCK tokens of one head, read from the
   * device arrays args.q_scale [batch][nhead_q][ceil(seqlen_q / 128)] and
   * args.k_scale / args.v_scale [batch][nhead_k][ceil(seqlen_k / 128)]
   * (contiguous; group mode: batch counts sequences, blocks start at each
   * sequence's first token, seqlen_q/seqlen_k are the longest). Scales must
   * be positive and finite. Excludes kv_scale_per_head (block scales are
   * already per head) and the host scalars.
   */
  int32_t fp8_block_scales;
} ckfmha_fwd_problem;

/* Tokens of one head that share a per-block fp8 scale (fp8_block_scales),
 * and the blocks of a sequence of n tokens. */
#define CKFMHA_FP8_SCALE_BLOCK 128
#define CKFMHA_FP8_SCALE_BLOCKS(n) (((n) + CKFMHA_FP8_SCALE_BLOCK - 1) / CKFMHA_FP8_SCALE_BLOCK)

/*
 * Dropout random values: element (b, h, i, j) (i, j local to the sequence)
 * is byte ((j % 64) / 8) * 2 + j % 2 of Philox4x32-10 with key (seed_lo,
 * seed_hi ^ offset_hi) and counter ((j / 64) * 4 + (j % 8) / 2, i,
 * b * nhead_q + h, offset_lo), the four output words read as 16 little-endian
 * bytes (one call covers the 16 keys of a 64-key block with one (j % 8) / 2). The probability is dropped iff that byte is
 * below floor(p * 256). dropout_randval, when stored, is uint8
 * [batch, nhead_q, seqlen_q, seqlen_k] contiguous (group mode: the max lengths).
 */
typedef struct ckfmha_fwd_args {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;                  /* required when store_lse */
  const void* bias;            /* required for elementwise bias (input dtype) */
  const float* alibi_slopes;   /* required for ALiBi */
  const float* sink;           /* required when has_sink */
  const int32_t* cu_seqlens_q; /* required in group mode */
  const int32_t* cu_seqlens_k; /* required in group mode */
  uint8_t* dropout_randval;    /* required when store_dropout_randval */
  /* Scratch for two-stage plans (split-KV partials), device memory of at least
   * ckfmha_fwd_workspace_size bytes, 16-byte aligned, used only during the
   * call's kernels on its stream. NULL: automatic plans use none that needs
   * it (one-stage, or one split). */
  void* workspace;
  size_t workspace_bytes;
  /* Paged K/V (device memory, int32): see ckfmha_fwd_problem.kv_storage. */
  const int32_t* block_table; /* CKFMHA_KV_PAGED_TABLE: [batch, block_table_stride] page ids */
  const int32_t* kv_indices;  /* CKFMHA_KV_PAGED_INDPTR: page ids of every sequence, flat */
  const int32_t* kv_indptr;   /* CKFMHA_KV_PAGED_INDPTR: batch + 1 offsets into kv_indices */
  const int32_t* seqlens_k;   /* [batch] keys per sequence; required with a block table */
  /* fp8 K/V: device fp32 dequantisation scales, 1 value or nhead_k values
   * (problem.kv_scale_per_head); NULL: problem.k_scale / problem.v_scale. */
  const float* k_scale;
  const float* v_scale;
  /* fp8 queries: device fp32 dequantisation scale, 1 value or nhead_q values
   * (problem.kv_scale_per_head), or per block (problem.fp8_block_scales);
   * NULL: problem.q_scale. */
  const float* q_scale;
} ckfmha_fwd_args;

/*
 * Backward problem: gradients of sum(dO * O) for the forward problem with the
 * same fields. Runs as a plan of three kernels on one stream:
 *   bwd_dot_do_o   D = rowsum(dO * O) in fp32, and zeroes the dQ accumulator;
 *                  with has_sink, a second kernel of this stage then reduces
 *                  the sink gradient from D and the LSE (see has_sink);
 *   bwd_dq_dk_dv   one CTA per key tile (and KV head) recomputes P from the
 *                  forward's LSE, accumulates dK and dV over the query tiles of
 *                  every query head of its group (GQA/MQA sums in registers)
 *                  and adds dS K to an fp32 dQ accumulator;
 *   bwd_convert_dq dQ = scale * accumulator, in the output dtype.
 *
 * Tensors as in the forward problem: q, k, v, o and lse as the forward saw
 * them (lse in natural log, fp32), do shaped like o, dq like q, dk like k and
 * dv like v; each with (batch, head, seq) strides and a contiguous head dim.
 * Group mode as in the forward: tokens are rows and cu_seqlens_q/k give the
 * sequences; seqlen_q/seqlen_k are the longest ones.
 *
 * Workspace: ckfmha_bwd_workspace_size() says how many bytes the plan needs;
 * the caller allocates them (16-byte aligned device memory, contents
 * irrelevant) and passes them in args, so no allocation ever happens inside a
 * call. The workspace holds D and the log2-domain LSE ([batch, nhead_q, rows]
 * fp32 each) and the dQ accumulator ([splits, batch, nhead_q, rows, hdim_q]
 * fp32), where rows is seqlen_q rounded up to a multiple of 64.
 *
 * deterministic = 0 (fast): dQ partials are added with fp32 atomics, so the
 * order of the additions, and the last bits of dQ, can differ between runs.
 * deterministic = 1: the key tiles of each (batch, KV head) are dealt to
 * `splits` CTAs round-robin; each adds its partials to its own dQ slice in a
 * fixed order without atomics and the convert stage sums the slices in
 * order, so dq, dk and dv are bit-identical across runs on one GPU model.
 * splits = min(ceil(seqlen_k / 128), max(1, ceil(264 / (batch * nhead_k)))).
 */
typedef struct ckfmha_bwd_problem {
  ckfmha_dtype dtype;
  ckfmha_mode mode;
  int32_t batch;
  int32_t nhead_q;
  int32_t nhead_k;
  int32_t seqlen_q; /* group mode: max over sequences */
  int32_t seqlen_k; /* group mode: max over sequences */
  int32_t hdim_q;
  int32_t hdim_v;
  ckfmha_mask mask;
  int32_t window_left;  /* window masks only; -1 = unbounded */
  int32_t window_right; /* window masks only; -1 = unbounded */
  float scale;
  float softcap;        /* > 0: logits were soft-capped in the forward */
  ckfmha_bias bias;     /* elementwise biases may also ask for dbias */
  int32_t store_dbias;  /* write dbias = dL/d(bias) per (batch, head, query, key); elementwise
                           bias only, sm80 backward (see dbias_stride) */
  /* The forward had sink logits (args.sink, fp32 [nhead_q]) and lse includes their
   * exp(sink[h]) terms; dq, dk and dv need nothing more. has_sink also writes the sink
   * gradient args.dsink[h] = -sum over (batch, query) of exp(sink[h] - lse) * D, with
   * D = rowsum(dO * O), 0 for a head without queries. It is reduced in a fixed order, so
   * it is bit-identical across runs in either mode. */
  int32_t has_sink;
  float dropout_p;      /* the forward's dropout: same p, seed and offset */
  uint64_t dropout_seed;
  uint64_t dropout_offset;
  int32_t deterministic;
  int64_t q_stride[3];
  int64_t k_stride[3];
  int64_t v_stride[3];
  int64_t o_stride[3];
  int64_t do_stride[3];
  int64_t dq_stride[3];
  int64_t dk_stride[3];
  int64_t dv_stride[3];
  int64_t lse_stride[2];    /* (batch, head); rows contiguous. Group mode: batch ignored */
  int64_t bias_stride[3];   /* (batch, head, row); 0 broadcasts; columns contiguous */
  int64_t dbias_stride[3];  /* (batch, head, row) of dbias [batch, nhead_q, seqlen_q, seqlen_k];
                               columns contiguous, no zero strides: every element is written
                               (masked scores and, in group mode, the padding past a sequence
                               get 0). A broadcast bias's gradient is this summed over the
                               broadcast axes, by the caller. */
  int64_t alibi_stride;
  /* Group mode: tokens in the packed q/o/do/dq and k/v/dk/dv tensors,
   * required as in the forward (every cu_seqlens range is checked). */
  int64_t total_q;
  int64_t total_k;
} ckfmha_bwd_problem;

typedef struct ckfmha_bwd_args {
  const void* q;
  const void* k;
  const void* v;
  const void* o;
  const float* lse;
  const void* do_;  /* dO, shaped like o */
  void* dq;
  void* dk;
  void* dv;
  const void* bias;          /* required for elementwise bias */
  void* dbias;               /* required when store_dbias */
  const float* alibi_slopes; /* required for ALiBi */
  const float* sink;         /* has_sink: fp32 [nhead_q], the forward's sink logits */
  float* dsink;              /* has_sink: fp32 [nhead_q], receives the sink gradient */
  const int32_t* cu_seqlens_q; /* required in group mode */
  const int32_t* cu_seqlens_k; /* required in group mode */
  void* workspace;           /* ckfmha_bwd_workspace_size() bytes, 16-byte aligned */
  size_t workspace_bytes;
} ckfmha_bwd_args;

/*
 * Empty problems. batch, seqlen_q and seqlen_k (and an append's batch and
 * seqlen_new) may be 0; heads and head dims may not. Such a problem validates,
 * and its run does no more than its outputs need:
 *   - every output empty (batch 0; seqlen_q 0; in the backward both lengths 0;
 *     an append of no tokens and no rotated queries): success without touching
 *     the device or launching anything; the pointers may be NULL;
 *   - forward, batch mode, seqlen_k 0: each row attends to no key, so O = 0 and
 *     LSE = -inf, or LSE = sink[h] with sinks (the result the kernels give a
 *     sequence whose key range is empty). ckfmha_fwd_run writes it with
 *     memsets on the stream (with sinks it first reads them back, waiting for
 *     the stream); no kernel runs, q, k and v are not read and may be NULL;
 *   - backward, batch mode, seqlen_q or seqlen_k 0: the non-empty gradients are
 *     0 (dk and dv without queries, dq without keys), written with memsets;
 *   - backward with has_sink: dsink [nhead_q] is never empty. Without queries
 *     (batch 0, seqlen_q 0) it is 0, and in batch mode without keys too (O = 0
 *     makes D = 0): a memset writes it and sink is not read (it may be NULL);
 *   - group mode and paged K/V, a zero bound (seqlen_k 0: no sequence has keys;
 *     backward seqlen_q or seqlen_k 0): the kernels run with the bound raised
 *     to 1, so each sequence's own length (0) decides: O = 0 and LSE = -inf
 *     (the sink), zero gradients. Tensors of the empty side may be NULL, and
 *     outputs with a zero axis (dropout bytes, dbias) are not written.
 * select then writes an empty name when no kernel runs, explain says why, and
 * the workspace sizes are 0.
 */

/* ---- errors and versions ---- */
CKFMHA_API const char* ckfmha_last_error(void);
CKFMHA_API const char* ckfmha_status_name(int status);
CKFMHA_API int ckfmha_version(int* major, int* minor, int* patch);

/* ---- problems ---- */
/* Fills a batch-mode problem with contiguous strides for the given layout,
 * no mask (window -1/-1), scale 1/sqrt(hdim_q), no LSE, bias, sink or
 * dropout; lse_stride for a contiguous [batch, nhead_q, seqlen_q]. */
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
/* Makes `device` current for the calling host thread, as cudaSetDevice does: later
 * launches, allocations and `ckfmha_current_device` of this thread use it. Fails with
 * CKFMHA_ERROR_INVALID_ARGUMENT naming the valid range [0, count) when `device` is out
 * of range (CKFMHA_ERROR_NO_DEVICE without a visible device). */
CKFMHA_API int ckfmha_set_device(int device);
/* The CUDA device whose memory ptr points into (device, managed or registered host
 * memory), or -1 for host memory CUDA does not know. */
CKFMHA_API int ckfmha_pointer_device(const void* ptr, int* device);
CKFMHA_API int ckfmha_device_malloc(void** ptr, size_t bytes);
CKFMHA_API int ckfmha_device_free(void* ptr);
CKFMHA_API int ckfmha_memcpy_to_device(void* dst, const void* src, size_t bytes);
CKFMHA_API int ckfmha_memcpy_to_host(void* dst, const void* src, size_t bytes);
/* Queues a host -> device copy on `stream`, after the work already queued there, so a
 * kernel still reading dst on that stream finishes first. A src in pageable host memory is
 * consumed before the call returns (the driver stages it, and may first wait for `stream`),
 * so the caller may reuse it at once; a src in page-locked memory is read when the stream
 * reaches the copy and must stay unchanged until then. */
CKFMHA_API int ckfmha_memcpy_to_device_async(void* dst, const void* src, size_t bytes,
                                             ckfmha_stream_t stream);
CKFMHA_API int ckfmha_memset_device(void* dst, int value, size_t bytes);
CKFMHA_API int ckfmha_stream_synchronize(ckfmha_stream_t stream);
/* Out-of-range device metadata met by earlier kernels on `device` (< 0: the
 * current device): CKFMHA_ERROR_DEVICE_METADATA with a message naming the kind
 * and a sequence, after which the record is clear; CKFMHA_SUCCESS when none.
 * Every run call does this check itself, without waiting, so it reports
 * kernels that have finished by then; synchronize != 0 first waits for all
 * work on the device, so every earlier call is seen. */
CKFMHA_API int ckfmha_check_device_errors(int device, int synchronize);

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
/* arch < 0 means the current device's arch. Writes the chosen kernel's name
 * (for a split-KV plan, its first stage, the fwd_splitkv kernel). */
CKFMHA_API int ckfmha_fwd_select(const ckfmha_fwd_problem* problem, int arch, char* name_buf,
                                 size_t buf_len);
/* Text explaining, kernel by kernel, why each does or does not fit. */
CKFMHA_API int ckfmha_fwd_explain(const ckfmha_fwd_problem* problem, int arch, char* buf,
                                  size_t buf_len, size_t* needed);
/* Bytes of args.workspace the plan for `problem` needs on `arch` (< 0: the
 * current device); 0 when the plan is one-stage or one split. The plan, and with it this
 * size, depends on the device's SM count: ask for the device you run on.
 * With no device present, the SM count of the arch's reference part is used
 * (sm_80: 108, sm_86: 84, sm_89: 128, sm_90: 132). kernel_name: as for
 * ckfmha_fwd_run (NULL: automatic), so the size matches the plan run makes. */
CKFMHA_API int ckfmha_fwd_workspace_size(const ckfmha_fwd_problem* problem, int arch,
                                         const char* kernel_name, size_t* bytes);
/* Selects a kernel for the current device and launches it on `stream`.
 * kernel_name may be NULL (automatic) or force a registered kernel (a
 * fwd_splitkv kernel forces a split-KV plan, its combine stage chosen
 * automatically). A split-KV plan launches fwd_splitkv then
 * fwd_splitkv_combine on `stream`, using args.workspace. */
CKFMHA_API int ckfmha_fwd_run(const ckfmha_fwd_problem* problem, const ckfmha_fwd_args* args,
                              const char* kernel_name, ckfmha_stream_t stream);

/* ---- backward ---- */
/* Fills a batch-mode backward problem like ckfmha_fwd_problem_init (do, dq,
 * dk and dv contiguous in the same layout as o, q, k and v; dbias_stride for
 * a contiguous [batch, nhead_q, seqlen_q, seqlen_k]), fast mode, no dbias. */
CKFMHA_API int ckfmha_bwd_problem_init(ckfmha_bwd_problem* problem, ckfmha_dtype dtype,
                                       ckfmha_layout layout, int32_t batch, int32_t nhead_q,
                                       int32_t nhead_k, int32_t seqlen_q, int32_t seqlen_k,
                                       int32_t hdim_q, int32_t hdim_v);
CKFMHA_API int ckfmha_bwd_problem_validate(const ckfmha_bwd_problem* problem);
/* Bytes of device workspace ckfmha_bwd_run needs for this problem. */
CKFMHA_API int ckfmha_bwd_workspace_size(const ckfmha_bwd_problem* problem, size_t* bytes);
/* Writes the plan's three kernel names, each followed by '\n'
 * (bwd_dot_do_o, bwd_dq_dk_dv, bwd_convert_dq). arch < 0: current device. */
CKFMHA_API int ckfmha_bwd_select(const ckfmha_bwd_problem* problem, int arch, char* names_buf,
                                 size_t buf_len);
/* Text explaining, stage by stage and kernel by kernel, why each fits or not. */
CKFMHA_API int ckfmha_bwd_explain(const ckfmha_bwd_problem* problem, int arch, char* buf,
                                  size_t buf_len, size_t* needed);
/* Runs the three stages on `stream`. kernel_name may be NULL (automatic) or
 * force the bwd_dq_dk_dv kernel by name; the other stages are chosen to match. */
CKFMHA_API int ckfmha_bwd_run(const ckfmha_bwd_problem* problem, const ckfmha_bwd_args* args,
                              const char* kernel_name, ckfmha_stream_t stream);

/* ---- plan selection: hand rules, a learned cost model, or a tuning table ---- */

/*
 * How automatic plans (no kernel forced by name) choose among the kernels and
 * split counts that can run a problem. The mode is one for the process (so a
 * framework's backward worker threads plan as the thread that set it); it
 * starts as the environment variable CKFMHA_SELECTION names ("heuristic",
 * "learned" or "tuned"), else heuristic.
 *
 * heuristic: hand-written rules (pipeline rank, tile padding, a wave model
 *   for split counts).
 * learned: a cost model (gradient-boosted trees, loaded with
 *   ckfmha_selection_model_load) predicts each candidate's time, as a multiple
 *   of the hand rules' plan's, from problem and algorithm features, and the
 *   fastest prediction wins. It covers fp16/bf16 forward plans in batch and
 *   group mode (one-stage and split-KV at split counts 1, 2, 4, .. 64 and the
 *   hand rules' own count) and the backward main stage, on the arch it was
 *   trained for; other problems (paged K/V, fp32), or no model, fall back to
 *   the hand rules. explain lists each candidate's prediction.
 * tuned: the plan a tuning table (ckfmha_tuning_load) holds for this exact
 *   problem, when its kernel is registered and fits; otherwise as learned.
 */
typedef enum ckfmha_selection {
  CKFMHA_SELECTION_HEURISTIC = 0,
  CKFMHA_SELECTION_LEARNED = 1,
  CKFMHA_SELECTION_TUNED = 2
} ckfmha_selection;

CKFMHA_API int ckfmha_set_selection(ckfmha_selection mode);
CKFMHA_API int ckfmha_get_selection(ckfmha_selection* mode);
/* Parses a cost model file (written by benchmarks/train_selection.py, or by
 * benchmarks/train_conv_selection.py for convolution plans) and makes it the
 * process's attention or convolution model (the file's features line says
 * which), replacing the earlier one of that kind. A file that does not parse,
 * or lists other features than this library computes, is
 * CKFMHA_ERROR_INVALID_ARGUMENT naming the line. Without a call, the models
 * an installed package ships beside the library (../data/selection_sm90.model
 * and ../data/selection_conv_sm90.model from the library's folder) are loaded
 * when first needed. */
CKFMHA_API int ckfmha_selection_model_load(const char* path);
/* One line on the loaded attention model (trained device, arch, trees), or
 * "none". */
CKFMHA_API int ckfmha_selection_model_info(char* buf, size_t buf_len, size_t* needed);
/* The same for the convolution model. Under the learned (and tuned) mode it
 * ranks each conv pass's kernels that fit, at the widest channel vector, and
 * backward-weight's split counts (1, 2, 4, .. 128 of the implicit GEMM's
 * reduction; 1 to 16 CTAs per SM for a direct kernel); backward-data's one
 * kernel serves every stride phase. */
CKFMHA_API int ckfmha_conv_selection_model_info(char* buf, size_t buf_len, size_t* needed);
/* Tuning table: the fastest plan timed for exact problems (python -m ckfmha
 * tune). add records one (num_splits: 0 = one stage, n >= 1 = split-KV with n
 * splits; backward problems name the main-stage kernel); save writes the
 * table with this library's version and build (its file's size and
 * modification time), the CUDA driver's version and the current device's
 * name; load reads one, failing with CKFMHA_ERROR_INVALID_ARGUMENT when any
 * of them differs (a stale table: tune again), and adds its entries
 * (`entries`, may be NULL, gets how many). */
CKFMHA_API int ckfmha_tuning_add_fwd(const ckfmha_fwd_problem* problem, const char* kernel_name,
                                     int num_splits, float ms);
CKFMHA_API int ckfmha_tuning_add_bwd(const ckfmha_bwd_problem* problem, const char* kernel_name,
                                     float ms);
CKFMHA_API int ckfmha_tuning_save(const char* path, int* entries);
CKFMHA_API int ckfmha_tuning_load(const char* path, int* entries);
CKFMHA_API int ckfmha_tuning_clear(void);

/* ---- appending to a KV cache (family fwd_appendkv) ---- */

/* Rotary position embedding applied to appended keys (and, when asked, to
 * queries). With angle table rows cos[pos], sin[pos] of rotary_dim/2 entries,
 * a pair (x, y) of head-dim columns becomes (x cos - y sin, x sin + y cos):
 * interleaved pairs columns (2i, 2i+1) with entry i (GPT-J); half-rotated
 * pairs columns (i, i + rotary_dim/2) with entry i (GPT-NeoX). Columns at or
 * beyond rotary_dim are copied unchanged. */
typedef enum ckfmha_rope {
  CKFMHA_ROPE_NONE = 0,
  CKFMHA_ROPE_INTERLEAVED = 1,
  CKFMHA_ROPE_HALF_ROTATED = 2
} ckfmha_rope;

/*
 * Append problem: writes seqlen_new new tokens per sequence into a KV cache.
 *
 * k_new [batch, seqlen_new, nhead_k, hdim_k] and v_new [.., hdim_v], any
 * (batch, head, seq) strides with a contiguous head dim. Token t of sequence b
 * lands at cache position cache_seqlens[b] + t (the lengths are not updated;
 * the caller advances them). Keys are rotated at that position; values are
 * copied unchanged.
 *
 * Contiguous cache (paged_kv = 0): k_cache/v_cache hold max_seqlen_cache
 * tokens per sequence; strides (batch, head, seq), so BSHD
 * [batch, max_seqlen_cache, nhead_k, hdim] and BHSD are both strides.
 * Paged cache (paged_kv = 1): num_pages pages of page_size tokens, strides
 * (page, head, token in page) (vLLM: [num_pages, page_size, nhead_k, hdim]);
 * block_table int32 [batch, max_pages_per_seq] (row stride
 * block_table_stride) names the page holding tokens
 * [j * page_size, (j + 1) * page_size) of sequence b at entry (b, j).
 * With page_layout vectorized (fp16/bf16; vLLM's older layout) the pages are
 * k [num_pages, nhead_k, hdim_k / 8, page_size, 8] with k_cache_stride
 * (page, head, 8-channel chunk), each chunk's [page_size, 8] dense, and
 * v [num_pages, nhead_k, hdim_v, page_size] with v_cache_stride (page, head,
 * channel), each channel's keys contiguous; V then goes through shared
 * memory and is written token by token.
 * Capacity: max_seqlen_cache, or max_pages_per_seq * page_size.
 *
 * Bounds: when args.cache_seqlens_host is given, every sequence is checked on
 * the host before the launch (0 <= length, length + seqlen_new <= capacity,
 * and with RoPE the positions within rope_max_pos) and a violation is
 * CKFMHA_ERROR_INVALID_ARGUMENT naming the sequence. The device-side lengths
 * and page numbers are otherwise trusted only as far as the kernel checks
 * them: a token whose position is outside [0, capacity), whose page number is
 * outside [0, num_pages) or whose angle row is outside [0, rope_max_pos) is
 * not written, and args.overflow (when given) is set to 1; without it the next
 * call on the device fails with CKFMHA_ERROR_DEVICE_METADATA (see
 * ckfmha_check_device_errors).
 *
 * rotate_q: q [batch, seqlen_q, nhead_q, hdim_k] is rotated too, query t of
 * sequence b at position cache_seqlens[b] + t (causal positions, as the keys
 * appended with it), into q_out (which may be q itself: in place). Columns
 * beyond rotary_dim are copied when q_out is not q.
 *
 * Vectors: pointers 16-byte aligned, strides and head dims multiples of 8
 * fp16/bf16 (4 fp32) elements; half-rotated RoPE also needs rotary_dim / 2
 * to be such a multiple.
 */
typedef struct ckfmha_appendkv_problem {
  ckfmha_dtype dtype; /* k_new, v_new, the caches and q */
  int32_t batch;
  int32_t nhead_k;
  int32_t seqlen_new;
  int32_t hdim_k;
  int32_t hdim_v;
  int32_t max_seqlen_cache; /* contiguous cache: tokens per sequence */
  int32_t paged_kv;         /* 0: contiguous cache; 1: pages and a block table */
  int32_t page_size;
  int32_t num_pages;
  int32_t max_pages_per_seq;
  int64_t block_table_stride; /* batch stride of the block table */
  ckfmha_page_layout page_layout; /* paged cache: linear (default) or vectorized */
  ckfmha_rope rope;
  int32_t rotary_dim;       /* even, 2..hdim_k */
  ckfmha_dtype rope_dtype;  /* of cos/sin: fp32 or dtype */
  int32_t rope_max_pos;     /* rows of cos and sin */
  int64_t cos_stride;       /* row strides of cos [rope_max_pos, rotary_dim / 2] */
  int64_t sin_stride;
  int32_t rotate_q;
  int32_t nhead_q;
  int32_t seqlen_q;
  int64_t k_new_stride[3];   /* (batch, head, seq) */
  int64_t v_new_stride[3];
  int64_t k_cache_stride[3]; /* (batch or page, head, seq) */
  int64_t v_cache_stride[3];
  int64_t q_stride[3];
  int64_t q_out_stride[3];
  /* fp8 caches (cache_quant CKFMHA_KV_QUANT_FP8_E4M3, linear layouts only): the caches hold
   * e4m3 codes, k_cache = e4m3(k_new / k_scale) rounded to nearest even and saturated at
   * +-448 (the division correctly rounded in fp32), likewise V, so that the cache stands for
   * k_scale * code as ckfmha_fwd_problem.kv_quant reads it. k_new, v_new and q stay in dtype
   * (fp16/bf16); cache strides are in bytes and multiples of 8. Scales as in the forward:
   * args.k_scale / v_scale (device fp32, 1 value or nhead_k with scale_per_head), else the
   * scalars. sm_89 and later. */
  ckfmha_kv_quant cache_quant;
  int32_t scale_per_head;
  float k_scale; /* set to 1 by ckfmha_appendkv_problem_init */
  float v_scale;
} ckfmha_appendkv_problem;

typedef struct ckfmha_appendkv_args {
  const void* k_new;
  const void* v_new;
  void* k_cache;
  void* v_cache;
  const int32_t* cache_seqlens;      /* device [batch] */
  const int32_t* cache_seqlens_host; /* optional host copy: bounds checked before launching */
  const int32_t* block_table;        /* paged cache: device [batch, max_pages_per_seq] */
  const void* cos;                   /* RoPE: device [rope_max_pos, rotary_dim / 2] */
  const void* sin;
  const void* q;                     /* rotate_q */
  void* q_out;                       /* rotate_q; may equal q */
  int32_t* overflow;                 /* optional device int32, set to 1 on a skipped token */
  const float* k_scale;              /* fp8 caches: device fp32 scales, or NULL (problem's) */
  const float* v_scale;
} ckfmha_appendkv_args;

/* Fills a problem without RoPE or q: k_new/v_new contiguous BSHD, a
 * contiguous cache of max_seqlen_cache tokens in `cache_layout`. */
CKFMHA_API int ckfmha_appendkv_problem_init(ckfmha_appendkv_problem* problem, ckfmha_dtype dtype,
                                            ckfmha_layout cache_layout, int32_t batch,
                                            int32_t nhead_k, int32_t seqlen_new,
                                            int32_t max_seqlen_cache, int32_t hdim_k,
                                            int32_t hdim_v);
CKFMHA_API int ckfmha_appendkv_problem_validate(const ckfmha_appendkv_problem* problem);
/* arch < 0: the current device's. Writes the chosen kernel's name. */
CKFMHA_API int ckfmha_appendkv_select(const ckfmha_appendkv_problem* problem, int arch,
                                      char* name_buf, size_t buf_len);
CKFMHA_API int ckfmha_appendkv_explain(const ckfmha_appendkv_problem* problem, int arch,
                                       char* buf, size_t buf_len, size_t* needed);
/* One kernel on `stream`; kernel_name NULL (automatic) or a fwd_appendkv kernel. */
CKFMHA_API int ckfmha_appendkv_run(const ckfmha_appendkv_problem* problem,
                                   const ckfmha_appendkv_args* args, const char* kernel_name,
                                   ckfmha_stream_t stream);

/* ---- grouped convolution (families conv_fwd, conv_bwd_weight) ---- */

/* Which pass of a convolution a call computes. */
typedef enum ckfmha_conv_direction {
  CKFMHA_CONV_FWD = 0,        /* y = conv(x, w) */
  CKFMHA_CONV_BWD_DATA = 1,   /* dx = the gradient of conv(x, w) by x, given dy */
  CKFMHA_CONV_BWD_WEIGHT = 2  /* dw = the gradient of conv(x, w) by w, given dy */
} ckfmha_conv_direction;

/*
 * Grouped convolution problem, 2D or 3D, channels-last with the group explicit:
 *   x [batch, *input, groups, in_channels]          (NHWGC / NDHWGC)
 *   w [groups, out_channels, *filter, in_channels]   (GKYXC / GKZYXC), dense
 *   y [batch, *output, groups, out_channels]         (NHWGK / NDHWGK)
 * in_channels and out_channels are per group: groups 1 is an ordinary
 * convolution, in_channels = out_channels = 1 a depthwise one. The spatial
 * arrays hold spatial_dims entries, outermost first ((h, w) in 2D, (d, h, w)
 * in 3D); later entries are ignored. Each dim has its own stride, zero
 * padding (the same on both sides) and dilation, and
 *   output = (input + 2 * padding - dilation * (filter - 1) - 1) / stride + 1,
 * which the problem must state (ckfmha_conv_problem_init computes it).
 * x_stride and y_stride are in elements: [0] the batch stride, [1 + i] spatial
 * dim i's; within a position the groups and channels are dense (channel
 * stride 1, group stride in_channels resp. out_channels), as a torch
 * channels_last (channels_last_3d) tensor holds them. Pointers and strides
 * need only be element-aligned: kernels with 16-byte vectors are chosen when
 * the channel counts, strides and pointers allow them, narrower ones
 * otherwise. Accumulation is in fp32.
 */
typedef struct ckfmha_conv_problem {
  ckfmha_dtype dtype; /* fp16 or bf16: x, w and y */
  int32_t spatial_dims; /* 2 or 3 */
  int32_t batch;
  int32_t groups;
  int32_t in_channels;  /* per group (C) */
  int32_t out_channels; /* per group (K) */
  int32_t input[3];
  int32_t filter[3];
  int32_t stride[3];
  int32_t padding[3];
  int32_t dilation[3];
  int32_t output[3];
  int64_t x_stride[4]; /* (batch, spatial...) */
  int64_t y_stride[4];
} ckfmha_conv_problem;

/* Forward: y from x and w. Groups of 8, 16 or 32 input channels that divide
 * into packs of 64 channels run several at a time on the TMA template (sm_90
 * on), through block-diagonal filters written into the workspace, where the
 * plan finds that worth it; with no workspace (NULL) they run one group at a
 * time. */
typedef struct ckfmha_conv_fwd_args {
  const void* x;
  const void* w;
  void* y;
  void* workspace; /* NULL, or ckfmha_conv_workspace_size bytes, 16-byte aligned */
  size_t workspace_bytes;
} ckfmha_conv_fwd_args;

/* Backward-data: dx (x's layout and strides) from dy (y's) and w. The plan
 * runs forward kernels over dy: per stride phase (the positions of dx with
 * the same remainder by the stride in every dim) one convolution with the
 * filter taps that reach that phase, flipped and transposed (the direct,
 * TMA and sm_90 gathering kernels read them so from w in place, the last
 * where C is a multiple of 8; for the others they are copied into the
 * workspace first, and groups of 8-32 channels are copied several at a time
 * into block-diagonal filters for the TMA kernel); dx positions no tap
 * reaches are zeroed. */
typedef struct ckfmha_conv_bwd_data_args {
  const void* dy;
  const void* w;
  void* dx;
  void* workspace; /* ckfmha_conv_workspace_size bytes, 16-byte aligned */
  size_t workspace_bytes;
} ckfmha_conv_bwd_data_args;

/* Backward-weight: dw (w's layout) from x and dy. The reduction over batch
 * and output positions is split over CTAs when that fills the GPU; split
 * plans add fp32 partial sums into the workspace (in no fixed order, so the
 * last bits may differ between runs) and convert it into dw. */
typedef struct ckfmha_conv_bwd_weight_args {
  const void* x;
  const void* dy;
  void* dw;
  void* workspace; /* ckfmha_conv_workspace_size bytes, 16-byte aligned */
  size_t workspace_bytes;
  /* 0: the plan's own count. Else how many CTAs share the reduction: splits
   * of the positions for an implicit-GEMM kernel (> 1 needs the workspace),
   * CTAs per block of 32 groups for a direct one; at most 65535, and no more
   * are launched than have work. */
  int32_t splits;
} ckfmha_conv_bwd_weight_args;

/* Fills a problem with dense x and y; stride, padding and dilation may be NULL
 * (1, 0 and 1 in every dim) and otherwise hold spatial_dims entries. */
CKFMHA_API int ckfmha_conv_problem_init(ckfmha_conv_problem* problem, ckfmha_dtype dtype,
                                        int32_t spatial_dims, int32_t batch, int32_t groups,
                                        int32_t in_channels, int32_t out_channels,
                                        const int32_t* input, const int32_t* filter,
                                        const int32_t* stride, const int32_t* padding,
                                        const int32_t* dilation);
CKFMHA_API int ckfmha_conv_problem_validate(const ckfmha_conv_problem* problem);
/* arch < 0: the current device's. Writes the chosen kernel's name (empty when
 * the output is empty and no kernel runs); the forward's as planned with a
 * workspace. */
CKFMHA_API int ckfmha_conv_select(const ckfmha_conv_problem* problem,
                                  ckfmha_conv_direction direction, int arch, char* name_buf,
                                  size_t buf_len);
CKFMHA_API int ckfmha_conv_explain(const ckfmha_conv_problem* problem,
                                   ckfmha_conv_direction direction, int arch, char* buf,
                                   size_t buf_len, size_t* needed);
/* y = conv(x, w) on `stream`; kernel_name NULL (automatic) or a conv_fwd kernel. */
CKFMHA_API int ckfmha_conv_fwd_run(const ckfmha_conv_problem* problem,
                                   const ckfmha_conv_fwd_args* args, const char* kernel_name,
                                   ckfmha_stream_t stream);
/* Bytes of workspace a direction's plan needs on `arch` (< 0: the current
 * device's); for the forward, the packed filters' where the groups pack on
 * that arch, else 0. */
CKFMHA_API int ckfmha_conv_workspace_size(const ckfmha_conv_problem* problem,
                                          ckfmha_conv_direction direction, int arch,
                                          size_t* bytes);
/* dx on `stream`; kernel_name NULL (automatic) or a conv_fwd kernel that every
 * phase then runs on. Where the stride makes several phases, their
 * convolutions run concurrently on side streams of the calling thread that
 * wait for `stream` and that `stream` waits for before the call returns: the
 * call is one ordered step on `stream`, also under graph capture (parallel
 * branches). */
CKFMHA_API int ckfmha_conv_bwd_data_run(const ckfmha_conv_problem* problem,
                                        const ckfmha_conv_bwd_data_args* args,
                                        const char* kernel_name, ckfmha_stream_t stream);
/* dw on `stream`; kernel_name NULL (automatic) or a conv_bwd_weight kernel. */
CKFMHA_API int ckfmha_conv_bwd_weight_run(const ckfmha_conv_problem* problem,
                                          const ckfmha_conv_bwd_weight_args* args,
                                          const char* kernel_name, ckfmha_stream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* CKFMHA_CKFMHA_H */
