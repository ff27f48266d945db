"""Every conv forward kernel of one template forced by name on each layer of bench_conv.py's
suite, beside the hand rules' plan and cuDNN, timed in the same rounds (CUDA graphs): the data
behind a template's tile set and the rules' tile model.

    python benchmarks/sweep_conv_tiles.py [--template sm90_tma_wgmma] [--dtype bf16]

Prints, per layer the rules run on the template, each kernel's speed as a multiple of cuDNN's
(higher is faster). Layers whose plan is on another template are skipped; kernels that cannot
run a layer (channels, shared memory) are left out of its row.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial
from typing import Any

from bench_conv import (
    INFERENCE_BATCH,
    SUITES,
    TRAIN_BATCH,
    _torch_pass,
    alternating_ms,
    make_operands,
)

import ckfmha


def _template_kernels(template: str, dtype: str) -> list[str]:
    return sorted(k["name"] for k in ckfmha.Registry().kernels()
                  if k["family"] == "conv_fwd" and f"_{template}_" in k["name"]
                  and k["name"].startswith(f"conv_fwd_{dtype}_"))  # fmt: skip


def _calls(layer: Any, o: Any, kernels: list[str], template: str) -> dict[str, Callable[[], Any]]:
    """The rules' plan, cuDNN and every kernel of `kernels` that runs the layer."""
    geometry = {"stride": layer.stride, "padding": layer.padding}
    fns: dict[str, Callable[[], Any]] = {
        "rules": partial(ckfmha.conv_fwd, o.x, o.w, **geometry),
        "cudnn": partial(_torch_pass, "fwd", o, layer),
    }
    for name in kernels:
        if f"_{len(layer.input)}d_" not in name:
            continue
        try:
            ckfmha.conv_fwd(o.x, o.w, kernel=name, **geometry)
        except ckfmha.CkfmhaError:
            continue
        fns[name.split(f"_{template}_")[1]] = partial(ckfmha.conv_fwd, o.x, o.w, kernel=name,
                                                      **geometry)  # fmt: skip
    return fns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--template", default="sm90_tma_wgmma")
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    kernels = _template_kernels(args.template, args.dtype)
    for suite in SUITES.values():
        for layer in suite():
            for batch in (TRAIN_BATCH[len(layer.input)], INFERENCE_BATCH):
                o = make_operands(layer, batch, args.dtype)
                chosen = ckfmha.conv_select(o.x, o.w, stride=layer.stride, padding=layer.padding)
                if f"_{args.template}_" not in chosen:
                    continue
                ms = alternating_ms(_calls(layer, o, kernels, args.template), 3, 10,
                                    args.rounds, True)  # fmt: skip
                speed = " ".join(f"{k}={ms['cudnn'] / v:.2f}" for k, v in ms.items()
                                 if k != "cudnn")  # fmt: skip
                rules = chosen.split(f"_{args.template}_")[1]
                print(f"{layer.model:16s} {layer.name:22s} n{batch:<3d} rules={rules:18s} "
                      f"{speed}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
