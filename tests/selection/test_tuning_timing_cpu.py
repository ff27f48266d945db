"""ckfmha.tuning.timing without a GPU: which result is the fastest and which the dispatcher's
own, and the arguments time_candidates refuses before it touches a device."""

from __future__ import annotations

import pytest

from ckfmha.tuning import Candidate, CandidateTime, Choice, ProblemTiming, time_candidates

ONE_STAGE = Candidate("fwd_one")
SPLIT_4, SPLIT_8 = Candidate("fwd_splitkv_a", 4), Candidate("fwd_splitkv_a", 8)


def _timing(choice: Choice, *results: CandidateTime) -> ProblemTiming:
    return ProblemTiming(results, choice)


def test_fastest_skips_failed_candidates() -> None:
    timing = _timing(Choice("fwd_one", 0), CandidateTime(ONE_STAGE, 0.9, 3),
                     CandidateTime(SPLIT_4, None, 0, "out of device memory"),
                     CandidateTime(SPLIT_8, 0.4, 3))  # fmt: skip
    assert timing.fastest() == CandidateTime(SPLIT_8, 0.4, 3)
    assert timing.chosen() == CandidateTime(ONE_STAGE, 0.9, 3)
    failed = _timing(Choice("fwd_one", 0), CandidateTime(ONE_STAGE, None, 0, "refused"))
    assert failed.fastest() is None


def test_the_choice_matches_kernel_and_split_count() -> None:
    results = (CandidateTime(SPLIT_4, 0.5, 3), CandidateTime(SPLIT_8, 0.6, 1))
    assert _timing(Choice("fwd_splitkv_a", 8), *results).chosen() == results[1]
    # A split count the candidates do not hold has no result.
    assert _timing(Choice("fwd_splitkv_a", 24), *results).chosen() is None


@pytest.mark.parametrize(
    ("kind", "settings", "message"),
    [
        ("decode", {}, r"kind 'decode': one of fwd, bwd"),
        ("fwd", {"repeats": 0}, r"repeats 0"),
        ("bwd", {"iters": 0}, r"iters 0"),
        ("fwd", {"warmup": -1}, r"warmup -1"),
    ],
)
def test_bad_arguments_fail_before_any_device_call(kind: str, settings: dict,
                                                   message: str) -> None:  # fmt: skip
    with pytest.raises(ValueError, match=message):
        time_candidates(kind, {"batch": 1, "nhead_q": 8, "seqlen_q": 64, "hdim": 64}, **settings)
