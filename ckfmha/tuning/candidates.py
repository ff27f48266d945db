"""The plans a problem can run, read from the dispatcher's explain text: the candidates a
tuning run (``python -m ckfmha tune``) or the selection oracle (benchmarks/oracle.py) times,
and the plan the dispatcher itself chooses."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Split counts tried for each split-KV candidate, beside the dispatcher's own.
SPLIT_COUNTS = (1, 2, 4, 8, 16, 32, 64)
_LISTED = re.compile(r"^  (selected|fits)\s+(\S+)$")
_PLAN = re.compile(r"^plan: (one-stage|split-KV), ([^\s:,]+)")
_SPLITS = re.compile(r"num_splits=(\d+)")


@dataclass(frozen=True)
class Candidate:
    """A plan forced by name: ``fwd(..., kernel=kernel, num_splits=num_splits)``, or the
    backward's main stage ``bwd(..., kernel=kernel)``."""

    kernel: str
    num_splits: int = 0  # split-KV candidates: the count forced; 0 otherwise


@dataclass(frozen=True)
class Choice:
    """What the dispatcher's plan line says it runs."""

    kernel: str
    num_splits: int


def fwd_candidates(explain: str) -> tuple[list[Candidate], Choice]:
    """The forward candidates an explain text lists (one-stage kernels once each, split-KV
    kernels at every count of SPLIT_COUNTS and the plan's own), and the plan's choice."""
    plan = next((line for line in explain.splitlines() if line.startswith("plan: ")), "")
    match = _PLAN.match(plan)
    if match is None:
        raise ValueError(f"no plan in the explain text: {plan or explain[-200:]!r}")
    splits = _SPLITS.search(plan)
    choice = Choice(match.group(2), int(splits.group(1)) if splits else 0)
    found: dict[Candidate, None] = {}
    for line in explain.splitlines():
        listed = _LISTED.match(line)
        if listed is None:
            continue
        name = listed.group(2)
        if name.startswith("fwd_splitkv_combine_"):
            continue  # a stage of split plans, not a candidate of its own
        if name.startswith("fwd_splitkv_"):
            for count in sorted({*SPLIT_COUNTS, max(choice.num_splits, 1)}):
                found[Candidate(name, count)] = None
        else:
            found[Candidate(name)] = None
    return list(found), choice


def bwd_candidates(explain: str) -> tuple[list[Candidate], Choice]:
    """The backward main stages (bwd_dq_dk_dv) an explain_bwd text lists, and the selected one."""
    found, selected = [], ""
    in_main_stage = False
    for line in explain.splitlines():
        if line.startswith("stage "):
            in_main_stage = line.startswith("stage bwd_dq_dk_dv")
            continue
        listed = _LISTED.match(line)
        if in_main_stage and listed is not None:
            found.append(Candidate(listed.group(2)))
            if listed.group(1) == "selected":
                selected = listed.group(2)
    if not selected:
        reason = next((line for line in explain.splitlines() if line.startswith("no plan")), "")
        raise ValueError(f"explain_bwd selects no main stage{': ' if reason else ''}{reason}")
    return found, Choice(selected, 0)
