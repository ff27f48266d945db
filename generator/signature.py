"""Kernel keys: what a kernel computes (signature) and how (algorithm)."""

from __future__ import annotations

import re
from dataclasses import dataclass

# The name becomes part of a C symbol (ckfmha_kernel_<name>) and a file name.
_IDENTIFIER_TAIL = re.compile(r"^[A-Za-z0-9_]+$")


def _checked(name: str) -> str:
    if not _IDENTIFIER_TAIL.match(name):
        raise ValueError(f"kernel name {name!r} must contain only [A-Za-z0-9_]")
    return name


@dataclass(frozen=True, order=True)
class FwdSignature:
    """What a forward kernel computes; the runtime matches problems against these fields."""

    dtype: str
    mode: str  # "batch" | "group" (varlen with cu_seqlens)
    hdim_q: int
    hdim_v: int
    mask: str  # "none" | "causal" | "window"
    lse: bool
    family: str = "fwd"
    bias: str = "none"  # "none" | "elementwise" | "alibi"
    dropout: bool = False
    softcap: bool = False
    sink: bool = False
    v_col_major: bool = False  # V stored [.., hdim_v, seqlen_k]

    @property
    def name(self) -> str:
        # Feature tokens appear only when on, so feature-free names stay short and stable.
        bias = {"none": "", "elementwise": "_bias", "alibi": "_alibi"}.get(self.bias, self.bias)
        lse = "lse" if self.lse else "nolse"
        extras = "".join(
            token
            for token, on in (
                ("_drop", self.dropout),
                ("_softcap", self.softcap),
                ("_sink", self.sink),
                ("_vcol", self.v_col_major),
            )
            if on
        )
        return _checked(
            f"{self.family}_{self.dtype}_{self.mode}_d{self.hdim_q}x{self.hdim_v}_{self.mask}"
            f"{bias}_{lse}{extras}"
        )


@dataclass(frozen=True, order=True)
class Algorithm:
    """How a kernel computes: target arch, pipeline and tiling."""

    arch: str  # e.g. "sm_90a"
    pipeline: str  # e.g. "sm80_cpasync_mma"
    tile_m: int
    tile_n: int
    tile_k: int
    warps: int
    stages: int
    # CTAs per SM the kernel's register budget must allow (__launch_bounds__'s
    # second argument): ptxas caps registers per thread at 64K / (threads * this).
    ctas_per_sm: int = 1

    @property
    def name(self) -> str:
        # The occupancy token appears only when set, so existing names stay stable.
        occupancy = f"c{self.ctas_per_sm}" if self.ctas_per_sm != 1 else ""
        return _checked(
            f"{self.arch}_{self.pipeline}_m{self.tile_m}n{self.tile_n}k{self.tile_k}"
            f"_w{self.warps}s{self.stages}{occupancy}"
        )


@dataclass(frozen=True, order=True)
class KernelConfig:
    signature: FwdSignature
    algorithm: Algorithm

    @property
    def name(self) -> str:
        """Stable and readable; `ckfmha_kernel_` + name is the instance's C symbol."""
        return f"{self.signature.name}__{self.algorithm.name}"

    @property
    def symbol(self) -> str:
        return f"ckfmha_kernel_{self.name}"
