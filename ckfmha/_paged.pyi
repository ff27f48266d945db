from typing import Any, Literal

from ckfmha._fwd import Alignment

def fwd_paged(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    *,
    block_table: Any = None,
    seqlens_k: Any = None,
    kv_indices: Any = None,
    kv_indptr: Any = None,
    cu_seqlens_q: Any = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    causal: bool = False,
    causal_alignment: Alignment = "top_left",
    window: tuple[int, int] | None = None,
    scale: float | None = None,
    softcap: float = 0.0,
    return_lse: bool = False,
    layout: Literal["bhsd", "bshd"] = "bhsd",
    page_layout: Literal["linear", "vectorized"] = "linear",
    num_splits: int = 0,
    out: Any = None,
    lse_out: Any = None,
    kernel: str | None = None,
    stream: Any = None,
    dtype: Any = None,
    validate: bool | None = None,
    workspace: Any = None,
) -> Any: ...
