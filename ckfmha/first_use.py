"""Kernels compiled on first use: what a problem needs that the registry lacks, built on the spot.

Every launch (``fwd``, ``fwd_varlen``, ``fwd_paged``, ``bwd``, ``bwd_varlen``, ``append_kv``,
the convolutions) passes a small key of the features its problem uses. The first time a key is
seen, the kernels the generator would build for it on this GPU's arch (the preferred template's
default tile; every tile of a split-KV family or a convolution, whose tile the dispatcher picks
by shape) are looked up in the registry; missing ones are compiled into the cache
(``ckfmha.jit``), loaded, and the call goes on. Later calls with the same key cost one set
lookup.

``CKFMHA_JIT=0`` turns compiling off: a call that then finds no kernel raises
``UnsupportedError`` naming the missing kernels and the command that prebuilds them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ckfmha import _dtypes, problem
from ckfmha.errors import UnsupportedError

# Values of the C enums (ckfmha.h) -> the generator's spelling, from the tables the runners use.
DTYPES = {code: _dtypes.NAMES[code] for code in (_dtypes.FP16, _dtypes.BF16, _dtypes.FP32)}
MODES = {code: name for name, code in problem.MODES.items()}
MASK_KINDS = {
    problem.MASK_NONE: "none",
    problem.MASK_CAUSAL_TOP_LEFT: "causal",
    problem.MASK_CAUSAL_BOTTOM_RIGHT: "causal",
    problem.MASK_WINDOW_TOP_LEFT: "window",
    problem.MASK_WINDOW_BOTTOM_RIGHT: "window",
}
BIASES = {code: name for name, code in problem.BIASES.items()}
PAGE_LAYOUTS = {code: name for name, code in problem.PAGE_LAYOUTS.items()}
# ckfmha_rope (the append runner's table lives in the Cython module that imports this one).
ROPES = {0: "none", 1: "interleaved", 2: "half_rotated"}
KV_QUANTS = {code: name for name, code in problem.KV_QUANTS.items()}

# Query rows per K/V head up to which the dispatcher runs a decode-shaped split-KV plan.
DECODE_PACKED_ROWS = 64

def enabled() -> bool:
    """CKFMHA_JIT=0 (or false/no/off) turns first-use compilation off."""
    return os.environ.get("CKFMHA_JIT", "1").strip().lower() not in ("0", "false", "no", "off")


@dataclass(frozen=True)
class FwdKey:
    """The features of a forward problem that decide which kernels it can run on.

    Built by the Cython runners from the C problem (``_fwd.pyx``); ints are C enum values.
    """

    dtype: int
    mode: int
    hdim_q: int
    hdim_v: int
    mask: int
    bias: int
    dropout: bool
    softcap: bool
    sink: bool
    v_col_major: bool
    kv_storage: int  # 0 contiguous, else paged
    page_layout: int
    forced_splits: bool  # num_splits > 1
    decode_shaped: bool  # packed query rows per K/V head <= DECODE_PACKED_ROWS
    kv_quant: int = 0  # ckfmha_kv_quant: 1 for fp8 (e4m3) K/V
    q_quant: int = 0  # ckfmha_kv_quant: 1 for fp8 queries (with fp8 K/V: the fp8 forward)


@dataclass(frozen=True)
class BwdKey:
    dtype: int
    mode: int
    hdim_q: int
    hdim_v: int
    mask: int
    bias: int
    dropout: bool
    softcap: bool
    dbias: bool
    deterministic: bool = False
    # An elementwise bias with a row per query (not broadcast over the query rows).
    bias_per_query: bool = False


# Main-stage templates that add dQ with atomics only: a deterministic backward needs another
# (dispatcher.cpp rejects them for deterministic problems).
FAST_MODE_ONLY_PIPELINES = ("sm90_tma_wgmma",)


@dataclass(frozen=True)
class AppendKvKey:
    dtype: int
    hdim_k: int
    hdim_v: int
    rope: int
    paged: bool
    cache_quant: int = 0  # ckfmha_kv_quant: 1 writes fp8 (e4m3) caches


@dataclass(frozen=True)
class ConvKey:
    """A grouped convolution: its pass, element type, 2D or 3D, the channel vector its tensors
    allow (``conv_vector``) and the direct kernel's channel bucket its groups fit
    (``conv_direct_bucket``, or for the weight gradient ``conv_weight_direct_bucket``; 0 for
    none), which decide the kernels it can run on. Runners that pass four fields (no bucket) get
    the implicit-GEMM kernels alone."""

    direction: int  # ckfmha_conv_direction: 0 forward, 1 backward-data, 2 backward-weight
    dtype: int
    spatial_dims: int  # 2 or 3
    vector: int  # 8, 4, 2 or 1 channels per load
    max_channels: int = 0  # 0, or the direct kernel's bucket: 1, 2, 4 or 8


Key = FwdKey | BwdKey | AppendKvKey | ConvKey

# ckfmha_conv_direction -> the generator's family. Backward-data has no family of its own: its
# plan runs forward kernels over dy, so its key is the forward key of that transformed problem
# (dy as the input: in_channels = K, the output channels per group).
CONV_DIRECTIONS = {0: "conv_fwd", 1: "conv_fwd", 2: "conv_bwd_weight"}
# The families with a direct kernel for groups of few channels.
CONV_DIRECT_FAMILIES = ("conv_fwd", "conv_bwd_weight")
# Channels a convolution kernel loads at once, widest first (generator.signature.CONV_VECTORS).
CONV_VECTORS = (8, 4, 2, 1)
# The direct kernel's channel buckets the kernel sets build, narrowest first
# (generator.receipts.DIRECT_BUCKETS): wider groups run faster on the implicit GEMM.
CONV_MAX_CHANNELS = (1, 2, 4)
# The weight gradient's (generator.receipts.BWD_WEIGHT_DIRECT_BUCKETS). Its 8-channel kernel
# runs only groups of exactly 8 input and 8 output channels (its vector path).
CONV_WEIGHT_MAX_CHANNELS = (1, 2, 4, 8)


def _narrowest_bucket(in_channels: int, out_channels: int, buckets: Sequence[int]) -> int:
    """The first of `buckets` (narrowest first) holding both counts; 0 for none or an empty
    group."""
    if min(in_channels, out_channels) < 1:
        return 0
    widest = max(in_channels, out_channels)
    return next((bucket for bucket in buckets if bucket >= widest), 0)


def conv_direct_bucket(in_channels: int, out_channels: int) -> int:
    """The direct kernel's channel bucket for groups of `in_channels` input and `out_channels`
    output channels: the smallest of 1, 2, 4 holding both, or 0 when none does (wider groups
    run on the implicit-GEMM kernels alone; empty ones are the launch's to report)."""
    return _narrowest_bucket(in_channels, out_channels, CONV_MAX_CHANNELS)


def conv_weight_direct_bucket(in_channels: int, out_channels: int) -> int:
    """The weight gradient's direct kernel's channel bucket for groups of `in_channels` input
    and `out_channels` output channels: the smallest of 1, 2, 4 holding both, 8 for groups of
    8 and 8 (the dispatcher runs no other problem on that kernel), or 0 (wider groups run on
    the implicit-GEMM kernels alone; empty ones are the launch's to report). The
    weight-gradient runner passes it as its key's ``max_channels``."""
    bucket = _narrowest_bucket(in_channels, out_channels, CONV_WEIGHT_MAX_CHANNELS)
    return bucket if bucket < 8 or in_channels == out_channels == 8 else 0


def conv_vector(
    in_channels: int,
    x_strides: Sequence[int],
    x_ptr: int,
    w_ptr: int,
    element_bytes: int = 2,
) -> int:
    """The widest channel vector a convolution's kernels may load x and w in: the largest v of
    8, 4, 2, 1 dividing the channels per group and every x stride (batch and spatial, in
    elements), with both pointers aligned to v elements. Pointers 0 stand for aligned ones.

    The C runtime's dispatcher takes the widest kernel under the same rule
    (conv_vector_allowed, cpp/src/conv_plan.cpp), so the key's kernels are the ones it picks.
    """
    for vector in CONV_VECTORS[:-1]:
        alignment = vector * element_bytes
        if (
            in_channels % vector == 0
            and all(stride % vector == 0 for stride in x_strides)
            and x_ptr % alignment == 0
            and w_ptr % alignment == 0
        ):
            return vector
    return CONV_VECTORS[-1]


def _fwd_plans(key: FwdKey, gen: Any) -> list[list[Any]]:
    """Signature lists, best plan first: the split-KV plan (split stage and combine stage) where
    the problem is paged, forced to split or decode-shaped, and the one-stage kernel. fp8 K/V
    with queries in dtype is read by the split and paged families alone, so it has the split-KV
    plan only; fp8 queries (and K/V) run on the one-stage Hopper kernel alone."""
    sig = gen.signature
    features = {
        "dtype": DTYPES[key.dtype],
        "mode": MODES[key.mode],
        "hdim_q": key.hdim_q,
        "hdim_v": key.hdim_v,
        "mask": MASK_KINDS[key.mask],
        "lse": True,
        "bias": BIASES[key.bias],
        "dropout": key.dropout,
        "softcap": key.softcap,
        "sink": key.sink,
        "v_col_major": key.v_col_major,
    }
    combine = sig.FwdSignature(
        dtype=features["dtype"], mode=features["mode"], hdim_q=key.hdim_v, hdim_v=key.hdim_v,
        mask="none", lse=True, family="fwd_splitkv_combine",
    )  # fmt: skip
    # The combine stage reads the splits' fp32 partial results, never K/V: it has no kv_quant.
    kv = {"kv_quant": KV_QUANTS[key.kv_quant]} if key.kv_quant else {}
    if key.q_quant:
        return [[sig.FwdSignature(**features, **kv, q_quant=KV_QUANTS[key.q_quant])]]
    if key.kv_storage != 0:
        family = sig.BATCH_PREFILL if key.mode == 1 else sig.FWD_PAGEDKV
        paged = sig.FwdSignature(
            **features, **kv, family=family, page_layout=PAGE_LAYOUTS[key.page_layout]
        )
        return [[paged, combine]]
    split = [sig.FwdSignature(**features, **kv, family="fwd_splitkv"), combine]
    if key.forced_splits or key.kv_quant:
        return [split]
    # Kernel sets build forward kernels with LSE, and an LSE kernel serves a problem that asks
    # for none: wanting the no-LSE twin would compile a kernel the library already covers.
    one_stage = [sig.FwdSignature(**features)]
    return [split, one_stage] if key.decode_shaped else [one_stage]


def _bwd_plans(key: BwdKey, gen: Any) -> list[list[Any]]:
    sig = gen.signature
    dtype, mode = DTYPES[key.dtype], MODES[key.mode]
    return [
        [
            sig.BwdSignature(sig.BWD_DOT_DO_O, dtype, mode, key.hdim_v, key.hdim_v),
            sig.BwdSignature(
                sig.BWD_DQ_DK_DV, dtype, mode, key.hdim_q, key.hdim_v, MASK_KINDS[key.mask],
                BIASES[key.bias], key.dropout, key.softcap, key.dbias,
            ),
            sig.BwdSignature(sig.BWD_CONVERT_DQ, dtype, mode, key.hdim_q, key.hdim_q),
        ]
    ]


def _appendkv_plans(key: AppendKvKey, gen: Any) -> list[list[Any]]:
    # Named only when fp8, as the forward's kv_quant: a plain append's signature is unchanged.
    quant = {"kv_quant": KV_QUANTS[key.cache_quant]} if key.cache_quant else {}
    signature = gen.signature.AppendKvSignature(
        dtype=DTYPES[key.dtype], hdim_q=key.hdim_k, hdim_v=key.hdim_v, rope=ROPES[key.rope],
        paged=key.paged, **quant,
    )  # fmt: skip
    return [[signature]]


def _conv_plans(key: ConvKey, gen: Any) -> list[list[Any]]:
    """The implicit-GEMM signature of the key's vector, with every tile of the default set (the
    generator's conv tiles), since the dispatcher picks the tile by the problem's shape; where
    the groups fit a channel bucket, also the direct kernel of that bucket (one channel a load),
    which the dispatcher weighs against them. A plan without the direct kernel follows, for a
    bucket the generator cannot build. The forward (and so the data gradient) and the weight
    gradient each have direct kernels of their own buckets. A pass or element type without
    kernels has no plan: the launch says why."""
    family = CONV_DIRECTIONS.get(key.direction)
    dtype = DTYPES.get(key.dtype)
    if family is None or dtype is None:
        return []
    sig = gen.signature
    implicit_gemm = sig.ConvSignature(
        dtype=dtype, spatial_dims=key.spatial_dims, vector=key.vector, family=family
    )
    if not key.max_channels or family not in CONV_DIRECT_FAMILIES:
        return [[implicit_gemm]]
    direct = sig.ConvSignature(
        dtype=dtype, spatial_dims=key.spatial_dims, vector=1, max_channels=key.max_channels,
        family=family,
    )  # fmt: skip
    return [[implicit_gemm, direct], [implicit_gemm]]


def plans_for(key: Key, gen: Any) -> list[list[Any]]:
    """The signatures each plan that can serve ``key`` needs, best plan first."""
    if isinstance(key, FwdKey):
        return _fwd_plans(key, gen)
    if isinstance(key, BwdKey):
        return _bwd_plans(key, gen)
    if isinstance(key, ConvKey):
        return _conv_plans(key, gen)
    return _appendkv_plans(key, gen)


def kernels_for(key: Key, arch: int | str | None = None) -> list[Any]:
    """KernelConfigs of the best plan the generator can build for ``key`` on ``arch`` (default:
    this GPU's), every stage on its preferred template; [] if no plan can be built."""
    from ckfmha import jit

    gen = jit.generator_modules()
    specs = gen.specs.load_specs()
    spec = specs[jit.arch_spec_name(arch, specs)]
    excluded = FAST_MODE_ONLY_PIPELINES if getattr(key, "deterministic", False) else ()
    # A bias with a row per query cannot run on kernels that take only row-broadcast biases.
    per_query = getattr(key, "bias_per_query", False)
    for plan in plans_for(key, gen):
        stages = [jit.preferred_configs(signature, spec, excluded, per_query) for signature in plan]
        if all(stages):
            return [config for stage in stages for config in stage]
    return []


# A key served on one arch says nothing of another: a process that runs on GPUs of two archs
# (calls follow their arrays' device) builds each arch's kernels on its first call there.
ArchKey = tuple[int | None, Key]


class _FirstUse:
    """Which (arch, key) pairs were already served; builds one at a time (concurrent callers
    that need the same kernels wait for the first, then find them registered)."""

    def __init__(self) -> None:
        self.served: set[ArchKey] = set()
        # Kernels a served pair lacks, and why they were not built.
        self.missing: dict[ArchKey, tuple[list[str], str]] = {}
        self.lock = threading.Lock()

    def ensure(self, key: Key, arch: int | None) -> None:
        if (arch, key) in self.served:
            return
        from ckfmha._registry import Registry
        from ckfmha.errors import NoDeviceError

        with self.lock:
            if (arch, key) in self.served:
                return
            try:
                names = [config.name for config in kernels_for(key, arch)]
            except NoDeviceError:
                return  # the launch reports it, after its own argument checks
            registered = set(Registry().names())
            absent = [name for name in names if name not in registered]
            why = "CKFMHA_JIT=0 turns compiling on first use off"
            if absent and enabled():
                from ckfmha import jit

                try:
                    jit.build(absent, progress="line")
                    absent = []
                except jit.ToolchainError as error:
                    # Another registered kernel may still serve the call; if none does, the
                    # launch's error says what is missing (explain_failure).
                    why = f"compiling on first use needs {error}"
            if absent:
                self.missing[(arch, key)] = (absent, why)
            self.served.add((arch, key))

    def explain_failure(
        self, key: Key, arch: int | None, error: UnsupportedError
    ) -> UnsupportedError:
        """The run found no kernel: say what first use would build, and how to build it."""
        if (arch, key) not in self.missing:
            return error
        absent, why = self.missing[(arch, key)]
        from ckfmha import jit

        target = jit.arch_spec_name(arch, jit.generator_modules().specs.load_specs())
        command = f"python -m ckfmha build --arch {target} --kernels {','.join(absent)}"
        return UnsupportedError(
            f"{error} The kernels this problem needs are not built ({why}): "
            f"{', '.join(absent)}. Prebuild them with: {command}",
            error.status,
        )


_FIRST_USE = _FirstUse()
_KEY_TYPES = {"fwd": FwdKey, "bwd": BwdKey, "appendkv": AppendKvKey, "conv": ConvKey}
# (arch, raw key) pairs already served, read without the lock: a call whose kernels are there
# costs a current-device query and one set lookup.
_SERVED_RAW: set[tuple[int | None, tuple[str, tuple[Any, ...]]]] = set()
# Each device index's arch, asked once.
_ARCH_OF_DEVICE: dict[int, int] = {}


def current_arch() -> int | None:
    """The current device's arch (10 * major + minor), or None without a usable device (the
    launch then reports it, after its own argument checks)."""
    from ckfmha._device import current_device, device_arch
    from ckfmha.errors import CudaError, NoDeviceError

    try:
        index = current_device()
        arch = _ARCH_OF_DEVICE.get(index)
        if arch is None:
            arch = _ARCH_OF_DEVICE[index] = device_arch(index)
    except (NoDeviceError, CudaError):
        return None
    return arch


def key_of(raw: tuple[str, tuple[Any, ...]]) -> Key:
    operation, fields = raw
    return _KEY_TYPES[operation](*fields)


def ensure(raw: tuple[str, tuple[Any, ...]]) -> None:
    """Makes the kernels for a runner's raw key (operation, the key's fields in order)
    available, compiling them on first use; called before the plan is made."""
    arch = current_arch()
    if (arch, raw) in _SERVED_RAW:
        return
    key = key_of(raw)
    _FIRST_USE.ensure(key, arch)
    if (arch, key) in _FIRST_USE.served:
        _SERVED_RAW.add((arch, raw))


def ensure_named(name: str) -> None:
    """A kernel forced by name that is not registered is compiled (or loaded from the cache)."""
    from ckfmha._registry import Registry

    if name in Registry() or not enabled():
        return
    from ckfmha import jit

    try:
        jit.build([name], progress="line")
    except ValueError:
        pass  # not a kernel name: the launch says the name is unknown


def explain(raw: tuple[str, tuple[Any, ...]], error: UnsupportedError) -> UnsupportedError:
    """The error to raise when a launch found no kernel: ``error``, plus the kernels first use
    did not build and the command that prebuilds them."""
    return _FIRST_USE.explain_failure(key_of(raw), current_arch(), error)


def forget() -> None:
    """Forget which keys were served (tests; after kernels were removed from the cache)."""
    with _FIRST_USE.lock:
        _FIRST_USE.served.clear()
        _FIRST_USE.missing.clear()
        _SERVED_RAW.clear()


def missing_kernels(key: Key, arch: str | None = None) -> Sequence[str]:
    """Kernels the first call of ``key`` would compile (``python -m ckfmha doctor``)."""
    from ckfmha._registry import Registry

    registered = set(Registry().names())
    return [config.name for config in kernels_for(key, arch) if config.name not in registered]
