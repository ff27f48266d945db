"""Pieces the kernel tests share: configs with a few fields changed, their rule reasons, and
the mask options each test case runs with."""

from __future__ import annotations

from typing import Any

from generator.rules import check
from generator.signature import Algorithm, KernelConfig
from generator.specs import load_specs

# (left, right) sliding windows the GPU tests cycle through; -1 is unbounded.
WINDOWS = [(16, 0), (-1, 40), (100, 3), (0, 0)]


def make_config(signature_type: type, sig_fields: dict[str, object],
                alg_fields: dict[str, object], changes: dict[str, object]) -> KernelConfig:
    """A KernelConfig from defaults, each change going to the Algorithm when it names one of
    its fields and to the signature otherwise."""
    sig_fields, alg_fields = dict(sig_fields), dict(alg_fields)
    for key, value in changes.items():
        (alg_fields if key in Algorithm.__dataclass_fields__ else sig_fields)[key] = value
    return KernelConfig(signature_type(**sig_fields), Algorithm(**alg_fields))  # type: ignore[arg-type]


def rule_reasons(config: KernelConfig, arch: str = "sm_80") -> str:
    """Every reason the generator's rules give against ``config`` on ``arch``, joined."""
    return " | ".join(check(config, load_specs()[arch]))


def problem_fields(kernel: dict[str, Any]) -> dict[str, Any]:
    """FwdProblem fields a registered kernel fits: its dtype, mode and head dim, LSE, and its
    mask (a (256, 0) window for window kernels)."""
    return {
        "hdim": kernel["hdim_q"], "dtype": kernel["dtype"], "mode": kernel["mode"], "lse": True,
        "window": (256, 0) if kernel["mask"] == "window" else None,
        "causal": kernel["mask"] == "causal",
    }  # fmt: skip


def mask_options(kernel: dict[str, Any], index: int,
                 alignments: tuple[str, str] = ("top_left", "bottom_right")) -> dict[str, Any]:
    """ckfmha.fwd/bwd mask arguments for case ``index`` of a kernel built for kernel["mask"]:
    causal or a window from WINDOWS, the alignment alternating between cases."""
    alignment = alignments[index % 2]
    if kernel["mask"] == "causal":
        return {"causal": True, "causal_alignment": alignment}
    if kernel["mask"] == "window":
        return {"window": WINDOWS[index % len(WINDOWS)], "causal_alignment": alignment}
    return {}
