"""Grouped convolution, each pass beside cuDNN: ckfmha.conv_fwd / conv_bwd_data /
conv_bwd_weight against torch's conv2d/conv3d and its convolution_backward (``--direction``).

The layers come from real models: ResNeXt-50 32x4d's grouped 3x3 convolutions (each stage, the
stride-2 ones too), ConvNeXt-T's depthwise 7x7, MobileNetV2's depthwise 3x3, a grouped and a
dense 3x3x3 of a video network, ResNet-50's pointwise 1x1 and ResNet-18/34's dense 3x3; each at
a training batch (32; 8 for video) and an inference batch (1). cuDNN runs through torch on
channels_last tensors of the same dtype with ``torch.backends.cudnn.benchmark = True``, so it
picks its fastest algorithm per layer; ckfmha reads the same memory viewed as [N, *spatial, G,
C] (no copy) and a [G, K, *filter, C] copy of the weight made once, outside the timing. The
backward passes take a random dy of the output's shape, channels_last likewise; cuDNN computes
the one gradient asked for (convolution_backward's output mask).

Every ckfmha result is checked once against torch's computation of the same pass on the same
inputs in fp32 (no TF32) before anything is timed; a layer whose result is off is reported and not timed. The two
implementations take turns: each round times ``--iters`` calls of one then of the other with
CUDA events (the order alternating between rounds), and the median round counts. With
``--graph`` each round replays a CUDA graph of the calls instead, which leaves out the host's
time per call (small layers take microseconds). TFLOP/s = 2 * N * output positions * G * K * C
* filter taps / time, for every pass.

    python benchmarks/bench_conv.py --commit $(git rev-parse --short HEAD) \
        --direction bwd_weight --out benchmarks/results/conv
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from bench_fwd import (
    add_run_arguments,
    fmt,
    geomean,
    ratio,
    results_stem,
    run_record,
    warm_up_device,
)

import ckfmha
from ckfmha.conv_problem import ConvProblem

# Error bound of the check against the fp32 reference, per element: the output's rounding
# (unit roundoff u of the dtype) of the value, plus the two fp32 sums' error, both within
# 2^-12 of the sum of |x| * |w| over the element's reduction (cuDNN may sum in a Winograd or
# FFT basis, whose fp32 error is larger than a plain sum's).
UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8}
ACCUMULATION = 2.0**-12


@dataclass(frozen=True)
class Layer:
    model: str
    name: str
    input: tuple[int, ...]  # spatial sizes
    groups: int
    c: int  # input channels per group
    k: int  # output channels per group
    filter: tuple[int, ...]
    stride: int = 1
    padding: int = 0

    def problem(self, batch: int, dtype: str) -> ConvProblem:
        return ConvProblem(batch, self.input, self.groups, self.c, self.k, self.filter,
                           self.stride, self.padding, 1, dtype)  # fmt: skip


def _resnext() -> list[Layer]:
    # ResNeXt-50 32x4d: bottleneck widths 128, 256, 512, 1024 in 32 groups; the first block of
    # stages 2-4 has the stride-2 3x3.
    layers = [Layer("resnext50_32x4d", "s1 3x3", (56, 56), 32, 4, 4, (3, 3), 1, 1)]
    for stage, (size, width) in enumerate(((28, 8), (14, 16), (7, 32)), start=2):
        layers.append(Layer("resnext50_32x4d", f"s{stage} 3x3 stride 2", (2 * size, 2 * size),
                            32, width, width, (3, 3), 2, 1))  # fmt: skip
        layers.append(Layer("resnext50_32x4d", f"s{stage} 3x3", (size, size), 32, width, width,
                            (3, 3), 1, 1))  # fmt: skip
    return layers


def _convnext() -> list[Layer]:
    return [Layer("convnext_t", f"dw 7x7 {dim}", (size, size), dim, 1, 1, (7, 7), 1, 3)
            for size, dim in ((56, 96), (28, 192), (14, 384), (7, 768))]  # fmt: skip


def _mobilenet() -> list[Layer]:
    shapes = ((112, 32, 1), (112, 96, 2), (56, 144, 1), (28, 192, 1), (14, 576, 1), (7, 960, 1))
    return [Layer("mobilenet_v2", f"dw 3x3 {dim}{' stride 2' if s == 2 else ''}", (size, size),
                  dim, 1, 1, (3, 3), s, 1) for size, dim, s in shapes]  # fmt: skip


def _video() -> list[Layer]:
    return [
        Layer("video_3d", "grouped 3x3x3", (16, 56, 56), 32, 4, 4, (3, 3, 3), 1, 1),
        Layer("video_3d", "grouped 3x3x3", (8, 28, 28), 32, 8, 8, (3, 3, 3), 1, 1),
        Layer("video_3d", "dense 3x3x3", (8, 28, 28), 1, 64, 64, (3, 3, 3), 1, 1),
    ]


def _dense() -> list[Layer]:
    layers = [Layer("resnet50", "pointwise 1x1 256", (56, 56), 1, 256, 256, (1, 1))]
    layers += [Layer("resnet18", f"3x3 {width}", (size, size), 1, width, width, (3, 3), 1, 1)
               for size, width in ((56, 64), (28, 128), (14, 256), (7, 512))]  # fmt: skip
    return layers


SUITES: dict[str, Callable[[], list[Layer]]] = {
    "resnext": _resnext, "convnext": _convnext, "mobilenet": _mobilenet, "video": _video,
    "dense": _dense,
}  # fmt: skip
TRAIN_BATCH = {2: 32, 3: 8}
# The results' suite name per pass (the forward's kept its name).
SUITE_NAMES = {"fwd": "conv", "bwd_data": "conv_bwd_data", "bwd_weight": "conv_bwd_weight"}
INFERENCE_BATCH = 1


@dataclass
class Row:
    model: str
    layer: str
    batch: int
    shape: str
    flops: float
    kernel: str = ""
    ms: dict[str, float | None] = field(default_factory=dict)
    tflops: dict[str, float | None] = field(default_factory=dict)
    ckfmha_over_cudnn: float | None = None
    # --learned: the plan of the learned selection, beside the hand rules' ("ckfmha").
    kernel_learned: str = ""
    learned_over_cudnn: float | None = None
    learned_over_rules: float | None = None
    # max over elements of |ckfmha - fp32 reference| / bound (<= 1 passes).
    error_over_bound: float | None = None
    note: str = ""


def _label(layer: Layer, batch: int) -> str:
    dims = "x".join(map(str, layer.input))
    taps = "x".join(map(str, layer.filter))
    return (f"n{batch} {dims} g{layer.groups} c{layer.c} k{layer.k} f{taps} s{layer.stride} "
            f"p{layer.padding}")  # fmt: skip


def alternating_ms(fns: dict[str, Callable[[], Any]], warmup: int, iters: int, repeats: int,
                   graph: bool) -> dict[str, float]:  # fmt: skip
    """Median ms per call of each implementation; every round times ``iters`` calls of each, in
    turns whose order alternates between rounds. ``graph``: each round replays a CUDA graph of
    ``iters`` calls (captured once after the warm-up)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    runs: dict[str, Callable[[], Any]] = {}
    for name, fn in fns.items():
        if graph:
            captured = torch.cuda.CUDAGraph()
            with torch.cuda.graph(captured):
                for _ in range(iters):
                    fn()
            runs[name] = captured.replay
        else:
            runs[name] = lambda fn=fn: [fn() for _ in range(iters)]
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    for round_index in range(repeats):
        for name in order if round_index % 2 == 0 else reversed(order):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            runs[name]()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / iters)
    return {name: statistics.median(values) for name, values in times.items()}


