"""The broad suite's plot: ckfmha's speed-up over cuDNN against the shape of each case.

One panel per kind (fwd, bwd, decode). x is the key length (log scale), y the ratio to cuDNN
measured in the same run. Colour is the head dim, the marker the GQA group (query heads per
K/V head), and a filled marker a causal case. Cases cuDNN gave no rate for are left out.
bench_broad.py draws it after a run; this script redraws it from saved runs:

    python benchmarks/broad_plot.py benchmarks/results/broad/*.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

KINDS = ("fwd", "bwd", "decode")
GROUP_MARKERS = {1: "o", 2: "v", 3: "<", 4: "^", 5: ">", 6: "p", 8: "s", 16: "D"}
HDIM_COLOURS = {"d64": "tab:blue", "d96": "tab:orange", "d128": "tab:green",
                "d192x128": "tab:red", "d256": "tab:purple"}  # fmt: skip


def hdim_label(record: dict[str, Any]) -> str:
    hq, hv = record["hdim"], record["hdim_v"]
    return f"d{hq}" if hq == hv else f"d{hq}x{hv}"


def plot_ratio_records(records: list[dict[str, Any]], path: Path, title: str = "") -> bool:
    """Draws the records (bench_broad.row_record dicts) to `path`; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
    except ImportError:
        return False
    kinds = [kind for kind in KINDS if any(r["kind"] == kind for r in records)]
    fig, axes = plt.subplots(1, len(kinds), figsize=(6 * len(kinds), 4.8), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        rated = [r for r in records if r["kind"] == kind and r.get("ratio_vs_torch_cudnn")]
        for r in rated:
            colour = HDIM_COLOURS.get(hdim_label(r), "black")
            ax.scatter(r["seqlen_k"], r["ratio_vs_torch_cudnn"],
                       marker=GROUP_MARKERS.get(r["group"], "x"), s=36, edgecolors=colour,
                       facecolors=colour if r["causal"] else "none", linewidths=1.2)  # fmt: skip
        ax.set_xscale("log")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(0.95, color="red", linewidth=0.8, linestyle="--")
        ax.set_title(f"{kind}: ckfmha / cuDNN ({len(rated)} cases)")
        ax.set_xlabel("keys per sequence (seqlen_k)")
        ax.set_ylabel("speed-up over cuDNN")
        hdims = dict.fromkeys(hdim_label(r) for r in rated)
        groups = sorted({r["group"] for r in rated})
        handles = [Line2D([], [], color=HDIM_COLOURS.get(h, "black"), marker="o",
                          linestyle="", label=h) for h in hdims]  # fmt: skip
        handles += [Line2D([], [], color="gray", marker=GROUP_MARKERS.get(g, "x"),
                           fillstyle="none", linestyle="", label=f"group {g}")
                    for g in groups]  # fmt: skip
        handles.append(Line2D([], [], color="gray", marker="o", linestyle="", label="causal"))
        ax.legend(handles=handles, fontsize=7, ncol=2)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="bench_broad.py JSON results")
    args = parser.parse_args()
    for run in args.runs:
        record = json.loads(run.read_text())
        title = f"{record['device']}, {record['dtype']}, commit {record['commit']}"
        if not plot_ratio_records(record["rows"], run.with_suffix(".png"), title):
            parser.error("matplotlib is needed to draw the plot")
        print(f"wrote {run.with_suffix('.png')}")


if __name__ == "__main__":
    main()
