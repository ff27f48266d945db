"""Command line: ``python -m ckfmha {list,explain,run,build,doctor,tune}``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from ckfmha import jit
from ckfmha._registry import Dispatcher, Registry
from ckfmha.errors import CkfmhaError, NoDeviceError
from ckfmha.problem import FwdProblem
from ckfmha.tuning.command import add_tune_arguments, tune_command


def _add_problem_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, required=required, help="query heads")
    parser.add_argument("--kv-heads", type=int, default=None, help="key/value heads (GQA)")
    parser.add_argument("--seqlen", type=int, required=required, help="query length")
    parser.add_argument("--seqlen-k", type=int, default=None, help="key length (default: seqlen)")
    parser.add_argument("--hdim", type=int, required=required)
    parser.add_argument("--hdim-v", type=int, default=None)
    parser.add_argument("--dtype", choices=("fp16", "bf16", "fp32"), default="bf16")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument(
        "--causal-alignment", choices=("top_left", "bottom_right"), default="top_left"
    )
    parser.add_argument(
        "--window",
        type=int,
        nargs=2,
        metavar=("LEFT", "RIGHT"),
        default=None,
        help="sliding window: keys i-LEFT .. i+RIGHT (-1 unbounded; --causal-alignment applies)",
    )
    parser.add_argument(
        "--softcap", type=float, default=0.0, help="cap logits at softcap*tanh(x/softcap)"
    )
    parser.add_argument("--alibi", action="store_true", help="ALiBi bias with per-head slopes")
    parser.add_argument("--sink", action="store_true", help="per-head attention-sink logits")
    parser.add_argument(
        "--dropout", type=float, default=0.0, metavar="P", help="dropout probability in [0, 1)"
    )
    parser.add_argument("--lse", action="store_true", help="also store the log-sum-exp")
    parser.add_argument("--layout", choices=("bhsd", "bshd"), default="bhsd")


def problem_from_args(args: argparse.Namespace) -> FwdProblem:
    return FwdProblem(
        batch=args.batch,
        nhead_q=args.heads,
        nhead_k=args.kv_heads,
        seqlen_q=args.seqlen,
        seqlen_k=args.seqlen_k,
        hdim=args.hdim,
        hdim_v=args.hdim_v,
        dtype=args.dtype,
        causal=args.causal,
        causal_alignment=args.causal_alignment,
        lse=args.lse,
        layout=args.layout,
        window=None if args.window is None else (args.window[0], args.window[1]),
        softcap=args.softcap,
        bias="alibi" if args.alibi else "none",
        sink=args.sink,
        dropout_p=args.dropout,
        kv_dtype=getattr(args, "kv_dtype", None),
        q_dtype=getattr(args, "q_dtype", None),
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ckfmha", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    listing = commands.add_parser("list", help="registered kernels")
    listing.add_argument("--json", action="store_true", help="full records as JSON")

    explain = commands.add_parser("explain", help="which kernel a problem gets, and why")
    _add_problem_arguments(explain)
    explain.add_argument("--arch", default=None, help="e.g. sm_90a or 80 (default: this GPU)")
    explain.add_argument(
        "--kv-dtype",
        choices=("fp8_e4m3",),
        default=None,
        help="K/V stored as fp8 (e4m3) caches, read with scales (default: K/V in --dtype)",
    )
    explain.add_argument(
        "--q-dtype",
        choices=("fp8_e4m3",),
        default=None,
        help="fp8 (e4m3) queries, with --kv-dtype fp8_e4m3; --dtype is then the output's",
    )

    run = commands.add_parser("run", help="time (and check) one problem on this GPU")
    _add_problem_arguments(run)
    run.add_argument("--iters", type=int, default=20)
    run.add_argument("--warmup", type=int, default=3)
    run.add_argument("--kernel", default=None, help="force a registered kernel")
    run.add_argument("--validate", action="store_true", help="compare with float64 reference")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--backend", choices=("auto", "torch", "cupy", "numpy"), default="auto")

    build = commands.add_parser("build", help="compile kernels into the cache ahead of use")
    build.add_argument(
        "--kernels", default="default",
        help="a kernel set (core, ci, default, full) or comma-separated kernel names",
    )  # fmt: skip
    build.add_argument(
        "--arch", default=None, help="targets of a kernel set, e.g. sm_90a or sm_80,sm_90a "
        "(default: this GPU's)",
    )  # fmt: skip
    build.add_argument("-j", "--jobs", type=int, default=None, help="parallel nvcc processes")
    build.add_argument("--cache-dir", default=None, help="default: $CKFMHA_CACHE_DIR")

    doctor = commands.add_parser(
        "doctor", help="toolchain, GPUs, kernels and cache; with a problem, what it would compile"
    )
    _add_problem_arguments(doctor, required=False)
    doctor.add_argument("--arch", default=None, help="e.g. sm_90a (default: this GPU's)")

    tune = commands.add_parser(
        "tune", help="time every plan of your problems on this GPU; the dispatcher then "
        "prefers the fastest (selection mode 'tuned')",
    )  # fmt: skip
    add_tune_arguments(tune)
    return parser


def _list(args: argparse.Namespace) -> int:
    registry = Registry()
    if args.json:
        print(json.dumps(registry.kernels(), indent=2))
    else:
        print("\n".join(registry.names()))
    return 0


def _explain(args: argparse.Namespace) -> int:
    problem = problem_from_args(args)
    dispatcher = Dispatcher()
    try:
        print(f"selected: {dispatcher.select(problem, arch=args.arch)}")
    except NoDeviceError:
        raise
    except CkfmhaError as error:
        print(f"selected: none ({error})")
    print(dispatcher.explain(problem, arch=args.arch), end="")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "list":
            return _list(args)
        if args.command == "explain":
            return _explain(args)
        if args.command == "build":
            from ckfmha._commands import build_command

            return build_command(args)
        if args.command == "doctor":
            from ckfmha._commands import doctor_command

            given = args.heads is not None and args.seqlen is not None and args.hdim is not None
            return doctor_command(args, problem_from_args(args) if given else None)
        if args.command == "tune":
            return tune_command(args)
        from ckfmha._bench import run_command

        return run_command(args, problem_from_args(args))
    except NoDeviceError as error:
        hint = " (pass --arch to explain for another GPU)" if args.command == "explain" else ""
        print(f"error: no CUDA device: {error}{hint}", file=sys.stderr)
        return 2
    except CkfmhaError as error:
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    except (ValueError, jit.ToolchainError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
