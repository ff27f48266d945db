"""``python -m ckfmha tune --problems FILE``: times every candidate plan of each problem on this
GPU and writes a tuning table of the fastest, which the dispatcher then prefers (selection
mode "tuned", ``ckfmha.set_selection("tuned")`` or CKFMHA_SELECTION=tuned)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import ckfmha
from ckfmha.errors import CkfmhaError, NoDeviceError
from ckfmha.tuning.candidates import Candidate
from ckfmha.tuning.inputs import explain_fields
from ckfmha.tuning.problems import TuningProblem, read_problems
from ckfmha.tuning.timing import CandidateTime, ProblemTiming, time_candidates

NO_DEVICE_STATUS = 4  # CKFMHA_ERROR_NO_DEVICE


def add_tune_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--problems", type=Path, required=True, metavar="FILE",
                        help='a JSON list of problems, or JSON Lines, such as {"kind": "fwd", '
                             '"batch": 2, "nhead_q": 32, "nhead_k": 8, "seqlen_q": 4096, '
                             '"hdim": 128, "causal": true} (ckfmha.tuning.problems lists the '
                             'fields and their defaults)')  # fmt: skip
    parser.add_argument("--output", type=Path, default=None, metavar="PATH",
                        help="tuning table to write (default: ckfmha.default_tuning_path(), "
                             "this device's table in the cache directory)")  # fmt: skip
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds (default: 2)")
    parser.add_argument("--iters", type=int, default=5,
                        help="graph replays per timing (default: 5)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed rounds of the candidates near the fastest, whose median "
                             "counts (default: 3)")  # fmt: skip
    parser.add_argument("--merge", action="store_true",
                        help="keep the entries of the table already at the output path")


def _require_device() -> None:
    """Raises NoDeviceError unless both ckfmha and torch (which makes the inputs and the CUDA
    graphs) see a CUDA device."""
    if ckfmha.device_count() == 0:
        raise NoDeviceError("ckfmha sees none, and tune times kernels on this machine's GPU",
                            NO_DEVICE_STATUS)  # fmt: skip
    try:
        import torch
    except ImportError:
        raise ValueError("tune needs torch (it makes the inputs and the CUDA graphs)") from None
    if not torch.cuda.is_available():
        raise NoDeviceError("torch sees no CUDA device (a CPU-only torch build?)",
                            NO_DEVICE_STATUS)  # fmt: skip


def _start_table(path: Path, merge: bool) -> None:
    """Empties the process's tuning table, then with `merge` loads the one at `path`: the table
    saved at the end holds this run's entries and, with `merge`, the file's."""
    ckfmha.clear_tuning()
    if not (merge and path.exists()):
        return
    try:
        loaded = ckfmha.load_tuning(str(path))
    except NoDeviceError:
        raise
    except CkfmhaError as exc:  # e.g. written for another library build, driver or device
        raise ValueError(f"--merge: cannot load {path}: {exc} (tune without --merge to "
                         "replace it)") from None  # fmt: skip
    print(f"merging {loaded} entries of {path}")


def _plan(candidate: Candidate) -> str:
    splits = f" ({candidate.num_splits} splits)" if candidate.num_splits else ""
    return f"{candidate.kernel}{splits}"


def _timed(result: CandidateTime | None) -> str:
    return "not timed" if result is None or result.ms is None else f"{result.ms:.4f} ms"


def progress_line(index: int, total: int, problem: TuningProblem, timing: ProblemTiming) -> str:
    """Problem i/N, the fastest plan and its time, and the hand rules' plan and its time."""
    fastest, chosen = timing.fastest(), timing.chosen()
    hand = _plan(Candidate(timing.choice.kernel, timing.choice.num_splits))
    head = f"[{index}/{total}] {problem.label}:"
    if fastest is None:
        return f"{head} no candidate ran; hand rules {hand}"
    return (f"{head} fastest {_plan(fastest.candidate)} {_timed(fastest)}; "
            f"hand rules {hand} {_timed(chosen)}")  # fmt: skip


def _tune_one(problem: TuningProblem, args: argparse.Namespace) -> ProblemTiming | str:
    """The problem's timing, or why it has none: no kernel runs it, the library refuses it, or
    its inputs do not fit in device memory."""
    import torch

    try:
        return time_candidates(problem.kind, problem.fields(), warmup=args.warmup,
                               iters=args.iters, repeats=args.repeats)  # fmt: skip
    except NoDeviceError:
        raise
    except (ValueError, CkfmhaError) as exc:
        return str(exc).splitlines()[0]
    except torch.OutOfMemoryError:
        return "out of device memory"
    finally:
        torch.cuda.empty_cache()  # the next problem's inputs and graphs start from free memory


def tune_command(args: argparse.Namespace) -> int:
    """0 when every problem got an entry, 1 when some had no plan that ran (the others are
    saved); errors that stop the run (no device, a bad file) reach main() as exceptions."""
    if args.warmup < 0 or args.iters < 1 or args.repeats < 1:
        raise ValueError("--warmup must be >= 0, --iters and --repeats >= 1")
    problems = read_problems(args.problems)
    _require_device()
    output = args.output if args.output is not None else ckfmha.default_tuning_path()
    _start_table(output, args.merge)
    failed = 0
    # The hand rules' plan is the baseline each line reports: not an earlier table's choice.
    with ckfmha.selection("heuristic"):
        for i, problem in enumerate(problems, start=1):
            timing = _tune_one(problem, args)
            if isinstance(timing, str):
                print(f"[{i}/{len(problems)}] {problem.label}: skipped: {timing}",
                      file=sys.stderr, flush=True)  # fmt: skip
                failed += 1
                continue
            print(progress_line(i, len(problems), problem, timing), flush=True)
            best = timing.fastest()
            if best is None:
                failed += 1
                continue
            ckfmha.tuning_add(problem.kind, best.candidate.kernel, best.candidate.num_splits,
                              best.ms, **explain_fields(problem.fields()))  # fmt: skip
    output.parent.mkdir(parents=True, exist_ok=True)
    entries = ckfmha.save_tuning(str(output))
    print(f"wrote {entries} entries to {output}")
    if failed:
        print(f"{failed} of {len(problems)} problems have no entry (see above)", file=sys.stderr)
    return 1 if failed else 0
