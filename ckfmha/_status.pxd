# cython: language_level=3
# The one place where a C status code becomes a Python exception.

cdef int check(int status) except -1
