"""The runtime JIT: resolve kernel names, compile one module per kernel into a cache, load it.

Compiling needs nvcc and the CUTLASS/CuTe headers but no GPU; loading a module only
registers its kernels.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.jit_toolchain import skip_without_jit_toolchain

import ckfmha
from ckfmha import _cache, jit


def _unregistered_sm80_kernel() -> str:
    """A ci kernel when the library lacks it, else any sm_80 kernel it lacks."""
    registered = set(ckfmha.Registry().names())
    for kernel_set in ("ci", "full"):
        for config in jit.resolve(kernel_set, arch="sm_80"):
            if config.name not in registered:
                return config.name
    pytest.skip("every sm_80 kernel is already registered")


def test_resolve_kernel_set_names_and_configs():
    configs = jit.resolve("ci", arch="sm_80")
    assert configs and all(c.algorithm.arch == "sm_80" for c in configs)
    names = [c.name for c in configs]
    assert [c.name for c in jit.resolve(names)] == names
    assert jit.resolve(configs[:1]) == configs[:1]
    assert [c.name for c in jit.resolve(names[0])] == names[:1]
    # Duplicates collapse, order is kept.
    assert [c.name for c in jit.resolve([names[1], names[0], names[1]])] == names[1::-1]


def test_resolve_arch_spellings():
    assert jit.resolve("ci", arch=80) == jit.resolve("ci", arch="sm_80")


def test_resolve_unknown_kernel_suggests_names():
    name = jit.resolve("ci", arch="sm_80")[0].name
    with pytest.raises(ValueError, match="did you mean"):
        jit.resolve([name[:-2] + "x9"])
    # A well-formed name whose config the rules refuse says why.
    with pytest.raises(ValueError, match="cannot be built: stages=9 is not supported"):
        jit.resolve([name[:-1] + "9"])
    with pytest.raises(TypeError):
        jit.resolve([42])


def test_resolve_takes_names_outside_every_kernel_set():
    name = "fwd_bf16_batch_d256x256_causal_lse_softcap__sm_90a_sm80_cpasync_mma_m128n64k256_w8s1"
    spec = jit.generator_modules().specs.load_specs()["sm_90a"]
    first_use_name = jit.preferred_configs(
        jit.generator_modules().names.parse_kernel_name(name).signature, spec
    )[0].name
    assert [c.name for c in jit.resolve([first_use_name])] == [first_use_name]


def test_registered_kernels_need_no_compiler(tmp_path: Path):
    names = ckfmha.Registry().names()
    cache = tmp_path / "cache"
    assert jit.build(names[:2], cache_dir=cache, progress=False) == names[:2]
    assert not cache.exists()


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("CKFMHA_CACHE_DIR", str(tmp_path / "mine"))
    assert jit.default_cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("CKFMHA_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert jit.default_cache_dir() == tmp_path / "xdg" / "ckfmha"


def test_publish_replaces_atomically(tmp_path: Path):
    built = tmp_path / "work" / "module.so"
    built.parent.mkdir()
    built.write_bytes(b"new")
    destination = tmp_path / "cache" / "arch" / "kernel.so"
    with _cache.locked(tmp_path / "cache"):
        _cache.publish(built, destination)
    assert destination.read_bytes() == b"new" and not built.exists()
    assert (tmp_path / "cache" / _cache.LOCK_NAME).is_file()


@pytest.mark.slow
def test_build_compiles_caches_and_registers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    skip_without_jit_toolchain()
    name = _unregistered_sm80_kernel()
    registry = ckfmha.Registry()
    before = len(registry)

    assert jit.build([name], cache_dir=tmp_path, max_workers=2, progress=False) == [name]
    modules = jit.cached_modules(tmp_path)
    assert len(modules) == 1 and modules[0].name.startswith(name + "-")
    assert modules[0].parent.name == "sm_80"
    assert name in registry and len(registry) == before + 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".build-")]
    built_at = modules[0].stat().st_mtime_ns

    # A second build must come from the cache: compiling now would fail.
    def no_compiling(*args: object, **kwargs: object) -> None:
        raise AssertionError("the cached module was rebuilt")

    monkeypatch.setattr(jit, "_compile", no_compiling)
    assert jit.build([name], cache_dir=tmp_path, progress=False, skip_registered=False) == [name]
    assert modules[0].stat().st_mtime_ns == built_at
    assert len(registry) == before + 1
    assert registry.load_module(modules[0]) == 0
    assert os.access(modules[0], os.R_OK)