def _torch_conv(dims: int) -> Callable[..., Any]:
    return F.conv2d if dims == 2 else F.conv3d


@dataclass
class Operands:
    """One layer's tensors in torch's layouts (channels_last) and as ckfmha views of them."""

    x_ncx: Any  # [N, G*C, *input]
    weight: Any  # [G*K, C, *filter]
    dy_ncx: Any  # [N, G*K, *output]
    x: Any  # [N, *input, G, C], a view of x_ncx
    w: Any  # [G, K, *filter, C], a copy
    dy: Any  # [N, *output, G, K], a view of dy_ncx


def _positions(t: Any, groups: int) -> Any:
    """torch's [N, G*C, *spatial] as ckfmha's [N, *spatial, G, C] (a view for channels_last)."""
    return t.permute(0, *range(2, t.dim()), 1).unflatten(-1, (groups, -1))


def _filters(t: Any, groups: int) -> Any:
    """torch's [G*K, C, *filter] weight as ckfmha's [G, K, *filter, C]."""
    return t.unflatten(0, (groups, -1)).permute(0, 1, *range(3, t.dim() + 1), 2)


def _torch_pass(direction: str, o: Operands, layer: Layer) -> Any:
    """cuDNN's result of one pass, in torch's layout."""
    dims = len(layer.input)
    args = {"stride": layer.stride, "padding": layer.padding, "groups": layer.groups}
    if direction == "fwd":
        return _torch_conv(dims)(o.x_ncx, o.weight, None, **args)
    mask = [direction == "bwd_data", direction == "bwd_weight", False]
    grads = torch.ops.aten.convolution_backward(
        o.dy_ncx, o.x_ncx, o.weight, None, [layer.stride] * dims, [layer.padding] * dims,
        [1] * dims, False, [0] * dims, layer.groups, mask)  # fmt: skip
    return grads[0] if direction == "bwd_data" else grads[1]


