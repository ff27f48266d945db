from typing import Any, Literal

def append_kv(
    k_cache: Any,
    v_cache: Any,
    k_new: Any,
    v_new: Any,
    cache_seqlens: Any,
    *,
    cos: Any = None,
    sin: Any = None,
    rotary_interleaved: bool = False,
    q: Any = None,
    q_out: Any = None,
    block_table: Any = None,
    cache_layout: Literal["bshd", "bhsd"] = "bshd",
    page_layout: Literal["linear", "vectorized"] = "linear",
    overflow: Any = None,
    kernel: str | None = None,
    stream: Any = None,
    dtype: Any = None,
    validate: bool | None = None,
    kv_dtype: Any = None,
    k_scale: float | Any = None,
    v_scale: float | Any = None,
) -> Any: ...
def select_append_kv(*, arch: int | str | None = None, **fields: Any) -> str: ...
def explain_append_kv(*, arch: int | str | None = None, **fields: Any) -> str: ...
