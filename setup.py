"""Builds libckfmha.so (generated kernel instances + runtime) with nvcc, then the Cython layer.

Build settings come from the environment (see generator/build_config.py): CKFMHA_ARCHS
(default: the visible GPUs' arches, else sm_80 and sm_90a), CKFMHA_KERNELS (default: the
"core" set; the rest compiles on first use), CKFMHA_JOBS, CKFMHA_KERNEL_FILTER, and for the
toolchain CKFMHA_NVCC / CUDA_HOME and CKFMHA_CUTLASS_INCLUDE. No GPU is needed to build.
Progress goes to stdout and to build/ckfmha-build.log (pip shows a build's output only with
-v: follow the log with `tail -f build/ckfmha-build.log`).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent
# The generator is imported from the checkout; build backends do not put it on sys.path.
sys.path.insert(0, str(ROOT))

from generator import build as generator_build
from generator.build_config import from_env
from generator.toolchain import CompileJob, CudaToolchain

LIBRARY_NAME = "libckfmha.so"
INCLUDE_DIR = ROOT / "cpp" / "include"
BUILD_DIR = ROOT / "build"  # kept between builds so nvcc work is incremental
BUILD_LOG = BUILD_DIR / "ckfmha-build.log"


class BuildLog:
    """Progress lines to stdout and to BUILD_LOG, with the seconds since the build started."""

    def __init__(self) -> None:
        BUILD_DIR.mkdir(parents=True, exist_ok=True)
        self.file = BUILD_LOG.open("w")
        self.start = time.monotonic()

    def __call__(self, line: str) -> None:
        stamped = f"[ckfmha {time.monotonic() - self.start:6.0f} s] {line}"
        print(stamped, flush=True)
        self.file.write(stamped + "\n")
        self.file.flush()

    def progress(self, done: int, total: int, job: CompileJob, skipped: bool) -> None:
        state = "up to date" if skipped else "compiled"
        self(f"{done}/{total} {state}: {job.source.name}")


class BuildPy(build_py):
    """A built package carries what a checkout keeps outside its packages: the C headers (for
    ckfmha.get_include() and first-use compiles) and the arch specs beside the generator."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads both from the checkout
        build_lib = Path(self.build_lib)
        shutil.copytree(INCLUDE_DIR, build_lib / "ckfmha" / "include", dirs_exist_ok=True)
        shutil.copy2(ROOT / "arch_specs.json", build_lib / "generator" / "arch_specs.json")


class BuildExt(build_ext):
    def finalize_options(self) -> None:
        super().finalize_options()
        # The Cython modules compile side by side, as the kernels do (CKFMHA_JOBS): one after
        # another they took two of a 16-core build's three minutes.
        if self.parallel is None:
            self.parallel = _build_jobs()

    def _in_place(self) -> bool:
        return bool(self.inplace or getattr(self, "editable_mode", False))

    def _build_library(self) -> Path:
        config = from_env(detect_gpus=True)
        selection = generator_build.select_from_config(config)
        toolchain = CudaToolchain(
            generator_build.arch_specs_for(config.archs),
            include_dirs=[INCLUDE_DIR, BUILD_DIR / "generated"],
        )
        runtime_sources = sorted((ROOT / "cpp" / "src").glob("*.cpp"))
        runtime_sources += sorted((ROOT / "cpp" / "src").glob("*.cu"))
        log = BuildLog()
        print(f"ckfmha: progress is logged to {BUILD_LOG}", file=sys.stderr, flush=True)
        log(
            f"nvcc {toolchain.version()}, arches {';'.join(config.archs)}, kernel set "
            f"'{config.kernels}': {len(selection.accepted)} kernels, "
            f"{len(runtime_sources)} runtime sources, {config.jobs} jobs"
        )
        built = generator_build.build_shared_library(
            toolchain,
            selection.accepted,
            BUILD_DIR / LIBRARY_NAME,
            BUILD_DIR,
            rejected=selection.rejected,
            runtime_sources=runtime_sources,
            jobs=config.jobs,
            progress=log.progress,
        )
        log(f"linked {built.library}")
        return built.library

    def run(self) -> None:
        package_dir = ROOT / "ckfmha" if self._in_place() else Path(self.build_lib) / "ckfmha"
        lib_dir = package_dir / "lib"
        lib_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(self._build_library(), lib_dir / LIBRARY_NAME)
        for ext in self.extensions:
            ext.library_dirs.append(str(lib_dir))
        super().run()


class BinaryDistribution(Distribution):
    """Always platform-specific: libckfmha.so is built even before any Cython module exists."""

    def has_ext_modules(self) -> bool:
        return True


def _build_jobs() -> int:
    return from_env(detect_gpus=False).jobs


def _extensions() -> list[Extension]:
    pyx_files = sorted((ROOT / "ckfmha").glob("*.pyx"))
    if not pyx_files:
        return []
    import numpy
    from Cython.Build import cythonize

    extensions = [
        Extension(
            f"ckfmha.{pyx.stem}",
            [str(pyx.relative_to(ROOT))],
            include_dirs=[str(INCLUDE_DIR), numpy.get_include()],
            libraries=["ckfmha"],
            # Extensions sit in ckfmha/, the library in ckfmha/lib/.
            extra_link_args=["-Wl,-rpath,$ORIGIN/lib"],
            language="c++",
        )
        for pyx in pyx_files
    ]
    jobs = _build_jobs()
    return cythonize(extensions, compiler_directives={"language_level": "3"},
                     nthreads=jobs if jobs > 1 else 0)  # fmt: skip


setup(
    # The generator installs as a package of its own, so setup.py, `python -m generator` and the
    # first-use compiler import it the same way.
    packages=[
        "ckfmha",
        "ckfmha.serving",
        "ckfmha.torch",
        "ckfmha.transformers",
        "ckfmha.tuning",
        "generator",
        "generator.rules",
    ],
    package_data={"ckfmha": ["*.pxd", "*.pyi", "py.typed", "data/*.model"]},
    # Only what package_data names: not the .pyx sources or Cython's generated .cpp files.
    include_package_data=False,
    ext_modules=_extensions(),
    cmdclass={"build_py": BuildPy, "build_ext": BuildExt},
    distclass=BinaryDistribution,
    zip_safe=False,
)
