"""Compiling on first use without a GPU: what each documented problem needs, the decision to
build or to explain, the cache key, and two processes sharing one build."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.jit_toolchain import skip_without_jit_toolchain
from support.paths import REPO_ROOT

import ckfmha
from ckfmha import _cache, first_use, jit
from ckfmha.errors import UnsupportedError
from ckfmha.first_use import AppendKvKey, BwdKey, FwdKey

FP16, BF16, FP32 = 0, 1, 2
BATCH, GROUP = 0, 1
NONE, CAUSAL, CAUSAL_BR, WINDOW = 0, 1, 2, 3
NO_BIAS, ELEMENTWISE, ALIBI = 0, 1, 2
HDIMS = ((32, 32), (64, 64), (96, 96), (128, 128), (192, 128), (256, 256))


def _fwd(**fields: object) -> FwdKey:
    defaults = {
        "dtype": BF16, "mode": BATCH, "hdim_q": 128, "hdim_v": 128, "mask": NONE, "bias": NO_BIAS,
        "dropout": False, "softcap": False, "sink": False, "v_col_major": False, "kv_storage": 0,
        "page_layout": 0, "forced_splits": False, "decode_shaped": False,
    }  # fmt: skip
    return FwdKey(**{**defaults, **fields})


def _families(configs: list) -> list[str]:
    return [c.signature.family for c in configs]


# ---- every documented combination has a kernel to build (README "Forward features") ----


def _documented_fwd_keys() -> list[FwdKey]:
    """The README's forward features, every combination: dtypes, head dims, masks, bias or
    ALiBi, soft-cap, sinks, dropout, LSE, batch and group mode; column-major V at d64/d128
    (fp16/bf16, no mask or causal)."""
    keys = [
        _fwd(dtype=dtype, mode=mode, hdim_q=q, hdim_v=v, mask=mask, bias=bias,
             dropout=dropout, softcap=softcap, sink=sink)
        for dtype, mode, (q, v), mask, bias, dropout, softcap, sink in itertools.product(
            (FP16, BF16, FP32), (BATCH, GROUP), HDIMS, (NONE, CAUSAL, WINDOW),
            (NO_BIAS, ELEMENTWISE, ALIBI), (False, True), (False, True), (False, True),
        )
    ]  # fmt: skip
    keys += [
        _fwd(dtype=dtype, mode=mode, hdim_q=h, hdim_v=h, mask=mask, v_col_major=True)
        for dtype, mode, h, mask in itertools.product(
            (FP16, BF16), (BATCH, GROUP), (64, 128), (NONE, CAUSAL)
        )
    ]
    return keys


def _documented_decode_keys() -> list[FwdKey]:
    """Split-KV and paged plans: fp16/bf16, d64/d128, every mask, soft-cap, LSE, both modes;
    paged caches in linear and vectorized pages."""
    keys = []
    for dtype, mode, h, mask, softcap in itertools.product(
        (FP16, BF16), (BATCH, GROUP), (64, 128), (NONE, CAUSAL_BR, WINDOW), (False, True)
    ):
        common = {"dtype": dtype, "mode": mode, "hdim_q": h, "hdim_v": h, "mask": mask, "softcap": softcap}
        keys.append(_fwd(**common, decode_shaped=True))
        keys.append(_fwd(**common, forced_splits=True))
        keys += [_fwd(**common, kv_storage=1, page_layout=layout) for layout in (0, 1)]
    return keys


def _documented_bwd_keys() -> list[BwdKey]:
    """The README's backward: every head dim, mask and mode; soft-cap, bias, ALiBi, dropout
    and the elementwise bias's gradient."""
    return [
        BwdKey(dtype, mode, q, v, mask, bias, dropout, softcap, dbias)
        for dtype, mode, (q, v), mask, bias, dropout, softcap, dbias in itertools.product(
            (FP16, BF16), (BATCH, GROUP), HDIMS, (NONE, CAUSAL, WINDOW),
            (NO_BIAS, ELEMENTWISE, ALIBI), (False, True), (False, True), (False, True),
        )
        if not dbias or bias == ELEMENTWISE
    ]  # fmt: skip


