from collections.abc import Sequence
from typing import Any, TypeAlias

from ckfmha.conv_problem import ConvProblem

PerDim: TypeAlias = int | Sequence[int]

def conv_fwd(
    x: Any,
    w: Any,
    *,
    stride: PerDim = 1,
    padding: PerDim = 0,
    dilation: PerDim = 1,
    out: Any = None,
    kernel: str | None = None,
    stream: Any = None,
    dtype: Any = None,
) -> Any: ...
def conv_select(
    x: Any | ConvProblem,
    w: Any = None,
    *,
    stride: PerDim = 1,
    padding: PerDim = 0,
    dilation: PerDim = 1,
    out: Any = None,
    dtype: Any = None,
    arch: int | str | None = None,
    direction: str = "fwd",
) -> str: ...
def conv_explain(
    x: Any | ConvProblem,
    w: Any = None,
    *,
    stride: PerDim = 1,
    padding: PerDim = 0,
    dilation: PerDim = 1,
    out: Any = None,
    dtype: Any = None,
    arch: int | str | None = None,
    direction: str = "fwd",
) -> str: ...