def _ckfmha_pass(direction: str, o: Operands, layer: Layer) -> Any:
    geometry = {"stride": layer.stride, "padding": layer.padding}
    if direction == "fwd":
        return ckfmha.conv_fwd(o.x, o.w, **geometry)
    if direction == "bwd_data":
        return ckfmha.conv_bwd_data(o.dy, o.w, input_size=layer.input, **geometry)
    return ckfmha.conv_bwd_weight(o.x, o.dy, filter_size=layer.filter, **geometry)


def _learned(fn: Callable[[], Any]) -> Callable[[], Any]:
    """fn planned by the learned selection (a graph captures the plan it made then)."""

    def call() -> Any:
        with ckfmha.selection("learned"):
            return fn()

    return call


def _in_ckfmha_layout(direction: str, t: Any, groups: int) -> Any:
    return _filters(t, groups) if direction == "bwd_weight" else _positions(t, groups)


def error_over_bound(got: Any, direction: str, o: Operands, layer: Layer, dtype: str) -> float:
    """max |got - ref| / (u |ref| + 2^-12 S) over the result, ref and S by torch in fp32 (S:
    the pass over the operands' absolute values)."""
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        exact = Operands(o.x_ncx.float(), o.weight.float(), o.dy_ncx.float(), None, None, None)
        absolute = Operands(exact.x_ncx.abs(), exact.weight.abs(), exact.dy_ncx.abs(), None,
                            None, None)  # fmt: skip
        ref = _torch_pass(direction, exact, layer)
        magnitude = _torch_pass(direction, absolute, layer)
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    ref = _in_ckfmha_layout(direction, ref, layer.groups)
    magnitude = _in_ckfmha_layout(direction, magnitude, layer.groups)
    y = got
    if torch.isnan(y).any():
        return math.inf
    bound = UNIT_ROUNDOFF[dtype] * ref.abs() + ACCUMULATION * magnitude
    # Where every tap reads padding the bound is 0, and so must the error be.
    excess = (y.float() - ref).abs() / bound.clamp_min(1e-30)
    return float(excess.max())