def _documented_appendkv_keys() -> list[AppendKvKey]:
    keys = [
        AppendKvKey(dtype, h, h, rope, paged)
        for dtype, h, rope, paged in itertools.product(
            (FP16, BF16), (32, 64, 96, 128, 256), (0, 1, 2), (False, True)
        )
    ]
    return keys + [AppendKvKey(FP32, h, h, 2, True) for h in (64, 128)]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_every_documented_combination_has_kernels_to_build(arch: str) -> None:
    keys = (
        _documented_fwd_keys() + _documented_decode_keys() + _documented_bwd_keys()
        + _documented_appendkv_keys()
    )  # fmt: skip
    unbuildable = [key for key in keys if not first_use.kernels_for(key, arch)]
    assert not unbuildable, f"{len(unbuildable)} of {len(keys)}, e.g. {unbuildable[:3]}"
    assert len(keys) > 3500


def test_documented_keys_get_their_plans() -> None:
    assert _families(first_use.kernels_for(_fwd(), "sm_90a")) == ["fwd"]
    decode = first_use.kernels_for(_fwd(decode_shaped=True, mask=CAUSAL_BR), "sm_90a")
    assert set(_families(decode)) == {"fwd_splitkv", "fwd_splitkv_combine"}
    assert _families(decode).count("fwd_splitkv") >= 2, "every split tile: picked by shape"
    # A decode-shaped problem the split kernels cannot take runs one stage.
    assert _families(first_use.kernels_for(_fwd(decode_shaped=True, sink=True), "sm_90a")) == [
        "fwd"
    ]
    paged = first_use.kernels_for(_fwd(mode=GROUP, kv_storage=2, page_layout=1), "sm_80")
    assert set(_families(paged)) == {"batch_prefill", "fwd_splitkv_combine"}
    assert all(c.signature.page_layout == "vectorized" for c in paged if c.signature.family !=
               "fwd_splitkv_combine")
    bwd = first_use.kernels_for(BwdKey(BF16, BATCH, 128, 128, CAUSAL, 0, False, False, False),
                                "sm_90a")
    assert _families(bwd) == ["bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq"]
    assert bwd[1].algorithm.pipeline == "sm90_tma_wgmma"
    # The Hopper main stage adds dQ with atomics: a deterministic backward needs the sm80 one.
    exact = first_use.kernels_for(
        BwdKey(BF16, BATCH, 128, 128, CAUSAL, 0, False, False, False, deterministic=True), "sm_90a"
    )
    assert [c.algorithm.pipeline for c in exact][1] == "sm80_cpasync_mma"
    # Its elementwise bias is one value a key: key padding runs on it, a bias with a row per
    # query needs the sm80 main stage.
    padding = first_use.kernels_for(
        BwdKey(BF16, BATCH, 128, 128, CAUSAL, ELEMENTWISE, False, False, False), "sm_90a"
    )
    assert [c.algorithm.pipeline for c in padding][1] == "sm90_tma_wgmma"
    full = first_use.kernels_for(
        BwdKey(BF16, BATCH, 128, 128, CAUSAL, ELEMENTWISE, False, False, False,
               bias_per_query=True), "sm_90a"
    )  # fmt: skip
    assert [c.algorithm.pipeline for c in full][1] == "sm80_cpasync_mma"


def test_the_preferred_template_is_built() -> None:
    hopper = first_use.kernels_for(_fwd(mask=CAUSAL), "sm_90a")
    assert [c.algorithm.pipeline for c in hopper] == ["sm90_tma_wgmma"]
    # Soft-cap runs on the Hopper template; column-major V has no Hopper kernel, so the sm80
    # template serves it on the H100.
    capped = first_use.kernels_for(_fwd(softcap=True), "sm_90a")
    assert [c.algorithm.pipeline for c in capped] == ["sm90_tma_wgmma"]
    transposed = first_use.kernels_for(_fwd(v_col_major=True), "sm_90a")
    assert [c.algorithm.pipeline for c in transposed] == ["sm80_cpasync_mma"]
    assert [c.algorithm.pipeline for c in first_use.kernels_for(_fwd(dtype=FP32), "sm_80")] == [
        "simt_fma"
    ]
    # A head dim no template has: nothing to build, the dispatcher's error stands.
    assert first_use.kernels_for(_fwd(hdim_q=80, hdim_v=80), "sm_90a") == []


