"""Every candidate plan of one problem timed on this GPU, and the dispatcher's own choice.

Each candidate the explain text lists is forced by name (and split count) and captured in a CUDA
graph; once all are captured, single replays of each, back to back, give a first estimate. The
ones within PRUNE_RATIO of the fastest, and the dispatcher's own plan, are then timed in rounds
that visit each in turn, so clock and temperature drift spread over all of them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckfmha.tuning.candidates import Candidate, Choice, bwd_candidates, fwd_candidates
from ckfmha.tuning.cuda_graphs import capture_graph, replay_ms
from ckfmha.tuning.inputs import explain_fields, mask_options, problem_inputs

# Decode steps are "fwd" problems with seqlen_q = 1.
KINDS = ("fwd", "bwd")
# A candidate whose single timed call takes more than this many times the fastest single call
# of its problem cannot be the fastest: it keeps that one measurement (repeats=1) and is not
# timed again, which keeps a run of a thousand problems within minutes.
PRUNE_RATIO = 1.3


@dataclass(frozen=True)
class CandidateTime:
    """One candidate's time on this GPU, or why it has none."""

    candidate: Candidate
    ms: float | None  # None: the candidate failed, `error` says why
    repeats: int  # 0 failed, 1 the first estimate only (pruned), else the rounds of its median
    error: str = ""


def _time_or_inf(result: CandidateTime) -> float:
    return math.inf if result.ms is None else result.ms


@dataclass(frozen=True)
class ProblemTiming:
    results: tuple[CandidateTime, ...]  # one per candidate, in the explain text's order
    choice: Choice  # the dispatcher's plan under the current selection mode

    def fastest(self) -> CandidateTime | None:
        """The timed candidate with the least time (None if every candidate failed)."""
        timed = [r for r in self.results if r.ms is not None]
        return min(timed, key=_time_or_inf, default=None)

    def chosen(self) -> CandidateTime | None:
        """The result of the dispatcher's own plan (None if it is not among the candidates)."""
        plan = Candidate(self.choice.kernel, self.choice.num_splits)
        return next((r for r in self.results if r.candidate == plan), None)


def _forced_call(kind: str, tensors: dict[str, Any], mask: dict[str, Any],
                 candidate: Candidate) -> Callable[[], Any]:  # fmt: skip
    import ckfmha

    t, forced = tensors, {"kernel": candidate.kernel}
    if kind == "bwd":
        return lambda: ckfmha.bwd(t["do"], t["q"], t["k"], t["v"], t["o"], t["lse"],
                                  **mask, **forced)  # fmt: skip
    if "cu_seqlens_q" in t:  # group mode
        return lambda: ckfmha.fwd_varlen(t["q"], t["k"], t["v"], t["cu_seqlens_q"],
                                         t["cu_seqlens_k"], max_seqlen_q=t["max_seqlen_q"],
                                         max_seqlen_k=t["max_seqlen_k"],
                                         num_splits=candidate.num_splits, **mask, **forced)  # fmt: skip
    return lambda: ckfmha.fwd(t["q"], t["k"], t["v"], num_splits=candidate.num_splits,
                              **mask, **forced)  # fmt: skip


Captured = tuple[dict[Candidate, Any], dict[Candidate, float], dict[Candidate, str]]
# Single replays of every captured candidate, back to back, before the rounds: the first pass
# warms, the least of the others is the candidate's first estimate. Timing each candidate right
# after its own capture left the GPU idle while the host captured (most likely at idle clocks
# when the replay came): small kernels' single replays up to 6x slow.
COARSE_PASSES = 3


def _capture_all(calls: Mapping[Candidate, Callable[[], Any]], pool: Any) -> Captured:
    """Each call's graph and its first estimate (COARSE_PASSES), or why it failed:
    (graphs, milliseconds, errors), each keyed by candidate."""
    import torch

    import ckfmha

    graphs: dict[Candidate, Any] = {}
    errors: dict[Candidate, str] = {}
    for candidate, call in calls.items():
        try:
            graphs[candidate] = capture_graph(call, pool)
        except ckfmha.CkfmhaError as exc:  # a candidate the plan refuses (e.g. a split count)
            errors[candidate] = str(exc).splitlines()[0][:200]
        except torch.OutOfMemoryError:  # e.g. a split count whose workspace does not fit
            errors[candidate] = "out of device memory"
            torch.cuda.empty_cache()
        except RuntimeError as exc:  # a call the graph could not capture
            errors[candidate] = f"graph capture: {str(exc).splitlines()[0][:180]}"
    coarse: dict[Candidate, float] = {}
    for p in range(COARSE_PASSES):
        for candidate, graph in graphs.items():
            ms = replay_ms(graph, 1)
            if p > 0:
                coarse[candidate] = min(ms, coarse.get(candidate, ms))
    return graphs, coarse, errors


