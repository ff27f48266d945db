"""Toolchain: environment parsing, nvcc/CUTLASS discovery, flags, incremental builds."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from support.paths import REPO_ROOT

from generator import build, emit, rules
from generator.build_config import BuildConfig, BuildConfigError, from_env, split_list
from generator.enumerate import select_for_arches
from generator.receipts import get_receipt
from generator.specs import load_specs
from generator.toolchain import (
    CompileError,
    CompileJob,
    CudaToolchain,
    Toolchain,
    ToolchainError,
    find_cutlass_include,
    find_nvcc,
    parse_nvcc_version,
    read_depfile,
)

HAVE_NVCC = shutil.which("nvcc") is not None or bool(os.environ.get("CUDA_HOME"))
needs_nvcc = pytest.mark.skipif(not HAVE_NVCC, reason="needs nvcc (no GPU required)")
HAVE_CUTLASS_WHEEL = importlib.util.find_spec("cutlass_library") is not None


def _fake_cutlass(root: Path) -> Path:
    (root / "cutlass").mkdir(parents=True)
    (root / "cutlass" / "cutlass.h").write_text("")
    (root / "cute").mkdir()
    return root


def _offline_toolchain(tmp_path: Path, archs: Sequence[str]) -> CudaToolchain:
    """A toolchain whose flags can be inspected without nvcc or CUTLASS installed."""
    fake_nvcc = tmp_path / "nvcc"
    fake_nvcc.write_text("")
    return CudaToolchain(
        build.arch_specs_for(archs),
        include_dirs=[tmp_path / "include"],
        nvcc=fake_nvcc,
        cutlass_include=_fake_cutlass(tmp_path / "cutlass_include"),
    )


# ---- environment ----


def test_split_list_accepts_semicolons_and_commas() -> None:
    assert split_list("sm_80;sm_90a") == ("sm_80", "sm_90a")
    assert split_list(" sm_80 , sm_86;;sm_80 ") == ("sm_80", "sm_86")
    assert split_list("") == ()


def test_env_defaults() -> None:
    config = from_env({})
    assert config.archs == ("sm_80", "sm_90a")
    assert config.kernels == "core"
    assert config.jobs == max(1, os.cpu_count() or 1)
    assert config.kernel_filter is None


def test_env_overrides() -> None:
    config = from_env(
        {
            "CKFMHA_ARCHS": "sm_86,sm_89",
            "CKFMHA_KERNELS": "ci",
            "CKFMHA_JOBS": "3",
            "CKFMHA_KERNEL_FILTER": "bf16",
        }
    )
    assert config == BuildConfig(("sm_86", "sm_89"), "ci", 3, "bf16")


@pytest.mark.parametrize("jobs", ["zero", "0", "-2"])
def test_env_rejects_bad_jobs(jobs: str) -> None:
    with pytest.raises(BuildConfigError, match="CKFMHA_JOBS"):
        from_env({"CKFMHA_JOBS": jobs})


def test_selection_from_env_config() -> None:
    selection = build.select_from_config(from_env({"CKFMHA_KERNELS": "ci"}))
    # sm_80 and sm_90a (each 9 forward kernels, a split-KV plan of 3 kernels, 4 on sm_90a with
    # its third d128 tile, 4 paged kernels, 6 on sm_90a, two backward plans of three stages and
    # two KV-cache appends), and sm_90a's Hopper kernels (four plain and three feature forwards,
    # and the wgmma main stages of both backward plans).
    assert len(selection.accepted) == 16 + 16 + 4 + 3 + 2 * 6 + 2 * 2 + 2 + 3


# ---- discovery ----


def test_parse_nvcc_version() -> None:
    text = (
        "nvcc: NVIDIA (R) Cuda compiler driver\n"
        "Cuda compilation tools, release 13.0, V13.0.88\n"
        "Build cuda_13.0.r13.0/compiler.36424714_0\n"
    )
    assert parse_nvcc_version(text) == "13.0.88"
    assert parse_nvcc_version("Cuda compilation tools, release 12.4") == "12.4"
    with pytest.raises(ToolchainError, match="cannot parse"):
        parse_nvcc_version("gcc (GCC) 12.2.0")


def test_find_nvcc_order(tmp_path: Path) -> None:
    explicit = tmp_path / "explicit" / "nvcc"
    home = tmp_path / "cuda" / "bin" / "nvcc"
    for path in (explicit, home):
        path.parent.mkdir(parents=True)
        path.write_text("")
    env = {"CKFMHA_NVCC": str(explicit), "CUDA_HOME": str(tmp_path / "cuda"), "PATH": ""}
    assert find_nvcc(env) == explicit
    env.pop("CKFMHA_NVCC")
    assert find_nvcc(env) == home
    with pytest.raises(ToolchainError, match="CKFMHA_NVCC=.* does not exist"):
        find_nvcc({"CKFMHA_NVCC": str(tmp_path / "missing")})


def test_cutlass_include_override(tmp_path: Path) -> None:
    fake = _fake_cutlass(tmp_path / "inc")
    assert find_cutlass_include({"CKFMHA_CUTLASS_INCLUDE": str(fake)}) == fake
    with pytest.raises(ToolchainError, match="does not contain cutlass/cutlass.h"):
        find_cutlass_include({"CKFMHA_CUTLASS_INCLUDE": str(tmp_path)})


@pytest.mark.skipif(not HAVE_CUTLASS_WHEEL, reason="needs the nvidia-cutlass wheel")
def test_cutlass_include_found_in_wheel() -> None:
    include = find_cutlass_include({})
    assert (include / "cute" / "tensor.hpp").is_file()
    assert (include / "cutlass" / "numeric_types.h").is_file()


def test_kernel_headers_found_in_the_checkout() -> None:
    from ckfmha import jit

    assert jit.kernel_include_dir() == REPO_ROOT / "cpp" / "include"


def test_read_depfile(tmp_path: Path) -> None:
    depfile = tmp_path / "a.o.d"
    depfile.write_text("a.o : a.cu \\\n    /inc/x.h \\\n    /my\\ dir/y.h\n")
    assert read_depfile(depfile) == [Path("a.cu"), Path("/inc/x.h"), Path("/my dir/y.h")]


# ---- flags ----


@pytest.mark.parametrize(
    ("arch", "gencode"),
    [
        ("sm_80", "-gencode=arch=compute_80,code=sm_80"),
        ("sm_86", "-gencode=arch=compute_86,code=sm_86"),
        ("sm_89", "-gencode=arch=compute_89,code=sm_89"),
        ("sm_90a", "-gencode=arch=compute_90a,code=sm_90a"),
    ],
)
def test_gencode_per_arch(tmp_path: Path, arch: str, gencode: str) -> None:
    toolchain = _offline_toolchain(tmp_path, ["sm_80", "sm_86", "sm_89", "sm_90a"])
    assert toolchain.gencode_flags(arch) == [gencode]


def test_compile_command_flags(tmp_path: Path) -> None:
    toolchain = _offline_toolchain(tmp_path, ["sm_80", "sm_90a"])
    instance = toolchain.compile_command(CompileJob(Path("k.cu"), Path("k.o"), "sm_90a"), Path("d"))
    for flag in ("-std=c++17", "-O3", "--use_fast_math", "--expt-relaxed-constexpr", "-DNDEBUG"):
        assert flag in instance
    assert "-fvisibility=hidden" in instance and "-fPIC" in instance
    assert [f for f in instance if f.startswith("-gencode")] == [
        "-gencode=arch=compute_90a,code=sm_90a"
    ]
    assert f"-I{tmp_path / 'include'}" in instance
    # Runtime .cu sources embed every arch; host .cpp sources none.
    runtime_cu = toolchain.compile_command(CompileJob(Path("r.cu"), Path("r.o"), None), Path("d"))
    assert len([f for f in runtime_cu if f.startswith("-gencode")]) == 2
    host = toolchain.compile_command(CompileJob(Path("r.cpp"), Path("r.o"), None), Path("d"))
    assert not [f for f in host if f.startswith("-gencode")]
    with pytest.raises(ToolchainError, match="not part of this build"):
        toolchain.gencode_flags("sm_86")


def test_link_command_uses_static_cudart(tmp_path: Path) -> None:
    toolchain = _offline_toolchain(tmp_path, ["sm_80"])
    command = toolchain.link_command([Path("a.o")], Path("lib.so"), ["-lfoo"])
    joined = " ".join(command)
    assert "-shared" in command and "-cudart static" in joined and "-ldl" in command
    assert "-lcuda" not in command and command[-1] == "-lfoo"


# ---- incremental, parallel builds (a copy "compiler", no nvcc needed) ----


class CopyToolchain(Toolchain):
    """Copies source to object and records the header as a dependency, like nvcc -MD."""

    def __init__(self, header: Path) -> None:
        self.header = header

    def version(self) -> str:
        return "copy-1"

    def compile_command(self, job: CompileJob, depfile: Path) -> list[str]:
        script = (
            'if grep -q FAIL "$1"; then echo "error: $1 is broken" >&2; exit 1; fi; '
            'cp "$1" "$2" && printf "%s: %s %s\\n" "$2" "$1" "$3" > "$4"'
        )
        return ["sh", "-c", script, "sh", str(job.source), str(job.object), str(self.header),
                str(depfile)]  # fmt: skip

    def link_command(
        self, objects: Sequence[Path], output: Path, extra: Sequence[str]
    ) -> list[str]:
        return ["sh", "-c", 'out="$1"; shift; cat "$@" > "$out"', "sh", str(output),
                *map(str, objects)]  # fmt: skip


def _sources(tmp_path: Path, count: int) -> tuple[CopyToolchain, list[CompileJob]]:
    header = tmp_path / "dep.h"
    header.write_text("h")
    jobs = []
    for i in range(count):
        source = tmp_path / f"s{i}.cu"
        source.write_text(f"source {i}\n")
        jobs.append(CompileJob(source, tmp_path / "obj" / f"s{i}.o", None))
    return CopyToolchain(header), jobs


def _age(*paths: Path) -> None:
    """Backdates inputs so outputs are strictly newer even on coarse-mtime file systems."""
    past = time.time() - 100
    for path in paths:
        os.utime(path, (past, past))


def test_compile_many_skips_up_to_date(tmp_path: Path) -> None:
    toolchain, jobs = _sources(tmp_path, 4)
    events: list[tuple[int, int, bool]] = []
    objects = toolchain.compile_many(jobs, 2, lambda d, n, _j, s: events.append((d, n, s)))
    assert objects == [j.object for j in jobs] and all(o.is_file() for o in objects)
    assert sorted(events) == [(1, 4, False), (2, 4, False), (3, 4, False), (4, 4, False)]
    _age(toolchain.header, *(j.source for j in jobs))
    events.clear()
    toolchain.compile_many(jobs, 2, lambda d, n, _j, s: events.append((d, n, s)))
    assert all(skipped for _, _, skipped in events)
    # A newer dependency (header) rebuilds everything that includes it.
    toolchain.header.touch()
    assert toolchain.compile(jobs[0]) is False


def test_compile_failure_reports_command_and_stderr(tmp_path: Path) -> None:
    toolchain, jobs = _sources(tmp_path, 3)
    jobs[1].source.write_text("FAIL\n")
    with pytest.raises(CompileError) as info:
        toolchain.compile_many(jobs, 2)
    assert "s1.cu is broken" in str(info.value)
    assert str(jobs[1].source) in " ".join(info.value.command)


def test_link_shared_relinks_only_when_needed(tmp_path: Path) -> None:
    toolchain, jobs = _sources(tmp_path, 2)
    objects = toolchain.compile_many(jobs)
    library = tmp_path / "lib.so"
    assert toolchain.link_shared(objects, library) is False
    assert library.read_text() == "source 0\nsource 1\n"
    _age(*objects)
    assert toolchain.link_shared(objects, library) is True
    objects[0].touch()
    assert toolchain.link_shared(objects, library) is False


# ---- real nvcc: generated instances compile and the table loads (no GPU needed) ----

# Stands in for the real kernel header: just enough for an instance to compile and link.
STAND_IN_LAUNCH_HEADER = """\
#pragma once
#include "ckfmha/kernel_entry.h"
namespace cutlass { struct half_t { unsigned short x; }; struct bfloat16_t { unsigned short x; }; }
namespace ckfmha::kernel {
enum class MaskMode { kNone, kCausal, kWindow };
enum class BiasMode { kNone, kElementwise, kAlibi };
// Instances assert the generator's numbers against their traits; a stand-in has none of its
// own, so its members agree with any.
struct AgreesWithAnyNumber {
  constexpr bool operator==(int) const { return true; }
};
template <class T, int DQ, int DV, int M, int N, int W, int S, MaskMode Mask, BiasMode Bias,
          bool Lse, bool Dropout, bool Softcap, bool Sink, bool Group, bool VColMajor = false>
struct FwdSm80Traits {
  static constexpr int kThreads = W * 32;
  static constexpr AgreesWithAnyNumber kSmemBytes{}, kMinCtasPerSm{}, kSmemLimit{},
      kConsumerRegisters{}, kRowsPerThread{}, kKeysPerThread{}, kBiasStages{}, kBiasRowsOnly{};
};
template <class Traits> __global__ void stand_in_kernel(int* out) {
  if (out) *out = Traits::kThreads;
}
template <class Traits>
int launch_fwd_sm80(const void*, const void*, const ckfmha_launch_context*, ckfmha_stream_t stream) {
  stand_in_kernel<Traits><<<1, Traits::kThreads, 0, stream>>>(nullptr);
  return Traits::kThreads;
}
}  // namespace ckfmha::kernel
"""


class KernelEntry(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("family", ctypes.c_int),
        ("dtype", ctypes.c_int),
        ("mode", ctypes.c_int),
        ("hdim_q", ctypes.c_int32),
        ("hdim_v", ctypes.c_int32),
        ("mask", ctypes.c_int),
        ("bias", ctypes.c_int),
        ("has_lse", ctypes.c_int32),
        ("has_dropout", ctypes.c_int32),
        ("has_softcap", ctypes.c_int32),
        ("has_sink", ctypes.c_int32),
        ("v_col_major", ctypes.c_int32),
        ("has_dbias", ctypes.c_int32),
        ("rope", ctypes.c_int),
        ("paged_kv", ctypes.c_int32),
        ("page_layout", ctypes.c_int),
        ("kv_quant", ctypes.c_int),
        ("q_quant", ctypes.c_int),
        ("arch", ctypes.c_int32),
        ("arch_name", ctypes.c_char_p),
        ("pipeline", ctypes.c_char_p),
        ("tile_m", ctypes.c_int32),
        ("tile_n", ctypes.c_int32),
        ("tile_k", ctypes.c_int32),
        ("warps", ctypes.c_int32),
        ("stages", ctypes.c_int32),
        ("launch", ctypes.c_void_p),
        ("resident_ctas", ctypes.c_void_p),
        ("bias_rows_only", ctypes.c_int32),
        ("conv_spatial_dims", ctypes.c_int32),
        ("conv_vector", ctypes.c_int32),
        ("conv_max_channels", ctypes.c_int32),
    ]


class KernelTable(ctypes.Structure):
    _fields_ = [
        ("abi_version", ctypes.c_int32),
        ("count", ctypes.c_int32),
        ("entries", ctypes.POINTER(KernelEntry)),
    ]


@needs_nvcc
def test_nvcc_version() -> None:
    version = _offline_toolchain_version()
    assert version.split(".")[0].isdigit()


def _offline_toolchain_version() -> str:
    nvcc = find_nvcc()
    toolchain = CudaToolchain([], [], nvcc=nvcc, cutlass_include=Path("/"))
    return toolchain.version()


@needs_nvcc
def test_module_builds_and_its_table_loads(tmp_path: Path) -> None:
    stand_in = tmp_path / "stand_in"
    kernel_dir = stand_in / "ckfmha" / "kernel"
    for family in ("sm80", "sm90", "simt"):
        (kernel_dir / family).mkdir(parents=True)
    (kernel_dir / "sm80" / "fwd_launch.cuh").write_text(STAND_IN_LAUNCH_HEADER)
    (kernel_dir / "sm90" / "fwd_launch.cuh").write_text(
        STAND_IN_LAUNCH_HEADER.replace("FwdSm80Traits", "FwdSm90Traits").replace(
            "launch_fwd_sm80", "launch_fwd_sm90"
        )
    )
    (kernel_dir / "simt" / "fwd_launch.cuh").write_text(
        STAND_IN_LAUNCH_HEADER.replace("FwdSm80Traits", "FwdSimtTraits").replace(
            "launch_fwd_sm80", "launch_fwd_simt"
        )
    )
    specs = load_specs()
    archs = ("sm_80", "sm_90a")
    # Forward kernels only: the stand-in headers replace the forward launchers.
    selection = [c for c in select_for_arches(get_receipt("ci"), archs, specs).accepted
                 if c.signature.family == "fwd"]
    # The first ci kernel of each arch and pipeline: both sm_80 templates, all three on sm_90a.
    firsts = {(c.algorithm.arch, c.algorithm.pipeline): c for c in reversed(selection)}
    kernels = [c for c in selection if firsts[(c.algorithm.arch, c.algorithm.pipeline)] is c]
    assert len(kernels) == 5
    work = tmp_path / "work"
    toolchain = CudaToolchain(
        build.arch_specs_for(archs),
        # The stand-in comes first so it shadows the real launch header.
        include_dirs=[stand_in, REPO_ROOT / "cpp" / "include", work / "generated"],
        cutlass_include=_fake_cutlass(tmp_path / "no_cutlass"),
    )
    built = build.build_shared_library(
        toolchain,
        kernels,
        tmp_path / "module.so",
        work,
        table_symbol=emit.MODULE_TABLE_SYMBOL,
        jobs=2,
    )
    library = ctypes.CDLL(str(built.library))
    table_fn = getattr(library, emit.MODULE_TABLE_SYMBOL)
    table_fn.restype = ctypes.POINTER(KernelTable)
    table = table_fn().contents
    assert (table.abi_version, table.count) == (16, len(kernels))
    loaded = [table.entries[i] for i in range(table.count)]
    assert [e.name.decode() for e in loaded] == [k.name for k in kernels]
    assert {e.arch for e in loaded} == {80, 90}
    assert all(e.launch for e in loaded)
    assert [e.bias_rows_only for e in loaded] == [int(rules.bias_rows_only(k)) for k in kernels]
    # Only the split-KV families count resident CTAs: one-stage forwards leave the query out.
    assert not any(e.resident_ctas for e in loaded)
    # Instance symbols stay hidden: only the table is exported.
    assert not hasattr(library, kernels[0].symbol)