# ---- building or explaining ----


class _FakeRegistry:
    def __init__(self, names: list[str]) -> None:
        self._names = names

    def names(self) -> list[str]:
        return self._names


@pytest.fixture
def fresh_first_use(monkeypatch: pytest.MonkeyPatch):
    state = first_use._FirstUse()
    monkeypatch.setattr(first_use, "_FIRST_USE", state)
    monkeypatch.setattr(first_use, "_SERVED_RAW", set())
    configs = first_use.kernels_for(_fwd(softcap=True), "sm_90a")
    monkeypatch.setattr(first_use, "kernels_for", lambda key, arch=None: configs)
    monkeypatch.setattr(first_use, "current_arch", lambda: 90)
    monkeypatch.setattr(jit, "arch_spec_name", lambda arch, specs: "sm_90a")
    monkeypatch.setattr("ckfmha._registry.Registry", lambda: _FakeRegistry([]))
    return state, [c.name for c in configs]


def _raw(key: FwdKey) -> tuple[str, tuple[object, ...]]:
    return ("fwd", tuple(getattr(key, f) for f in key.__dataclass_fields__))


def test_missing_kernels_are_built_once_per_key(fresh_first_use, monkeypatch) -> None:
    state, names = fresh_first_use
    calls = []
    monkeypatch.setattr(jit, "build", lambda names, progress: calls.append((names, progress)))
    monkeypatch.delenv("CKFMHA_JIT", raising=False)
    raw = _raw(_fwd(softcap=True))
    first_use.ensure(raw)
    first_use.ensure(raw)
    assert calls == [(names, "line")]
    assert (90, raw) in first_use._SERVED_RAW and not state.missing


def test_each_arch_builds_its_own_kernels(fresh_first_use, monkeypatch) -> None:
    # Calls follow their arrays' device: a key served on an sm_90 GPU still needs sm_80
    # kernels when the next call runs on an sm_80 GPU of the same process.
    asked, built = [], []
    monkeypatch.setattr(first_use, "kernels_for", lambda key, arch=None: asked.append(arch) or [])
    monkeypatch.setattr(jit, "build", lambda names, progress: built.append(names))
    raw = _raw(_fwd(softcap=True))
    for arch in (90, 80, 90, 80):
        monkeypatch.setattr(first_use, "current_arch", lambda arch=arch: arch)
        first_use.ensure(raw)
    assert asked == [90, 80]
    assert {(90, raw), (80, raw)} <= first_use._SERVED_RAW