def _rounds(graphs: dict[Candidate, Any], near: list[Candidate], warmup: int, iters: int,
            repeats: int) -> dict[Candidate, list[float]]:  # fmt: skip
    """`repeats` timed rounds after `warmup` untimed ones; each round starts one candidate
    later than the last, so no candidate always runs first."""
    rounds: dict[Candidate, list[float]] = {c: [] for c in near}
    for r in range(warmup + repeats) if near else ():
        for c in near[r % len(near):] + near[: r % len(near)]:
            ms = replay_ms(graphs[c], iters)
            if r >= warmup:
                rounds[c].append(ms)
    return rounds


def _check_settings(kind: str, warmup: int, iters: int, repeats: int) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: one of {', '.join(KINDS)}")
    if warmup < 0 or iters < 1 or repeats < 1:
        raise ValueError(f"warmup {warmup}, iters {iters}, repeats {repeats}: "
                         "warmup >= 0 and iters, repeats >= 1")  # fmt: skip


def time_plans(kind: str, fields: Mapping[str, Any], candidates: Sequence[Candidate], *,
               warmup: int = 2, iters: int = 5, repeats: int = 3, prune: float = PRUNE_RATIO,
               keep: Sequence[Candidate] = ()) -> tuple[CandidateTime, ...]:  # fmt: skip
    """Times `candidates` (plans forced by name) of the problem `fields` of `kind` on the
    current device, one result per candidate in their order: the median of `repeats` rounds of
    `iters` graph replays for those within `prune` times the fastest first estimate (and for
    those in `keep`, whatever their estimate), that estimate for the rest."""
    _check_settings(kind, warmup, iters, repeats)
    tensors, mask = problem_inputs(kind, fields), mask_options(fields)
    calls = {c: _forced_call(kind, tensors, mask, c) for c in candidates}
    return time_calls(calls, warmup=warmup, iters=iters, repeats=repeats, prune=prune,
                      keep=keep)


def time_calls(calls: Mapping[Candidate, Callable[[], Any]], *, warmup: int = 2, iters: int = 5,
               repeats: int = 3, prune: float = PRUNE_RATIO,
               keep: Sequence[Candidate] = ()) -> tuple[CandidateTime, ...]:  # fmt: skip
    """Times each call (one launch of a candidate plan on inputs it owns) as time_plans does,
    one result per call in their order. Any pass whose plans run on a stream torch can capture
    (attention, convolution) times its candidates here."""
    import torch

    candidates = list(calls)
    pool = torch.cuda.graph_pool_handle()
    graphs, coarse, errors = _capture_all(calls, pool)
    fastest = min(coarse.values(), default=0.0)
    near = [c for c in calls if c in coarse and (coarse[c] <= prune * fastest or c in keep)]
    rounds = _rounds(graphs, near, warmup, iters, repeats)
    del graphs, pool
    results = []
    for candidate in candidates:
        if candidate in rounds:
            results.append(CandidateTime(candidate, statistics.median(rounds[candidate]),
                                         repeats))  # fmt: skip
        elif candidate in coarse:
            results.append(CandidateTime(candidate, coarse[candidate], 1))
        else:
            results.append(CandidateTime(candidate, None, 0, errors.get(candidate, "")))
    return tuple(results)


def time_candidates(kind: str, fields: Mapping[str, Any], *, warmup: int = 2, iters: int = 5,
                    repeats: int = 3) -> ProblemTiming:  # fmt: skip
    """Times every candidate of the problem `fields` (Dispatcher.explain's keywords) of `kind`
    ("fwd" or "bwd") on the current device (time_plans), beside the dispatcher's choice under
    the current selection mode. Raises ValueError when no kernel can run the problem."""
    _check_settings(kind, warmup, iters, repeats)
    candidates, choice = dispatcher_candidates(kind, fields)
    # The dispatcher's plan is the baseline every report compares with: always timed in rounds.
    results = time_plans(kind, fields, candidates, warmup=warmup, iters=iters, repeats=repeats,
                         keep=[Candidate(choice.kernel, choice.num_splits)])  # fmt: skip
    return ProblemTiming(results, choice)


def dispatcher_candidates(kind: str,
                          fields: Mapping[str, Any]) -> tuple[list[Candidate], Choice]:  # fmt: skip
    """Every candidate the dispatcher's explain text lists for the problem, and its plan under
    the current selection mode (as fwd_candidates / bwd_candidates give them)."""
    import ckfmha

    dispatcher, arch, problem = ckfmha.Dispatcher(), ckfmha.device_arch(), explain_fields(fields)
    if kind == "bwd":
        candidates, choice = bwd_candidates(dispatcher.explain_bwd(**problem, arch=arch))
    else:
        candidates, choice = fwd_candidates(dispatcher.explain(**problem, arch=arch))
    return candidates, choice
