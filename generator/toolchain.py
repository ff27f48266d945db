"""The compiler backend seam: how instance and runtime sources become a shared library.

setup.py and the runtime JIT both build through a Toolchain, so flags and dependency tracking
live in one place. CudaToolchain drives nvcc; a HIP toolchain for gfx targets (hipcc/amdclang)
would be a second implementation of the same interface, selected by arch family.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from .specs import ArchSpec

# One flag list for every nvcc compile, so setup.py builds and JIT builds cannot drift.
NVCC_FLAGS: tuple[str, ...] = (
    "-std=c++17",
    "-O3",
    "--use_fast_math",
    "--expt-relaxed-constexpr",
    "-Xcompiler",
    "-fPIC",
    # Only CKFMHA_API symbols leave the library; instance symbols stay internal.
    "-Xcompiler",
    "-fvisibility=hidden",
    "-DNDEBUG",
)
# Static cudart: the library then needs only the driver (libcuda) at run time.
NVCC_LINK_FLAGS: tuple[str, ...] = ("-shared", "-cudart", "static", "-Xlinker", "--no-undefined")
NVCC_LINK_LIBS: tuple[str, ...] = ("-ldl",)


class ToolchainError(RuntimeError):
    """A compiler or header dependency is missing."""


class CompileError(ToolchainError):
    """A compiler process failed; carries the command and its diagnostics."""

    def __init__(self, command: Sequence[str], output: str) -> None:
        self.command = list(command)
        self.output = output
        super().__init__(f"command failed:\n  {' '.join(self.command)}\n{output}")


@dataclass(frozen=True)
class CompileJob:
    source: Path
    object: Path
    # None: a runtime source; a .cu one gets every arch of the build, a .cpp one none.
    arch: str | None


# (jobs finished so far, total, the job, whether it was up to date and skipped)
ProgressFn = Callable[[int, int, CompileJob, bool], None]


def find_nvcc(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("CKFMHA_NVCC"):
        nvcc = Path(env["CKFMHA_NVCC"])
        if not nvcc.is_file():
            raise ToolchainError(f"CKFMHA_NVCC={nvcc} does not exist")
        return nvcc
    for home_var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(home_var):
            nvcc = Path(env[home_var]) / "bin" / "nvcc"
            if nvcc.is_file():
                return nvcc
    found = shutil.which("nvcc", path=env.get("PATH"))
    if found:
        return Path(found)
    fallback = Path("/usr/local/cuda/bin/nvcc")
    if fallback.is_file():
        return fallback
    raise ToolchainError(
        "nvcc not found: set CKFMHA_NVCC or CUDA_HOME, or put nvcc on PATH (CUDA 12+ toolkit)"
    )


def parse_nvcc_version(text: str) -> str:
    """'Cuda compilation tools, release 13.0, V13.0.88' -> '13.0.88'."""
    match = re.search(r"\bV(\d+\.\d+\.\d+)", text) or re.search(r"release (\d+\.\d+)", text)
    if not match:
        raise ToolchainError(f"cannot parse the nvcc version from: {text.strip()!r}")
    return match.group(1)


def _is_cutlass_include(path: Path) -> bool:
    return (path / "cutlass" / "cutlass.h").is_file() and (path / "cute").is_dir()


def find_cutlass_include(environ: Mapping[str, str] | None = None) -> Path:
    """CUTLASS/CuTe headers: $CKFMHA_CUTLASS_INCLUDE, else the nvidia-cutlass wheel."""
    env = os.environ if environ is None else environ
    if env.get("CKFMHA_CUTLASS_INCLUDE"):
        path = Path(env["CKFMHA_CUTLASS_INCLUDE"])
        if not _is_cutlass_include(path):
            raise ToolchainError(
                f"CKFMHA_CUTLASS_INCLUDE={path} does not contain cutlass/cutlass.h and cute/"
            )
        return path
    # find_spec locates the wheel without importing it (importing pulls in cuda-python).
    spec = importlib.util.find_spec("cutlass_library")
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / "source" / "include"
        if _is_cutlass_include(path):
            return path
    raise ToolchainError(
        "CUTLASS/CuTe headers not found: `pip install nvidia-cutlass` or set "
        "CKFMHA_CUTLASS_INCLUDE to a directory holding cutlass/ and cute/"
    )


def read_depfile(path: Path) -> list[Path]:
    """Prerequisites from a make-style dependency file (as written by nvcc -MD -MF)."""
    text = path.read_text().replace("\\\n", " ")
    _, _, prerequisites = text.partition(": ")
    # Spaces inside file names are escaped as '\ '.
    return [Path(p.replace("\\ ", " ")) for p in re.split(r"(?<!\\)\s+", prerequisites) if p]


class Toolchain(ABC):
    """Compiles sources to objects and links objects into a shared library."""

    @abstractmethod
    def version(self) -> str: ...

    @abstractmethod
    def compile_command(self, job: CompileJob, depfile: Path) -> list[str]: ...

    @abstractmethod
    def link_command(
        self, objects: Sequence[Path], output: Path, extra: Sequence[str]
    ) -> list[str]: ...

    def _stamp(self, command: Sequence[str]) -> str:
        return hashlib.sha256("\0".join([self.version(), *command]).encode()).hexdigest()

    def _up_to_date(
        self, output: Path, inputs: Sequence[Path], stamp_file: Path, stamp: str
    ) -> bool:
        """Fresh when the command is unchanged and no input is newer than the output."""
        if not output.is_file() or not stamp_file.is_file() or stamp_file.read_text() != stamp:
            return False
        built = output.stat().st_mtime
        try:
            return all(p.stat().st_mtime <= built for p in inputs)
        except OSError:  # a header that no longer exists
            return False

    def _run(self, command: Sequence[str]) -> None:
        result = subprocess.run(command, check=False, capture_output=True, text=True)
        if result.returncode != 0:
            raise CompileError(command, (result.stdout + result.stderr).strip())

    def compile(self, job: CompileJob) -> bool:
        """Compiles one source unless its object is current; returns True if it was skipped."""
        depfile = job.object.with_name(job.object.name + ".d")
        stamp_file = job.object.with_name(job.object.name + ".cmd")
        command = self.compile_command(job, depfile)
        stamp = self._stamp(command)
        if depfile.is_file() and self._up_to_date(
            job.object, [job.source, *read_depfile(depfile)], stamp_file, stamp
        ):
            return True
        job.object.parent.mkdir(parents=True, exist_ok=True)
        stamp_file.unlink(missing_ok=True)
        self._run(command)
        stamp_file.write_text(stamp)
        return False

    def compile_many(
        self, jobs: Sequence[CompileJob], max_workers: int = 1, progress: ProgressFn | None = None
    ) -> list[Path]:
        """Compiles in parallel (each job is its own compiler process); the first failure
        cancels what has not started and is raised."""
        done = 0
        with ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
            futures: dict[Future[bool], CompileJob] = {
                pool.submit(self.compile, j): j for j in jobs
            }
            pending = set(futures)
            while pending:
                # FIRST_COMPLETED, not FIRST_EXCEPTION: the latter returns only once every job is
                # done (when none fails), which would hold all progress back to the end.
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    error = future.exception()
                    if error is not None:
                        for other in pending:
                            other.cancel()
                        raise error
                    done += 1
                    if progress is not None:
                        progress(done, len(jobs), futures[future], bool(future.result()))
        return [job.object for job in jobs]

    def link_shared(self, objects: Sequence[Path], output: Path, extra: Sequence[str] = ()) -> bool:
        """Links a shared library unless it is current; returns True if it was skipped."""
        command = self.link_command(objects, output, extra)
        stamp_file = output.with_name(output.name + ".cmd")
        stamp = self._stamp(command)
        if self._up_to_date(output, objects, stamp_file, stamp):
            return True
        output.parent.mkdir(parents=True, exist_ok=True)
        stamp_file.unlink(missing_ok=True)
        self._run(command)
        stamp_file.write_text(stamp)
        return False


class CudaToolchain(Toolchain):
    def __init__(
        self,
        archs: Sequence[ArchSpec],
        include_dirs: Sequence[Path],
        nvcc: Path | None = None,
        cutlass_include: Path | None = None,
        extra_flags: Sequence[str] = (),
    ) -> None:
        self.archs = {arch.name: arch for arch in archs}
        self.include_dirs = [Path(p) for p in include_dirs]
        self.nvcc = nvcc or find_nvcc()
        self.cutlass_include = cutlass_include or find_cutlass_include()
        self.extra_flags = list(extra_flags)
        self._version: str | None = None

    def version(self) -> str:
        if self._version is None:
            result = subprocess.run(
                [str(self.nvcc), "--version"], check=False, capture_output=True, text=True
            )
            if result.returncode != 0:
                raise ToolchainError(f"{self.nvcc} --version failed: {result.stderr.strip()}")
            self._version = parse_nvcc_version(result.stdout)
        return self._version

    def gencode_flags(self, arch: str | None) -> list[str]:
        """Only the instance's own arch, so each kernel is compiled once; runtime sources
        (arch None) embed every arch of the build in case they hold device code."""
        if arch is None:
            return [a.gencode for a in self.archs.values()]
        if arch not in self.archs:
            raise ToolchainError(f"arch {arch!r} is not part of this build: {sorted(self.archs)}")
        return [self.archs[arch].gencode]

    def include_flags(self) -> list[str]:
        flags = [f"-I{p}" for p in self.include_dirs]
        # -isystem keeps warnings from third-party headers out of the build log.
        return [*flags, "-isystem", str(self.cutlass_include)]

    def compile_command(self, job: CompileJob, depfile: Path) -> list[str]:
        host_only = job.source.suffix in (".cpp", ".cc", ".cxx")
        gencodes = [] if host_only else self.gencode_flags(job.arch)
        return [
            str(self.nvcc),
            *NVCC_FLAGS,
            *self.extra_flags,
            *self.include_flags(),
            *gencodes,
            "-MD",
            "-MF",
            str(depfile),
            "-c",
            str(job.source),
            "-o",
            str(job.object),
        ]

    def link_command(
        self, objects: Sequence[Path], output: Path, extra: Sequence[str]
    ) -> list[str]:
        return [
            str(self.nvcc),
            *NVCC_LINK_FLAGS,
            *self.gencode_flags(None),
            *(str(o) for o in objects),
            "-o",
            str(output),
            *NVCC_LINK_LIBS,
            *extra,
        ]
