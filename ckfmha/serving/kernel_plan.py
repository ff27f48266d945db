"""The dispatcher's decisions for a planned serving problem, made once per plan(): the kernels
(compiled on first use here, not during a capture) and the workspace."""

from __future__ import annotations

from dataclasses import dataclass

from ckfmha import first_use
from ckfmha._fwd import first_use_key
from ckfmha._registry import Dispatcher
from ckfmha.problem import FwdProblem


@dataclass(frozen=True)
class KernelPlan:
    kernel: str  # the paged split kernel ("" when no kernel runs: batch 0)
    workspace_bytes: int  # 0 for one split


def plan_kernels(problem: FwdProblem) -> KernelPlan:
    """What fwd_paged will launch for ``problem`` on the current device, its kernels made
    available first (compiling missing ones on first use)."""
    if problem.batch > 0:
        first_use.ensure(first_use_key(problem))
    dispatcher = Dispatcher()
    kernel = dispatcher.select(problem)
    workspace_bytes = dispatcher.workspace_size(problem)
    return KernelPlan(kernel, workspace_bytes)
