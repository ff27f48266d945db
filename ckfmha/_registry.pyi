import os
from collections.abc import Iterator
from typing import Any

from ckfmha.problem import FwdProblem

class Registry:
    def __len__(self) -> int: ...
    def names(self) -> list[str]: ...
    def __iter__(self) -> Iterator[str]: ...
    def __contains__(self, name: object) -> bool: ...
    def to_json(self) -> str: ...
    def kernels(self) -> list[dict[str, Any]]: ...
    def load_module(self, path: str | os.PathLike[str]) -> int: ...

class Dispatcher:
    def select(
        self, problem: FwdProblem | None = None, *, arch: int | str | None = None,
        selection: str | None = None, **fields: Any
    ) -> str: ...
    def explain(
        self, problem: FwdProblem | None = None, *, arch: int | str | None = None,
        selection: str | None = None, **fields: Any
    ) -> str: ...
    def workspace_size(
        self, problem: FwdProblem | None = None, *, arch: int | str | None = None,
        selection: str | None = None, **fields: Any
    ) -> int: ...
    def select_bwd(
        self,
        problem: FwdProblem | None = None,
        *,
        arch: int | str | None = None,
        deterministic: bool = False,
        selection: str | None = None,
        **fields: Any,
    ) -> tuple[str, str, str]: ...
    def explain_bwd(
        self,
        problem: FwdProblem | None = None,
        *,
        arch: int | str | None = None,
        deterministic: bool = False,
        selection: str | None = None,
        **fields: Any,
    ) -> str: ...
