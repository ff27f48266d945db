# cython: language_level=3
"""Plan selection from Python: the process's mode, the learned cost model and the tuning table
(see "plan selection" in ckfmha.h). ckfmha.selection wraps these with defaults and a context
manager."""

import os

cimport ckfmha as capi
from ckfmha._problem cimport fill_bwd_problem, fill_fwd_problem
from ckfmha._status cimport check

from ckfmha.problem import FwdProblem

MODES = ("heuristic", "learned", "tuned")


def set_selection(str mode) -> None:
    """Who picks automatic plans in this process: "heuristic", "learned" or "tuned"."""
    if mode not in MODES:
        raise ValueError(f"selection {mode!r}: one of {', '.join(MODES)}")
    cdef int index = MODES.index(mode)
    check(capi.ckfmha_set_selection(<capi.ckfmha_selection>index))


def get_selection() -> str:
    """The process's selection mode."""
    cdef capi.ckfmha_selection mode
    check(capi.ckfmha_get_selection(&mode))
    return MODES[<int>mode]


def load_selection_model(path) -> str:
    """Parses a cost model file and makes it the process's attention or convolution model (its
    features line says which); returns its description."""
    encoded = os.fsencode(os.fspath(path))
    check(capi.ckfmha_selection_model_load(encoded))
    return conv_selection_model_info() if _names_conv_features(path) else selection_model_info()


def _names_conv_features(path) -> bool:
    """Whether a model file (one the library just parsed) ranks convolution plans."""
    with open(path, encoding="utf-8") as f:
        return any(line.startswith("features spatial_dims ") for line in f)


def selection_model_info() -> str:
    """The loaded attention cost model's description, or "none"."""
    cdef char buf[1024]
    cdef size_t needed = 0
    check(capi.ckfmha_selection_model_info(buf, sizeof(buf), &needed))
    return buf.decode("utf-8", "replace")


def conv_selection_model_info() -> str:
    """The loaded convolution cost model's description, or "none"."""
    cdef char buf[1024]
    cdef size_t needed = 0
    check(capi.ckfmha_conv_selection_model_info(buf, sizeof(buf), &needed))
    return buf.decode("utf-8", "replace")


def tuning_add(str kind, str kernel, int num_splits, float ms, **fields) -> None:
    """Records `kernel` (split-KV kernels with `num_splits`; 0 for one-stage and backward main
    stages) as the fastest plan of the exact problem `fields` describes (FwdProblem fields;
    kind "fwd" or "bwd")."""
    cdef capi.ckfmha_fwd_problem fwd_problem
    cdef capi.ckfmha_bwd_problem bwd_problem
    encoded = kernel.encode()
    if kind == "fwd":
        fill_fwd_problem(FwdProblem(**fields), &fwd_problem)
        check(capi.ckfmha_tuning_add_fwd(&fwd_problem, encoded, num_splits, ms))
    elif kind == "bwd":
        fill_bwd_problem(FwdProblem(**fields), False, &bwd_problem)
        check(capi.ckfmha_tuning_add_bwd(&bwd_problem, encoded, ms))
    else:
        raise ValueError(f"kind {kind!r}: 'fwd' or 'bwd'")


def save_tuning(path) -> int:
    """Writes the tuning table (with this library's version and build, the driver's version and
    the device's name); returns the entries written."""
    cdef int entries = 0
    encoded = os.fsencode(os.fspath(path))
    check(capi.ckfmha_tuning_save(encoded, &entries))
    return entries


def load_tuning(path) -> int:
    """Adds a tuning table's entries; raises CkfmhaError for a table of another library
    version or build, driver or device. Returns the entries loaded."""
    cdef int entries = 0
    encoded = os.fsencode(os.fspath(path))
    check(capi.ckfmha_tuning_load(encoded, &entries))
    return entries


def clear_tuning() -> None:
    """Forgets every tuning entry."""
    check(capi.ckfmha_tuning_clear())
