# cython: language_level=3
# Declarations of the ckfmha C API (cpp/include/ckfmha/ckfmha.h) for `cimport ckfmha`.
#
# Every function is declared `nogil`: none of them touches Python objects, so an
# extension can launch kernels or copy memory while other Python threads run.
# Keep this file in step with the header; the C header is the source of truth.

from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t


cdef extern from "ckfmha/ckfmha.h" nogil:
    int CKFMHA_VERSION_MAJOR
    int CKFMHA_VERSION_MINOR
    int CKFMHA_VERSION_PATCH
    # Tokens of one head that share a per-block fp8 scale (fp8_block_scales), and the blocks
    # of a sequence of n tokens.
    int CKFMHA_FP8_SCALE_BLOCK
    int CKFMHA_FP8_SCALE_BLOCKS(int n)

    cdef struct CUstream_st
    ctypedef CUstream_st* ckfmha_stream_t

    ctypedef enum ckfmha_status:
        CKFMHA_SUCCESS
        CKFMHA_ERROR_INVALID_ARGUMENT
        CKFMHA_ERROR_UNSUPPORTED
        CKFMHA_ERROR_CUDA
        CKFMHA_ERROR_NO_DEVICE
        CKFMHA_ERROR_BUFFER_TOO_SMALL
        CKFMHA_ERROR_NOT_FOUND
        CKFMHA_ERROR_INTERNAL
        CKFMHA_ERROR_DEVICE_METADATA

    ctypedef enum ckfmha_dtype:
        CKFMHA_DTYPE_FP16
        CKFMHA_DTYPE_BF16
        CKFMHA_DTYPE_FP32

    ctypedef enum ckfmha_family:
        CKFMHA_FAMILY_FWD
        CKFMHA_FAMILY_FWD_SPLITKV
        CKFMHA_FAMILY_FWD_SPLITKV_COMBINE
        CKFMHA_FAMILY_FWD_PAGEDKV
        CKFMHA_FAMILY_FWD_APPENDKV
        CKFMHA_FAMILY_BATCH_PREFILL
        CKFMHA_FAMILY_BWD_DOT_DO_O
        CKFMHA_FAMILY_BWD_DQ_DK_DV
        CKFMHA_FAMILY_BWD_CONVERT_DQ
        CKFMHA_FAMILY_CONV_FWD
        CKFMHA_FAMILY_CONV_BWD_WEIGHT

    ctypedef enum ckfmha_mode:
        CKFMHA_MODE_BATCH
        CKFMHA_MODE_GROUP

    ctypedef enum ckfmha_mask:
        CKFMHA_MASK_NONE
        CKFMHA_MASK_CAUSAL_TOP_LEFT
        CKFMHA_MASK_CAUSAL_BOTTOM_RIGHT
        CKFMHA_MASK_WINDOW_TOP_LEFT
        CKFMHA_MASK_WINDOW_BOTTOM_RIGHT

    ctypedef enum ckfmha_mask_kind:
        CKFMHA_MASK_KIND_NONE
        CKFMHA_MASK_KIND_CAUSAL
        CKFMHA_MASK_KIND_WINDOW

    ctypedef enum ckfmha_bias:
        CKFMHA_BIAS_NONE
        CKFMHA_BIAS_ELEMENTWISE
        CKFMHA_BIAS_ALIBI

    ctypedef enum ckfmha_kv_storage:
        CKFMHA_KV_CONTIGUOUS
        CKFMHA_KV_PAGED_TABLE
        CKFMHA_KV_PAGED_INDPTR

    ctypedef enum ckfmha_page_layout:
        CKFMHA_PAGE_LAYOUT_LINEAR
        CKFMHA_PAGE_LAYOUT_VECTORIZED

    ctypedef enum ckfmha_kv_quant:
        CKFMHA_KV_QUANT_NONE
        CKFMHA_KV_QUANT_FP8_E4M3

    ctypedef enum ckfmha_layout:
        CKFMHA_LAYOUT_BHSD
        CKFMHA_LAYOUT_BSHD

    ctypedef struct ckfmha_fwd_problem:
        ckfmha_dtype dtype
        ckfmha_mode mode
        int32_t batch
        int32_t nhead_q
        int32_t nhead_k
        int32_t seqlen_q
        int32_t seqlen_k
        int32_t hdim_q
        int32_t hdim_v
        ckfmha_mask mask
        int32_t window_left
        int32_t window_right
        float scale
        float softcap
        ckfmha_bias bias
        int32_t has_sink
        float dropout_p
        uint64_t dropout_seed
        uint64_t dropout_offset
        int32_t store_dropout_randval
        int32_t skip_min_seqlen_q
        int32_t v_col_major
        int32_t store_lse
        int64_t q_stride[3]
        int64_t k_stride[3]
        int64_t v_stride[3]
        int64_t o_stride[3]
        int64_t lse_stride[2]
        int64_t bias_stride[3]
        int64_t alibi_stride
        int64_t total_q
        int64_t total_k
        int32_t num_splits
        ckfmha_kv_storage kv_storage
        ckfmha_page_layout page_layout
        int32_t page_size
        int32_t max_pages_per_seq
        int64_t block_table_stride
        int32_t num_pages
        int64_t num_kv_indices
        ckfmha_kv_quant kv_quant
        int32_t kv_scale_per_head
        float k_scale
        float v_scale
        ckfmha_kv_quant q_quant
        float q_scale
        int32_t fp8_block_scales

    ctypedef struct ckfmha_fwd_args:
        const void* q
        const void* k
        const void* v
        void* o
        float* lse
        const void* bias
        const float* alibi_slopes
        const float* sink
        const int32_t* cu_seqlens_q
        const int32_t* cu_seqlens_k
        uint8_t* dropout_randval
        void* workspace
        size_t workspace_bytes
        const int32_t* block_table
        const int32_t* kv_indices
        const int32_t* kv_indptr
        const int32_t* seqlens_k
        const float* k_scale
        const float* v_scale
        const float* q_scale

    ctypedef struct ckfmha_bwd_problem:
        ckfmha_dtype dtype
        ckfmha_mode mode
        int32_t batch
        int32_t nhead_q
        int32_t nhead_k
        int32_t seqlen_q
        int32_t seqlen_k
        int32_t hdim_q
        int32_t hdim_v
        ckfmha_mask mask
        int32_t window_left
        int32_t window_right
        float scale
        float softcap
        ckfmha_bias bias
        int32_t store_dbias
        int32_t has_sink
        float dropout_p
        uint64_t dropout_seed
        uint64_t dropout_offset
        int32_t deterministic
        int64_t q_stride[3]
        int64_t k_stride[3]
        int64_t v_stride[3]
        int64_t o_stride[3]
        int64_t do_stride[3]
        int64_t dq_stride[3]
        int64_t dk_stride[3]
        int64_t dv_stride[3]
        int64_t lse_stride[2]
        int64_t bias_stride[3]
        int64_t dbias_stride[3]
        int64_t alibi_stride
        int64_t total_q
        int64_t total_k

    ctypedef struct ckfmha_bwd_args:
        const void* q
        const void* k
        const void* v
        const void* o
        const float* lse
        const void* do_
        void* dq
        void* dk
        void* dv
        const void* bias
        void* dbias
        const float* alibi_slopes
        const float* sink
        float* dsink
        const int32_t* cu_seqlens_q
        const int32_t* cu_seqlens_k
        void* workspace
        size_t workspace_bytes

    # errors and versions
    const char* ckfmha_last_error()
    const char* ckfmha_status_name(int status)
    int ckfmha_version(int* major, int* minor, int* patch)

    # problems
    int ckfmha_fwd_problem_init(ckfmha_fwd_problem* problem, ckfmha_dtype dtype,
                                ckfmha_layout layout, int32_t batch, int32_t nhead_q,
                                int32_t nhead_k, int32_t seqlen_q, int32_t seqlen_k,
                                int32_t hdim_q, int32_t hdim_v)
    int ckfmha_fwd_problem_validate(const ckfmha_fwd_problem* problem)

    # devices and memory
    int ckfmha_device_count(int* count)
    int ckfmha_device_arch(int device, int* arch)
    int ckfmha_current_device(int* device)
    int ckfmha_set_device(int device)
    int ckfmha_pointer_device(const void* ptr, int* device)
    int ckfmha_device_malloc(void** ptr, size_t bytes)
    int ckfmha_device_free(void* ptr)
    int ckfmha_memcpy_to_device(void* dst, const void* src, size_t bytes)
    int ckfmha_memcpy_to_host(void* dst, const void* src, size_t bytes)
    int ckfmha_memcpy_to_device_async(void* dst, const void* src, size_t bytes,
                                      ckfmha_stream_t stream)
    int ckfmha_memset_device(void* dst, int value, size_t bytes)
    int ckfmha_stream_synchronize(ckfmha_stream_t stream)
    int ckfmha_check_device_errors(int device, int synchronize)

    # registry
    int ckfmha_registry_count(int* count)
    int ckfmha_registry_name(int index, char* buf, size_t buf_len)
    int ckfmha_registry_json(char* buf, size_t buf_len, size_t* needed)
    int ckfmha_registry_load_module(const char* path, int* added)

    # dispatch
    int ckfmha_fwd_select(const ckfmha_fwd_problem* problem, int arch, char* name_buf,
                          size_t buf_len)
    int ckfmha_fwd_explain(const ckfmha_fwd_problem* problem, int arch, char* buf,
                           size_t buf_len, size_t* needed)
    int ckfmha_fwd_workspace_size(const ckfmha_fwd_problem* problem, int arch,
                                  const char* kernel_name, size_t* bytes)
    int ckfmha_fwd_run(const ckfmha_fwd_problem* problem, const ckfmha_fwd_args* args,
                       const char* kernel_name, ckfmha_stream_t stream)

    # backward
    int ckfmha_bwd_problem_init(ckfmha_bwd_problem* problem, ckfmha_dtype dtype,
                                ckfmha_layout layout, int32_t batch, int32_t nhead_q,
                                int32_t nhead_k, int32_t seqlen_q, int32_t seqlen_k,
                                int32_t hdim_q, int32_t hdim_v)
    int ckfmha_bwd_problem_validate(const ckfmha_bwd_problem* problem)
    int ckfmha_bwd_workspace_size(const ckfmha_bwd_problem* problem, size_t* bytes)
    int ckfmha_bwd_select(const ckfmha_bwd_problem* problem, int arch, char* names_buf,
                          size_t buf_len)
    int ckfmha_bwd_explain(const ckfmha_bwd_problem* problem, int arch, char* buf,
                           size_t buf_len, size_t* needed)
    int ckfmha_bwd_run(const ckfmha_bwd_problem* problem, const ckfmha_bwd_args* args,
                       const char* kernel_name, ckfmha_stream_t stream)

    # plan selection: hand rules, a learned cost model, a tuning table
    ctypedef enum ckfmha_selection:
        CKFMHA_SELECTION_HEURISTIC
        CKFMHA_SELECTION_LEARNED
        CKFMHA_SELECTION_TUNED
    int ckfmha_set_selection(ckfmha_selection mode)
    int ckfmha_get_selection(ckfmha_selection* mode)
    int ckfmha_selection_model_load(const char* path)
    int ckfmha_selection_model_info(char* buf, size_t buf_len, size_t* needed)
    int ckfmha_conv_selection_model_info(char* buf, size_t buf_len, size_t* needed)
    int ckfmha_tuning_add_fwd(const ckfmha_fwd_problem* problem, const char* kernel_name,
                              int num_splits, float ms)
    int ckfmha_tuning_add_bwd(const ckfmha_bwd_problem* problem, const char* kernel_name,
                              float ms)
    int ckfmha_tuning_save(const char* path, int* entries)
    int ckfmha_tuning_load(const char* path, int* entries)
    int ckfmha_tuning_clear()

    # appending to a KV cache (family fwd_appendkv)
    ctypedef enum ckfmha_rope:
        CKFMHA_ROPE_NONE
        CKFMHA_ROPE_INTERLEAVED
        CKFMHA_ROPE_HALF_ROTATED

    ctypedef struct ckfmha_appendkv_problem:
        ckfmha_dtype dtype
        int32_t batch
        int32_t nhead_k
        int32_t seqlen_new
        int32_t hdim_k
        int32_t hdim_v
        int32_t max_seqlen_cache
        int32_t paged_kv
        int32_t page_size
        int32_t num_pages
        int32_t max_pages_per_seq
        int64_t block_table_stride
        ckfmha_page_layout page_layout
        ckfmha_rope rope
        int32_t rotary_dim
        ckfmha_dtype rope_dtype
        int32_t rope_max_pos
        int64_t cos_stride
        int64_t sin_stride
        int32_t rotate_q
        int32_t nhead_q
        int32_t seqlen_q
        int64_t k_new_stride[3]
        int64_t v_new_stride[3]
        int64_t k_cache_stride[3]
        int64_t v_cache_stride[3]
        int64_t q_stride[3]
        int64_t q_out_stride[3]
        ckfmha_kv_quant cache_quant
        int32_t scale_per_head
        float k_scale
        float v_scale

    ctypedef struct ckfmha_appendkv_args:
        const void* k_new
        const void* v_new
        void* k_cache
        void* v_cache
        const int32_t* cache_seqlens
        const int32_t* cache_seqlens_host
        const int32_t* block_table
        const void* cos
        const void* sin
        const void* q
        void* q_out
        int32_t* overflow
        const float* k_scale
        const float* v_scale

    int ckfmha_appendkv_problem_init(ckfmha_appendkv_problem* problem, ckfmha_dtype dtype,
                                     ckfmha_layout cache_layout, int32_t batch, int32_t nhead_k,
                                     int32_t seqlen_new, int32_t max_seqlen_cache,
                                     int32_t hdim_k, int32_t hdim_v)
    int ckfmha_appendkv_problem_validate(const ckfmha_appendkv_problem* problem)
    int ckfmha_appendkv_select(const ckfmha_appendkv_problem* problem, int arch, char* name_buf,
                               size_t buf_len)
    int ckfmha_appendkv_explain(const ckfmha_appendkv_problem* problem, int arch, char* buf,
                                size_t buf_len, size_t* needed)
    int ckfmha_appendkv_run(const ckfmha_appendkv_problem* problem,
                            const ckfmha_appendkv_args* args, const char* kernel_name,
                            ckfmha_stream_t stream)

    # grouped convolution (families conv_fwd, conv_bwd_weight)
    ctypedef enum ckfmha_conv_direction:
        CKFMHA_CONV_FWD
        CKFMHA_CONV_BWD_DATA
        CKFMHA_CONV_BWD_WEIGHT

    ctypedef struct ckfmha_conv_problem:
        ckfmha_dtype dtype
        int32_t spatial_dims
        int32_t batch
        int32_t groups
        int32_t in_channels
        int32_t out_channels
        int32_t input[3]
        int32_t filter[3]
        int32_t stride[3]
        int32_t padding[3]
        int32_t dilation[3]
        int32_t output[3]
        int64_t x_stride[4]
        int64_t y_stride[4]

    ctypedef struct ckfmha_conv_fwd_args:
        const void* x
        const void* w
        void* y
        void* workspace
        size_t workspace_bytes

    ctypedef struct ckfmha_conv_bwd_data_args:
        const void* dy
        const void* w
        void* dx
        void* workspace
        size_t workspace_bytes

    ctypedef struct ckfmha_conv_bwd_weight_args:
        const void* x
        const void* dy
        void* dw
        void* workspace
        size_t workspace_bytes
        int32_t splits

    int ckfmha_conv_problem_init(ckfmha_conv_problem* problem, ckfmha_dtype dtype,
                                 int32_t spatial_dims, int32_t batch, int32_t groups,
                                 int32_t in_channels, int32_t out_channels, const int32_t* input,
                                 const int32_t* filter, const int32_t* stride,
                                 const int32_t* padding, const int32_t* dilation)
    int ckfmha_conv_problem_validate(const ckfmha_conv_problem* problem)
    int ckfmha_conv_select(const ckfmha_conv_problem* problem, ckfmha_conv_direction direction,
                           int arch, char* name_buf, size_t buf_len)
    int ckfmha_conv_explain(const ckfmha_conv_problem* problem, ckfmha_conv_direction direction,
                            int arch, char* buf, size_t buf_len, size_t* needed)
    int ckfmha_conv_fwd_run(const ckfmha_conv_problem* problem,
                            const ckfmha_conv_fwd_args* args, const char* kernel_name,
                            ckfmha_stream_t stream)
    int ckfmha_conv_workspace_size(const ckfmha_conv_problem* problem,
                                   ckfmha_conv_direction direction, int arch, size_t* bytes)
    int ckfmha_conv_bwd_data_run(const ckfmha_conv_problem* problem,
                                 const ckfmha_conv_bwd_data_args* args,
                                 const char* kernel_name, ckfmha_stream_t stream)
    int ckfmha_conv_bwd_weight_run(const ckfmha_conv_problem* problem,
                                   const ckfmha_conv_bwd_weight_args* args,
                                   const char* kernel_name, ckfmha_stream_t stream)
