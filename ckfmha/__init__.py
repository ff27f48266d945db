"""ckfmha: fused multi-head attention kernels for NVIDIA GPUs, dispatched CK Tile style.

Quick start::

    import ckfmha
    o = ckfmha.fwd(q, k, v, causal=True)          # torch / CuPy / JAX / NumPy arrays
    o, lse = ckfmha.fwd(q, k, v, causal=True, return_lse=True)
    dq, dk, dv = ckfmha.bwd(do, q, k, v, o, lse, causal=True)
    o = ckfmha.torch.attention(q, k, v, causal=True)  # torch ops + autograd (import ckfmha.torch)
    o = ckfmha.torch.sdpa(q, k, v, is_causal=True)    # F.scaled_dot_product_attention's call
    o = ckfmha.fwd_paged(q, k_cache, v_cache, block_table=table, seqlens_k=lens)  # paged KV
    ckfmha.Dispatcher().explain(batch=2, nhead_q=16, seqlen_q=4096, hdim=128, arch=90)
    q = ckfmha.append_kv(k_cache, v_cache, k_new, v_new, cache_seqlens, cos=cos, sin=sin, q=q)
    decode = ckfmha.serving.BatchDecode(...)  # plan/run, replayable in a CUDA graph
    y = ckfmha.conv_fwd(x, w, stride=2, padding=1)  # grouped conv: x [N, H, W, G, C]
    dx = ckfmha.conv_bwd_data(dy, w, input_size=(H, W), stride=2, padding=1)  # and its gradients
"""

from __future__ import annotations

import os

from ckfmha._appendkv import append_kv, explain_append_kv, select_append_kv
from ckfmha._bwd import bwd, bwd_varlen
from ckfmha._conv import conv_explain, conv_fwd, conv_select
from ckfmha._conv_bwd import conv_bwd_data, conv_bwd_weight
from ckfmha._device import (
    current_device,
    device_arch,
    device_count,
    header_version,
    set_device,
    version,
)
from ckfmha._fwd import fwd, fwd_varlen
from ckfmha._memory import (
    DeviceArray,
    check_errors,
    device_ptr,
    empty,
    from_host,
    synchronize,
)
from ckfmha._paged import fwd_paged
from ckfmha._registry import Dispatcher, Registry
from ckfmha._status import last_error, status_name
from ckfmha.conv_problem import ConvProblem
from ckfmha.errors import (
    BufferTooSmallError,
    CkfmhaError,
    CudaError,
    DeviceMetadataError,
    InternalError,
    InvalidArgumentError,
    NoDeviceError,
    NotFoundError,
    UnsupportedError,
)
from ckfmha.page_layouts import to_linear_pages, to_vectorized_pages
from ckfmha.problem import FwdProblem
from ckfmha.selection import (
    clear_tuning,
    conv_selection_model_info,
    default_tuning_path,
    get_selection,
    load_selection_model,
    load_tuning,
    save_tuning,
    selection,
    selection_model_info,
    set_selection,
    tuning_add,
)

__version__ = "0.1.0"

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def get_include() -> list[str]:
    """Include directories for extensions that ``cimport ckfmha`` or include ckfmha/ckfmha.h.

    The first holds the ckfmha package (Cython finds ckfmha/__init__.pxd there);
    the second the C headers (installed copy, or cpp/include in a source tree).
    """
    headers = os.path.join(_PACKAGE_DIR, "include")
    if not os.path.isfile(os.path.join(headers, "ckfmha", "ckfmha.h")):
        source_tree = os.path.join(os.path.dirname(_PACKAGE_DIR), "cpp", "include")
        if os.path.isfile(os.path.join(source_tree, "ckfmha", "ckfmha.h")):
            headers = source_tree
    return [os.path.dirname(_PACKAGE_DIR), headers]


def get_library_dir() -> str:
    """Directory holding libckfmha.so, for linking (-L) and as an rpath."""
    return os.path.join(_PACKAGE_DIR, "lib")


__all__ = [
    "BufferTooSmallError",
    "CkfmhaError",
    "ConvProblem",
    "CudaError",
    "DeviceArray",
    "DeviceMetadataError",
    "Dispatcher",
    "FwdProblem",
    "InternalError",
    "InvalidArgumentError",
    "NoDeviceError",
    "NotFoundError",
    "Registry",
    "UnsupportedError",
    "__version__",
    "append_kv",
    "bwd",
    "bwd_varlen",
    "check_errors",
    "clear_tuning",
    "conv_bwd_data",
    "conv_bwd_weight",
    "conv_explain",
    "conv_fwd",
    "conv_select",
    "conv_selection_model_info",
    "current_device",
    "default_tuning_path",
    "device_arch",
    "device_count",
    "device_ptr",
    "empty",
    "explain_append_kv",
    "from_host",
    "fwd",
    "fwd_paged",
    "fwd_varlen",
    "get_include",
    "get_library_dir",
    "get_selection",
    "header_version",
    "last_error",
    "load_selection_model",
    "load_tuning",
    "save_tuning",
    "select_append_kv",
    "selection",
    "selection_model_info",
    "set_device",
    "set_selection",
    "status_name",
    "synchronize",
    "to_linear_pages",
    "to_vectorized_pages",
    "tuning_add",
    "version",
]
