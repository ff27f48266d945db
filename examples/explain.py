"""Kernel selection without a GPU: which kernel a problem gets, and why others do not fit.

python examples/explain.py
"""

from __future__ import annotations

import ckfmha


def main() -> None:
    dispatcher = ckfmha.Dispatcher()
    problem = ckfmha.FwdProblem(
        batch=4, nhead_q=32, nhead_k=8, seqlen_q=4096, hdim=128, dtype="bf16", causal=True, lse=True
    )
    print(dispatcher.explain(problem, arch="sm_90a"))
    try:
        dispatcher.select(
            ckfmha.FwdProblem(batch=1, nhead_q=8, seqlen_q=128, hdim=72), arch="sm_90a"
        )
    except ckfmha.UnsupportedError as error:
        print("hdim 72:", error)


if __name__ == "__main__":
    main()
