# cython: language_level=3
"""The kernel registry and the dispatcher's selection, as Python objects."""

import contextlib
import json
import os

from libc.stdlib cimport free, malloc

cimport ckfmha as capi
from ckfmha._problem cimport fill_bwd_problem, fill_fwd_problem
from ckfmha._status cimport check

from ckfmha._arch import parse_arch
from ckfmha.errors import BufferTooSmallError
from ckfmha.problem import FwdProblem

# Kernel names are short; the C side reports BUFFER_TOO_SMALL if one is not.
cdef enum:
    NAME_CAPACITY = 512
    # Growing output (JSON, explanations) is retried this often before giving up.
    MAX_TRIES = 8


cdef str _decode(const char* text):
    return text.decode("utf-8", "replace")


# Fills buf with text of unknown length, reporting the size it needs.
ctypedef int (*TextSource)(void* context, char* buf, size_t size, size_t* needed) noexcept nogil


cdef str _read_text(TextSource source, void* context, str what):
    """Calls ``source`` with a buffer, growing it to the reported size until the text fits."""
    cdef size_t needed = 1 << 16
    cdef char* buf = NULL
    cdef int status
    for _ in range(MAX_TRIES):
        buf = <char*>malloc(needed)
        if buf == NULL:
            raise MemoryError()
        try:
            status = source(context, buf, needed, &needed)
            if status != capi.CKFMHA_ERROR_BUFFER_TOO_SMALL:
                check(status)
                return _decode(buf)
        finally:
            free(buf)
    raise BufferTooSmallError(f"{what} kept growing", 5)


cdef int _registry_json(void* context, char* buf, size_t size, size_t* needed) noexcept nogil:
    return capi.ckfmha_registry_json(buf, size, needed)


cdef struct ExplainRequest:
    const capi.ckfmha_fwd_problem* problem
    int arch


cdef int _explanation(void* context, char* buf, size_t size, size_t* needed) noexcept nogil:
    cdef ExplainRequest* request = <ExplainRequest*>context
    return capi.ckfmha_fwd_explain(request.problem, request.arch, buf, size, needed)


cdef struct BwdExplainRequest:
    const capi.ckfmha_bwd_problem* problem
    int arch


cdef int _bwd_explanation(void* context, char* buf, size_t size, size_t* needed) noexcept nogil:
    cdef BwdExplainRequest* request = <BwdExplainRequest*>context
    return capi.ckfmha_bwd_explain(request.problem, request.arch, buf, size, needed)


# Registry.__contains__'s memo: the registered names, and the registry size they were read at.
_known_names = frozenset()
_known_count = -1


cdef class Registry:
    """Every kernel the process can launch: the library's built-in set plus loaded modules.

    There is one registry per process (owned by the C library); instances of this
    class are views of it, so they are cheap and always current.
    """

    def __len__(self) -> int:
        cdef int count = 0
        check(capi.ckfmha_registry_count(&count))
        return count

    def names(self) -> list:
        cdef char buf[NAME_CAPACITY]
        names = []
        for index in range(len(self)):
            check(capi.ckfmha_registry_name(index, buf, NAME_CAPACITY))
            names.append(_decode(buf))
        return names

    def __iter__(self):
        return iter(self.names())

    def __contains__(self, name) -> bool:
        # Every call that forces a kernel by name asks this first: the set of names is kept
        # until the registry grows (it only appends, so its count names its contents), which
        # spares reading hundreds of names through the C API per call.
        global _known_names, _known_count
        count = len(self)
        if count != _known_count:
            _known_names, _known_count = frozenset(self.names()), count
        return name in _known_names

    def to_json(self) -> str:
        """JSON array with one object per kernel (signature and algorithm fields)."""
        return _read_text(_registry_json, NULL, "registry JSON")

    def kernels(self) -> list:
        return json.loads(self.to_json())

    def load_module(self, path) -> int:
        """Load a JIT-built kernel module and register its kernels; returns how many were new."""
        cdef int added = 0
        cdef int status
        encoded = os.fsencode(os.path.abspath(os.fspath(path)))
        cdef const char* c_path = encoded
        with nogil:
            status = capi.ckfmha_registry_load_module(c_path, &added)
        check(status)
        return added

    def __repr__(self) -> str:
        return f"<ckfmha.Registry with {len(self)} kernels>"


