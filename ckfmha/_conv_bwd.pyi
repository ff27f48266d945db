from collections.abc import Sequence
from typing import Any, TypeAlias

PerDim: TypeAlias = int | Sequence[int]

def conv_bwd_data(
    dy: Any,
    w: Any,
    *,
    input_size: Sequence[int] | None = None,
    stride: PerDim = 1,
    padding: PerDim = 0,
    dilation: PerDim = 1,
    out: Any = None,
    kernel: str | None = None,
    stream: Any = None,
    dtype: Any = None,
) -> Any: ...
def conv_bwd_weight(
    x: Any,
    dy: Any,
    *,
    filter_size: Sequence[int] | None = None,
    stride: PerDim = 1,
    padding: PerDim = 0,
    dilation: PerDim = 1,
    out: Any = None,
    kernel: str | None = None,
    splits: int | None = None,
    stream: Any = None,
    dtype: Any = None,
) -> Any: ...
