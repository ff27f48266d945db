# cython: language_level=3
cimport ckfmha as capi

cdef int fill_fwd_problem(object problem, capi.ckfmha_fwd_problem* out) except -1
cdef int fill_bwd_problem(object problem, bint deterministic,
                          capi.ckfmha_bwd_problem* out) except -1
cdef dict fwd_problem_dict(const capi.ckfmha_fwd_problem* problem)
# Sizes that do not fit the C API's int32 become InvalidArgumentError, not OverflowError.
cdef int to_int32(object value, str field) except? -1