def _as_problem(problem, kwargs) -> FwdProblem:
    if problem is None:
        return FwdProblem(**kwargs)
    if kwargs:
        raise TypeError("pass either a FwdProblem or keyword fields, not both")
    if not isinstance(problem, FwdProblem):
        raise TypeError(f"problem must be a ckfmha.FwdProblem, got {type(problem).__name__}")
    return problem


def _selection_scope(selection):
    """The selection mode for one dispatcher call (None: the process's)."""
    if selection is None:
        return contextlib.nullcontext()
    from ckfmha.selection import selection as scope

    return scope(selection)


cdef class Dispatcher:
    """Chooses a kernel for a problem, and says why the others do not fit.

    ``arch`` (90, "sm_90a", ...) defaults to the current device's, which needs a
    GPU; pass it to ask about another architecture, or on a machine without one.
    ``selection`` ("heuristic", "learned" or "tuned"; default: the process's mode,
    see ckfmha.selection) says who picks the plan.
    """

    def select(self, problem=None, *, arch=None, selection=None, **fields) -> str:
        """Name of the kernel ``fwd`` would launch for ``problem`` (or FwdProblem fields)."""
        cdef capi.ckfmha_fwd_problem c_problem
        cdef char buf[NAME_CAPACITY]
        fill_fwd_problem(_as_problem(problem, fields), &c_problem)
        with _selection_scope(selection):
            check(capi.ckfmha_fwd_select(&c_problem, parse_arch(arch), buf, NAME_CAPACITY))
        return _decode(buf)

    def explain(self, problem=None, *, arch=None, selection=None, **fields) -> str:
        """Kernel-by-kernel account of which fit ``problem`` and why the rest do not."""
        cdef capi.ckfmha_fwd_problem c_problem
        fill_fwd_problem(_as_problem(problem, fields), &c_problem)
        cdef ExplainRequest request
        request.problem = &c_problem
        request.arch = parse_arch(arch)
        with _selection_scope(selection):
            return _read_text(_explanation, &request, "explanation")

    def workspace_size(self, problem=None, *, arch=None, selection=None, **fields) -> int:
        """Bytes of workspace the plan for ``problem`` needs (0 for one-stage plans).

        ``fwd`` allocates it by itself; this is for callers managing their own memory.
        """
        cdef capi.ckfmha_fwd_problem c_problem
        cdef size_t size = 0
        fill_fwd_problem(_as_problem(problem, fields), &c_problem)
        with _selection_scope(selection):
            check(capi.ckfmha_fwd_workspace_size(&c_problem, parse_arch(arch), NULL, &size))
        return size

    def select_bwd(self, problem=None, *, arch=None, deterministic=False, selection=None,
                   **fields) -> tuple:
        """(bwd_dot_do_o, bwd_dq_dk_dv, bwd_convert_dq) kernel names ``bwd`` would launch for
        the gradients of ``problem`` (a FwdProblem, or its fields)."""
        cdef capi.ckfmha_bwd_problem c_problem
        cdef char buf[3 * NAME_CAPACITY]
        fill_bwd_problem(_as_problem(problem, fields), deterministic, &c_problem)
        with _selection_scope(selection):
            check(capi.ckfmha_bwd_select(&c_problem, parse_arch(arch), buf, 3 * NAME_CAPACITY))
        return tuple(_decode(buf).split())

    def explain_bwd(self, problem=None, *, arch=None, deterministic=False, selection=None,
                    **fields) -> str:
        """Stage-by-stage account of the backward plan for ``problem`` and why kernels do not
        fit."""
        cdef capi.ckfmha_bwd_problem c_problem
        fill_bwd_problem(_as_problem(problem, fields), deterministic, &c_problem)
        cdef BwdExplainRequest request
        request.problem = &c_problem
        request.arch = parse_arch(arch)
        with _selection_scope(selection):
            return _read_text(_bwd_explanation, &request, "explanation")

    def __repr__(self) -> str:
        return "<ckfmha.Dispatcher>"
