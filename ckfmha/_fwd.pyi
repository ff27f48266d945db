from typing import Any, Literal

def fwd(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    causal_alignment: Literal["top_left", "bottom_right"] = "top_left",
    scale: float | None = None,
    return_lse: bool = False,
    layout: Literal["bhsd", "bshd"] = "bhsd",
    out: Any = None,
    lse_out: Any = None,
    kernel: str | None = None,
    stream: Any = None,
    dtype: Any = None,
) -> Any: ...
