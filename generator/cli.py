"""Command line: python -m generator --kernels SET --arch ARCH [...] --out DIR."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from . import emit
from .build_config import from_env, split_list
from .enumerate import Selection, select_for_arches
from .receipts import RECEIPTS, compile_filter, get_receipt
from .specs import SpecsError, get_arch, load_specs


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m generator",
        description="Enumerate, validate and emit ckfmha kernel instances.",
    )
    parser.add_argument(
        "--kernels",
        default=None,
        help=f"kernel set: {', '.join(RECEIPTS)} (default: $CKFMHA_KERNELS or 'default')",
    )
    parser.add_argument(
        "--arch",
        action="append",
        default=[],
        help="target arch, repeatable or ';'/',' separated (default: $CKFMHA_ARCHS or "
        "'sm_80;sm_90a')",
    )
    parser.add_argument(
        "--filter",
        default=None,
        help="regex searched in kernel names (default: $CKFMHA_KERNEL_FILTER, if set)",
    )
    parser.add_argument("--out", type=Path, default=None, help="directory for generated files")
    parser.add_argument("--list", action="store_true", help="print accepted kernel names")
    parser.add_argument(
        "--explain", action="store_true", help="print every rejected candidate and why"
    )
    parser.add_argument(
        "--table-symbol",
        default=emit.BUILTIN_TABLE_SYMBOL,
        help=f"kernel table function name (JIT modules use {emit.MODULE_TABLE_SYMBOL})",
    )
    parser.add_argument("--specs", type=Path, default=None, help="alternative arch_specs.json")
    return parser


def _explain(selection: Selection) -> str:
    lines = []
    for rejection in selection.rejected:
        lines.append(f"rejected {rejection.name}")
        lines.extend(f"  - {reason}" for reason in rejection.reasons)
    if not lines:
        return "no candidate was rejected\n"
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not (args.out or args.list or args.explain):
        print("error: nothing to do; give --out DIR, --list or --explain", file=sys.stderr)
        return 2
    try:
        env = from_env()
        archs = split_list(";".join(args.arch)) or env.archs
        specs = load_specs(args.specs)
        for arch in archs:
            get_arch(specs, arch)
        receipt = get_receipt(args.kernels or env.kernels)
        name_filter = compile_filter(args.filter if args.filter is not None else env.kernel_filter)
        selection = select_for_arches(receipt, archs, specs, name_filter)
        if args.out is not None:
            emitted = emit.emit(
                args.out, selection.accepted, selection.rejected, specs, args.table_symbol
            )
            print(
                f"generator: {len(emitted.instances)} kernels, {len(selection.rejected)} "
                f"rejected, {emitted.written} files updated in {args.out}",
                file=sys.stderr,
            )
    except (SpecsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.list:
        sys.stdout.write("".join(f"{c.name}\n" for c in selection.accepted))
    if args.explain:
        sys.stdout.write(_explain(selection))
    return 0
