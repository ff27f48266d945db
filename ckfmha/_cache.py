"""The on-disk cache of JIT-built kernel modules: where it is, what keys it, who may write.

One shared module per kernel, at
``<cache>/ckfmha-<version>/nvcc-<version>/<arch>/<kernel name>-<source hash>.so``. The hash
covers the generated source, so a generator change can never load a stale module.
Modules are built in a private directory and moved in with an atomic rename; a lock
file serialises builders so two processes do not compile the same kernels twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: the atomic rename alone still keeps the cache consistent.
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".lock"


def default_cache_dir() -> Path:
    """$CKFMHA_CACHE_DIR, else $XDG_CACHE_HOME/ckfmha, else ~/.cache/ckfmha."""
    explicit = os.environ.get("CKFMHA_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ckfmha"


def module_dir(cache_dir: Path, ckfmha_version: str, nvcc_version: str, arch: str) -> Path:
    return Path(cache_dir) / f"ckfmha-{ckfmha_version}" / f"nvcc-{nvcc_version}" / arch


def source_hash(*sources: str) -> str:
    digest = hashlib.sha256()
    for text in sources:
        digest.update(text.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def module_path(directory: Path, kernel_name: str, digest: str) -> Path:
    return directory / f"{kernel_name}-{digest}.so"


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Holds an exclusive lock on ``directory`` (blocking) for the body."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / LOCK_NAME, "a+") as handle:
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def publish(built: Path, destination: Path) -> None:
    """Move a finished module into the cache; readers see the whole file or none of it."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    os.replace(built, destination)