def make_operands(layer: Layer, batch: int, dtype: str) -> Operands:
    """Random operands of one layer (seeded): x, the weight and dy in torch's channels_last
    layouts, and ckfmha's views of them."""
    dims = len(layer.input)
    problem = layer.problem(batch, dtype)
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    fmt_ = torch.channels_last if dims == 2 else torch.channels_last_3d
    g, c, k = layer.groups, layer.c, layer.k
    generator = torch.Generator(device="cuda").manual_seed(0)
    x_ncx = torch.randn(batch, g * c, *layer.input, device="cuda", dtype=torch_dtype,
                        generator=generator).contiguous(memory_format=fmt_)  # fmt: skip
    weight = (torch.randn(g * k, c, *layer.filter, device="cuda", generator=generator)
              * (c * math.prod(layer.filter)) ** -0.5).to(torch_dtype)  # fmt: skip
    weight = weight.contiguous(memory_format=fmt_)
    dy_ncx = torch.randn(batch, g * k, *problem.output, device="cuda", dtype=torch_dtype,
                         generator=generator).contiguous(memory_format=fmt_)  # fmt: skip
    # The same memory as [N, *spatial, G, C]; the weight [G*K, C, *f] as [G, K, *f, C].
    return Operands(x_ncx, weight, dy_ncx, _positions(x_ncx, g),
                    _filters(weight, g).contiguous(), _positions(dy_ncx, g))  # fmt: skip


def passes(direction: str, o: Operands, layer: Layer) -> dict[str, Callable[[], Any]]:
    """ckfmha's and cuDNN's call of one pass over the same operands."""
    return {
        "ckfmha": lambda: _ckfmha_pass(direction, o, layer),
        "cudnn": lambda: _torch_pass(direction, o, layer),
    }


def find_layer(text: str) -> Layer:
    """A suite layer by "model/name", e.g. "resnet18/3x3 128"."""
    model, _, name = text.partition("/")
    layers = [layer for make in SUITES.values() for layer in make()]
    for layer in layers:
        if (layer.model, layer.name) == (model, name):
            return layer
    known = ", ".join(f"{layer.model}/{layer.name}" for layer in layers)
    raise ValueError(f"no layer {text!r} in the conv suite; the layers are: {known}")


def run_layer(layer: Layer, batch: int, dtype: str, args: argparse.Namespace) -> Row:
    direction = args.direction
    problem = layer.problem(batch, dtype)
    row = Row(layer.model, layer.name, batch, _label(layer, batch), problem.flops())
    o = make_operands(layer, batch, dtype)
    impls = passes(direction, o, layer)
    if args.learned:
        impls["ckfmha_learned"] = _learned(impls["ckfmha"])
    select = lambda: ckfmha.conv_select(o.x, o.w, stride=layer.stride,
                                        padding=layer.padding, direction=direction)  # fmt: skip
    try:
        results = {name: impls[name]() for name in impls if name != "cudnn"}
        row.kernel = select()
        if args.learned:
            row.kernel_learned = _learned(select)()
    except ckfmha.CkfmhaError as exc:
        row.note = f"ckfmha: {str(exc).splitlines()[0]}"
        return row
    row.error_over_bound = max(error_over_bound(y, direction, o, layer, dtype)
                               for y in results.values())  # fmt: skip
    if not row.error_over_bound <= 1.0:
        row.note = f"wrong result: error {row.error_over_bound:.3g} x the bound; not timed"
        return row
    del results
    row.ms = dict(alternating_ms(impls, args.warmup, args.iters, args.repeats, args.graph))
    row.tflops = {name: problem.flops() / ms / 1e9 for name, ms in row.ms.items() if ms}
    row.ckfmha_over_cudnn = ratio(row.tflops.get("ckfmha"), row.tflops.get("cudnn"))
    if args.learned:
        row.learned_over_cudnn = ratio(row.tflops.get("ckfmha_learned"), row.tflops.get("cudnn"))
        row.learned_over_rules = ratio(row.tflops.get("ckfmha_learned"), row.tflops.get("ckfmha"))
    return row


