# cython: language_level=3
# Problem-setup and workspace helpers of the convolution forward runner that the backward
# runners share.

cimport ckfmha as capi
from libc.stdint cimport int64_t

cdef int _init_geometry(capi.ckfmha_conv_problem* problem, int dtype, tuple x_shape,
                        tuple w_shape, stride, padding, dilation) except -1
cdef int _set_outer(int64_t* dst, tuple strides) except -1
cdef tuple _y_shape(capi.ckfmha_conv_problem* p)
cdef object _workspace(capi.ckfmha_conv_problem* problem, int direction, str kind, like,
                       handle)
