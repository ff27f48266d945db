"""The on-disk cache of JIT-built kernel modules: where it is, what keys it, who may write.

One entry per kernel, at
``<cache>/ckfmha-<version>/nvcc-<version>/<arch>/<kernel name>-<source hash>.so``. The hash
covers the generated source and every kernel header and CUTLASS header it can include, so
neither a generator change nor an edited kernel can load a stale module. Kernels compiled
together share one module: their entries are hard links to it. Modules are built in a
private directory and moved in with an atomic rename; a lock file serialises builders so
two processes do not compile the same kernels twice.
"""

from __future__ import annotations

import contextlib
import functools
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


@functools.cache
def headers_digest(*include_dirs: Path) -> str:
    """One hash over the headers under ``include_dirs`` (names and contents), computed once per
    process: ckfmha's kernel headers (a few hundred KB) and CUTLASS's version header, which
    stands for the rest of the wheel (its headers change only with its version)."""
    digest = hashlib.sha256()
    for root in include_dirs:
        root = Path(root)
        ckfmha_headers = root / "ckfmha"
        files = (
            sorted(p for p in ckfmha_headers.rglob("*") if p.is_file())
            if ckfmha_headers.is_dir()
            else [root / "cutlass" / "version.h"]
        )
        for path in files:
            digest.update(str(path.relative_to(root)).encode() + b"\0")
            digest.update(path.read_bytes() if path.is_file() else b"(missing)")
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


def publish_all(built: Path, destinations: list[Path]) -> None:
    """Publish one module under several kernels' entries: the first gets the file, the others
    hard links to it (a copy where links are not possible), each appearing atomically."""
    first, *others = destinations
    publish(built, first)
    for destination in others:
        destination.parent.mkdir(parents=True, exist_ok=True)
        staged = destination.with_name(f".{destination.name}.{os.getpid()}")
        try:
            os.link(first, staged)
        except OSError:
            import shutil

            shutil.copy2(first, staged)
        os.replace(staged, destination)
