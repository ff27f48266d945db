"""Tuning: time every candidate plan of a problem on this GPU and record the fastest.

``python -m ckfmha tune --problems FILE`` (command.py) reads the problems (problems.py), times
each candidate the dispatcher's explain text lists (candidates.py) in CUDA graphs
(timing.py, cuda_graphs.py, inputs.py) and adds the fastest to the library's tuning table
(``ckfmha.tuning_add``), which it saves for the dispatcher's "tuned" selection mode.
benchmarks/oracle.py times the same candidates to rate the hand-written rules. Nothing here
imports torch until a timing function runs.
"""

from __future__ import annotations

from ckfmha.tuning.candidates import (
    SPLIT_COUNTS,
    Candidate,
    Choice,
    bwd_candidates,
    fwd_candidates,
)
from ckfmha.tuning.problems import TuningProblem, parse_problems, read_problems
from ckfmha.tuning.timing import (
    PRUNE_RATIO,
    CandidateTime,
    ProblemTiming,
    dispatcher_candidates,
    time_calls,
    time_candidates,
    time_plans,
)

__all__ = [
    "PRUNE_RATIO",
    "SPLIT_COUNTS",
    "Candidate",
    "CandidateTime",
    "Choice",
    "ProblemTiming",
    "TuningProblem",
    "bwd_candidates",
    "dispatcher_candidates",
    "fwd_candidates",
    "parse_problems",
    "read_problems",
    "time_calls",
    "time_candidates",
    "time_plans",
]