def print_table(rows: list[Row]) -> None:
    print(f"{'model':16s} {'layer':22s} {'shape':44s} {'ckfmha':>7s} {'cudnn':>7s} "
          f"{'/cudnn':>7s} {'err/bd':>7s}")  # fmt: skip
    for r in rows:
        print(f"{r.model:16s} {r.layer:22s} {r.shape:44s} {fmt(r.tflops.get('ckfmha'), '7.1f')} "
              f"{fmt(r.tflops.get('cudnn'), '7.1f')} {fmt(r.ckfmha_over_cudnn, '7.2f')} "
              f"{fmt(r.error_over_bound, '7.3f')}"
              + (f" learned {fmt(r.learned_over_rules, '5.2f')}x" if r.learned_over_rules else "")
              + (f"  {r.note}" if r.note else ""))


def summary(rows: list[Row]) -> dict[str, float | None]:
    measured = [r.ckfmha_over_cudnn for r in rows if r.ckfmha_over_cudnn]
    result: dict[str, float | None] = {"geomean_ckfmha_over_cudnn": geomean(measured)}
    for key in sorted({(r.model, r.batch) for r in rows}):
        ratios = [r.ckfmha_over_cudnn for r in rows
                  if (r.model, r.batch) == key and r.ckfmha_over_cudnn]  # fmt: skip
        result[f"geomean_{key[0]}_n{key[1]}"] = geomean(ratios)
    for key in ("learned_over_cudnn", "learned_over_rules"):
        values = [getattr(r, key) for r in rows if getattr(r, key)]
        if values:
            result[f"geomean_{key}"] = geomean(values)
    result["wrong_results"] = float(sum(1 for r in rows if r.note.startswith("wrong")))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", nargs="+", choices=list(SUITES), default=list(SUITES))
    parser.add_argument("--batches", choices=["train", "inference", "both"], default="both")
    parser.add_argument("--direction", choices=["fwd", "bwd_data", "bwd_weight"],
                        default="fwd", help="the pass timed")  # fmt: skip
    parser.add_argument("--graph", action="store_true",
                        help="time CUDA graph replays (no host time per call)")
    parser.add_argument("--learned", action="store_true",
                        help="also time ckfmha's plan under the learned selection")
    add_run_arguments(parser, warmup=5, iters=20, repeats=7, out_help="directory for the JSON")
    args = parser.parse_args()

    torch.backends.cudnn.benchmark = True
    device = torch.cuda.get_device_name()
    warm_up_device()
    rows = []
    for suite in args.suites:
        for layer in SUITES[suite]():
            batches = []
            if args.batches in ("train", "both"):
                batches.append(TRAIN_BATCH[len(layer.input)])
            if args.batches in ("inference", "both"):
                batches.append(INFERENCE_BATCH)
            for batch in batches:
                rows.append(run_layer(layer, batch, args.dtype, args))
                torch.cuda.empty_cache()
    print(f"device: {device}  dtype: {args.dtype}  cudnn: {torch.backends.cudnn.version()}  "
          f"commit: {args.commit}  pass: {args.direction}  "
          f"timing: {'CUDA graphs' if args.graph else 'calls'}")
    print_table(rows)
    result_summary = summary(rows)
    print({name: fmt(value, ".3f") for name, value in result_summary.items()})
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        record = {
            **run_record(SUITE_NAMES[args.direction], device, args.commit, args.dtype),
            "direction": args.direction,
            "flops_convention": "2*N*output positions*G*K*C*filter taps",
            "timing": ("median of rounds, implementations alternating; "
                       + ("CUDA graph replays" if args.graph else "calls issued from Python")),
            "peer": ("torch conv2d/conv3d and aten.convolution_backward (cuDNN, channels_last, "
                     "cudnn.benchmark=True)"),
            "selection": "hand rules" + (" and learned" if args.learned else ""),
            "summary": result_summary,
            "rows": [asdict(r) for r in rows],
        }  # fmt: skip
        (args.out / f"{results_stem(record)}.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
