from collections.abc import Collection
from typing import Any

class ArrayView:
    @property
    def ptr(self) -> int: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def strides(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> int: ...
    @property
    def protocol(self) -> str: ...
    @property
    def source(self) -> Any: ...
    @property
    def is_staged(self) -> bool: ...
    @property
    def dtype_name(self) -> str: ...

def as_view(
    obj: Any,
    stream: int = 0,
    dtype: Any = None,
    name: str = "array",
    ndim: int = 4,
    allowed: Collection[int] | None = None,
    writable: bool = False,
) -> ArrayView: ...