def test_concurrent_callers_build_once(fresh_first_use, monkeypatch) -> None:
    calls = []

    def slow_build(names: list[str], progress: str) -> None:
        calls.append(names)
        time.sleep(0.2)

    monkeypatch.setattr(jit, "build", slow_build)
    raw = _raw(_fwd(softcap=True))
    threads = [threading.Thread(target=first_use.ensure, args=(raw,)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1


def test_jit_off_names_the_kernels_and_the_command(fresh_first_use, monkeypatch) -> None:
    _, names = fresh_first_use
    monkeypatch.setenv("CKFMHA_JIT", "0")
    monkeypatch.setattr(jit, "build", lambda *a, **k: pytest.fail("CKFMHA_JIT=0 compiled"))
    raw = _raw(_fwd(softcap=True))
    first_use.ensure(raw)
    error = first_use.explain(raw, UnsupportedError("no compiled forward kernel fits.", 2))
    message = str(error)
    assert isinstance(error, UnsupportedError) and error.status == 2
    assert message.startswith("no compiled forward kernel fits.")
    assert "CKFMHA_JIT=0" in message and names[0] in message
    assert f"python -m ckfmha build --arch sm_90a --kernels {names[0]}" in message


def test_a_missing_toolchain_is_named(fresh_first_use, monkeypatch) -> None:
    def no_nvcc(*args: object, **kwargs: object) -> None:
        raise jit.ToolchainError("nvcc not found: set CKFMHA_NVCC or CUDA_HOME")

    monkeypatch.delenv("CKFMHA_JIT", raising=False)
    monkeypatch.setattr(jit, "build", no_nvcc)
    raw = _raw(_fwd(softcap=True))
    first_use.ensure(raw)  # no error yet: another kernel may serve the call
    message = str(first_use.explain(raw, UnsupportedError("none fits.", 2)))
    assert "compiling on first use needs nvcc not found" in message


def test_keys_of_served_problems_pass_unchanged_errors(fresh_first_use, monkeypatch) -> None:
    _state, _ = fresh_first_use
    monkeypatch.setattr("ckfmha._registry.Registry", lambda: _FakeRegistry(_names_all()))
    raw = _raw(_fwd(softcap=True))
    first_use.ensure(raw)
    original = UnsupportedError("strides", 2)
    assert first_use.explain(raw, original) is original


def _names_all() -> list[str]:
    return [c.name for c in first_use.kernels_for(_fwd(softcap=True), "sm_90a")]


def test_no_device_leaves_the_error_to_the_launch(monkeypatch) -> None:
    monkeypatch.setattr(first_use, "_FIRST_USE", first_use._FirstUse())
    monkeypatch.setattr(first_use, "_SERVED_RAW", set())
    if ckfmha.device_count() > 0:
        pytest.skip("a GPU is visible")
    raw = _raw(_fwd())
    first_use.ensure(raw)  # no NoDeviceError here: fwd's own checks come first
    assert not first_use._SERVED_RAW


# ---- the cache key ----


def test_cache_key_covers_the_kernel_headers(tmp_path: Path) -> None:
    headers = tmp_path / "include"
    kernel = headers / "ckfmha" / "kernel"
    kernel.mkdir(parents=True)
    (kernel / "mask.cuh").write_text("// v1\n")
    cutlass = tmp_path / "cutlass_include"
    (cutlass / "cutlass").mkdir(parents=True)
    (cutlass / "cutlass" / "version.h").write_text("#define CUTLASS_MAJOR 4\n")
    before = _cache.headers_digest(headers, cutlass)
    (kernel / "mask.cuh").write_text("// v2\n")
    _cache.headers_digest.cache_clear()
    assert _cache.headers_digest(headers, cutlass) != before
    (cutlass / "cutlass" / "version.h").write_text("#define CUTLASS_MAJOR 5\n")
    _cache.headers_digest.cache_clear()
    changed = _cache.headers_digest(headers, cutlass)
    (kernel / "mask.cuh").write_text("// v1\n")
    _cache.headers_digest.cache_clear()
    assert len({before, changed, _cache.headers_digest(headers, cutlass)}) == 3


def test_published_unit_entries_share_one_module(tmp_path: Path) -> None:
    built = tmp_path / "module.so"
    built.write_bytes(b"module")
    entries = [tmp_path / "cache" / "sm_80" / f"k{i}-0123.so" for i in range(3)]
    _cache.publish_all(built, entries)
    assert all(e.read_bytes() == b"module" for e in entries)
    assert len({e.stat().st_ino for e in entries}) == 1
    assert not built.exists()


# ---- two processes, one build (real nvcc, no GPU) ----

_BUILD_SCRIPT = """
import sys
from ckfmha import jit
real = jit._compile
def counted(*args, **kwargs):
    print("COMPILED", flush=True)
    return real(*args, **kwargs)
jit._compile = counted
print(jit.build([sys.argv[1]], cache_dir=sys.argv[2], progress="line", max_workers=1))
"""


@pytest.mark.slow
def test_two_processes_compile_a_missing_kernel_once(tmp_path: Path) -> None:
    skip_without_jit_toolchain()
    # An append kernel outside the core set: a small template, so it compiles in seconds.
    name = first_use.kernels_for(AppendKvKey(BF16, 96, 96, 1, True), "sm_80")[0].name
    assert name not in ckfmha.Registry()
    assert jit.resolve([name])[0].name == name
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", _BUILD_SCRIPT, name, str(tmp_path)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        for _ in range(2)
    ]
    outputs = [run.communicate(timeout=600) for run in runs]
    assert all(run.returncode == 0 for run in runs), outputs
    assert sum(out.count("COMPILED") for out, _ in outputs) == 1
    assert all(name in out for out, _ in outputs)
    # The compiling process's one progress line names the kernel and the seconds it took.
    assert any(f"ckfmha: compiling {name} for sm_80 on first use" in err for _, err in outputs)
    assert [p.name.startswith(name) for p in jit.cached_modules(tmp_path)] == [True]
