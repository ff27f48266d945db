"""The learned conv selection's candidates and features, as the dispatcher computes them
(cpp/src/conv_selection.cpp): the selection oracle times these candidates
(benchmarks/conv_oracle.py), training reads these features (benchmarks/train_conv_selection.py)
and the tests compare both with the dispatcher's.

A problem is a mapping with spatial_dims, batch, groups, in_channels, out_channels (per group)
and input, filter, stride, dilation, output: tuples, or strings of sizes joined by "x" (the
oracle CSV's). A kernel is a registry record (``ckfmha.Registry().kernels()``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

DIRECTIONS = ("fwd", "bwd_data", "bwd_weight")
FAMILY = {"fwd": "conv_fwd", "bwd_data": "conv_fwd", "bwd_weight": "conv_bwd_weight"}
# Backward-weight's implicit-GEMM candidates split the reduction 1, 2, 4, .. 128 ways (a split
# of at least two k-tiles); its direct kernels run this many CTAs per SM on each block of
# groups (the hand rules run 4).
SPLIT_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128)
DIRECT_CTAS_PER_SM = (1, 2, 4, 8, 16)
DIRECT_GROUPS = 32  # groups a direct kernel's CTA computes
WEIGHT_PACK_CHANNELS = 64  # channels of packed groups backward-weight multiplies as one
WEIGHT_PACK_MIN_POSITIONS = 4096  # positions from which it packs
# The conv kernels fed by the copy engine (forward and backward-weight carry this pipeline).
TMA_PIPELINE = "sm90_tma_wgmma"
FEATURES = ("spatial_dims", "log_batch", "log_groups", "log_in_channels", "log_out_channels",
            "taps", "max_stride", "max_dilation", "phases", "log_gemm_m", "log_gemm_n",
            "log_gemm_k", "log_flop", "wgmma", "direct", "tile_m", "tile_n", "tile_k", "warps",
            "stages", "splits", "log_ctas", "waves", "fill", "log_k_steps")  # fmt: skip


def problem_record(problem: Any) -> dict[str, Any]:
    """The mapping these functions read, from a ``ckfmha.ConvProblem``."""
    return {"spatial_dims": problem.spatial_dims, "batch": problem.batch,
            "groups": problem.groups, "in_channels": problem.in_channels,
            "out_channels": problem.out_channels, "input": tuple(problem.input),
            "filter": tuple(problem.filter), "stride": problem.strides,
            "dilation": problem.dilations, "output": problem.output}  # fmt: skip


def _sizes(value: Any) -> tuple[int, ...]:
    if isinstance(value, str):
        return tuple(int(v) for v in value.split("x"))
    return tuple(int(v) for v in value)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _vector(*values: int) -> int:
    """The widest of 8, 4, 2 channels dividing every value (dense, aligned tensors), else 1."""
    return next((v for v in (8, 4, 2) if all(x % v == 0 for x in values)), 1)


def _channel_vector(problem: Mapping[str, Any], direction: str) -> int:
    c, k = int(problem["in_channels"]), int(problem["out_channels"])
    if direction == "fwd":
        return _vector(c)
    return _vector(k) if direction == "bwd_data" else _vector(math.gcd(c, k))


def _runs_on(kernel: Mapping[str, Any], arch: int) -> bool:
    """sm_90a kernels run on sm_90 only; the others on their arch and later ones."""
    return kernel["arch"] == arch if kernel["arch"] == 90 else kernel["arch"] <= arch


def direct_items(problem: Mapping[str, Any], kernel: Mapping[str, Any]) -> int:
    """Output tiles (rows of `warps` lines of `tile_m` positions) over the batch: the items a
    direct weight-gradient kernel's CTAs take in turn."""
    out = _sizes(problem["output"])
    depth = out[0] if len(out) == 3 else 1
    return max(1, _ceil_div(out[-2], int(kernel["warps"])) * _ceil_div(out[-1], int(kernel["tile_m"]))
               * depth * int(problem["batch"]))  # fmt: skip


def split_choices(problem: Mapping[str, Any], kernel: Mapping[str, Any],
                  num_sms: int) -> list[int]:  # fmt: skip
    """Backward-weight: the split counts (implicit GEMM) or CTAs per block of groups (direct)
    the selection weighs for `kernel`, without repeats."""
    if int(kernel["conv_max_channels"]):
        blocks = _ceil_div(int(problem["groups"]), DIRECT_GROUPS)
        items = direct_items(problem, kernel)
        counts = (min(max(_ceil_div(m * num_sms, blocks), 1), items) for m in DIRECT_CTAS_PER_SM)
    else:
        rows = int(problem["batch"]) * math.prod(_sizes(problem["output"]))
        k_tiles = max(1, _ceil_div(rows, int(kernel["tile_k"])))
        counts = (s for s in SPLIT_COUNTS if s == 1 or 2 * s <= k_tiles)
    return sorted(set(counts))


def conv_candidate_plans(problem: Mapping[str, Any], direction: str,
                         registry: Sequence[Mapping[str, Any]], num_sms: int, arch: int = 90,
                         dtype: str = "bf16") -> list[tuple[str, int]]:  # fmt: skip
    """(kernel name, splits) of every plan the learned selection weighs for a pass: the pass's
    kernels for the dtype and dims built for `arch` (else those that run on it), the implicit-GEMM ones at the widest
    channel vector among those the channels allow, and the direct ones whose groups hold the
    channels; splits as split_choices gives them (0: not backward-weight); not the TMA kernels'
    kernels, which the model has no timings of. Kernels that cannot
    run it for another reason (shared memory) stay in: the dispatcher leaves them out."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction {direction!r}: one of {', '.join(DIRECTIONS)}")
    allowed = _channel_vector(problem, direction)
    # The TMA kernels stay with the hand rules: the model has no timings of them.
    kernels = [k for k in registry if k["family"] == FAMILY[direction] and k["dtype"] == dtype
               and int(k["conv_spatial_dims"]) == int(problem["spatial_dims"])
               and _runs_on(k, arch) and k.get("pipeline") != TMA_PIPELINE]  # fmt: skip
    # SASS for this exact arch first, as the hand rules prefer it.
    exact = [k for k in kernels if k["arch"] == arch]
    kernels = exact or kernels
    channels = max(int(problem["in_channels"]), int(problem["out_channels"]))
    direct = [k for k in kernels if int(k["conv_max_channels"]) >= channels]
    gemm = [k for k in kernels if not int(k["conv_max_channels"])
            and int(k["conv_vector"]) <= allowed]  # fmt: skip
    widest = max((int(k["conv_vector"]) for k in gemm), default=0)
    chosen = direct + [k for k in gemm if int(k["conv_vector"]) == widest]
    if direction != "bwd_weight":
        return [(k["name"], 0) for k in chosen]
    return [(k["name"], s) for k in chosen for s in split_choices(problem, k, num_sms)]


def weight_pack(groups: int, in_channels: int, out_channels: int, reduction: int,
                positions: int) -> int:  # fmt: skip
    """Groups backward-weight's implicit GEMM multiplies as one (the kernels'
    conv_weight_pack): from WEIGHT_PACK_MIN_POSITIONS positions (batch x output positions), the
    largest power of two dividing the groups whose packed channels stay within 64 and whose
    packed reduction (taps x channels x pack) stays below 2^31."""
    widest, pack = max(in_channels, out_channels), 1
    if positions < WEIGHT_PACK_MIN_POSITIONS:
        return pack
    while (groups % (2 * pack) == 0 and 2 * pack * widest <= WEIGHT_PACK_CHANNELS
           and 2 * pack * reduction <= 0x7FFFFFFF):  # fmt: skip
        pack *= 2
    return pack


def _gemm(problem: Mapping[str, Any], direction: str) -> tuple[int, int, int]:
    """(M, N, K) of the pass's product per group: output rows by output channels over the
    reduction."""
    batch, c, k = int(problem["batch"]), int(problem["in_channels"]), int(problem["out_channels"])
    taps = math.prod(_sizes(problem["filter"]))
    positions = batch * math.prod(_sizes(problem["output"]))
    if direction == "fwd":
        return positions, k, c * taps
    if direction == "bwd_data":
        return batch * math.prod(_sizes(problem["input"])), c, k * taps
    return k, c * taps, positions


def conv_features(problem: Mapping[str, Any], direction: str, kernel: Mapping[str, Any],
                  splits: int, num_sms: int, pack: int | None = None) -> list[float]:  # fmt: skip
    """One candidate plan's features, in FEATURES' order. `pack`: the groups backward-weight's
    implicit GEMM multiplies as one, as weight_pack gives it unless the plan was timed under
    another rule (an oracle row's own pack)."""
    dims = int(problem["spatial_dims"])
    groups = int(problem["groups"])
    m, n, r = _gemm(problem, direction)
    tile_m, tile_n = int(kernel["tile_m"]), int(kernel["tile_n"])
    tile_k, warps = int(kernel["tile_k"]), int(kernel["warps"])
    direct = int(kernel["conv_max_channels"]) > 0
    weight = direction == "bwd_weight"
    used_splits = max(int(splits), 1) if weight else 1
    gemm_groups = groups
    if weight and not direct:
        if pack is None:
            pack = weight_pack(groups, int(problem["in_channels"]),
                               int(problem["out_channels"]), n, r)  # fmt: skip
        m, n, gemm_groups = m * pack, n * pack, groups // pack
    if direct:
        # A CTA: 32 groups of `warps` lines of `tile_m` positions (backward-weight: `splits`
        # CTAs per block of groups, taking the output tiles in turn).
        blocks = _ceil_div(groups, DIRECT_GROUPS)
        space = _sizes(problem["input" if direction == "bwd_data" else "output"])
        width = space[-1]
        tiles = (_ceil_div(space[-2], warps) * _ceil_div(width, tile_m)
                 * (space[0] if dims == 3 else 1) * int(problem["batch"]))  # fmt: skip
        ctas = blocks * (used_splits if weight else tiles)
        fill = groups / (blocks * DIRECT_GROUPS) * width / (_ceil_div(width, tile_m) * tile_m)
        steps = r / max(ctas / blocks, 1.0) if weight else float(r)
    else:
        tiles_m, tiles_n = _ceil_div(m, tile_m), _ceil_div(n, tile_n)
        ctas = tiles_m * tiles_n * gemm_groups * used_splits
        fill = m * n / (tiles_m * tile_m * tiles_n * tile_n)
        steps = r / (tile_k * used_splits)
    phases = math.prod(_sizes(problem["stride"])) if direction == "bwd_data" else 1
    return [float(dims), math.log2(max(int(problem["batch"]), 1)), math.log2(groups),
            math.log2(int(problem["in_channels"])), math.log2(int(problem["out_channels"])),
            float(math.prod(_sizes(problem["filter"]))), float(max(_sizes(problem["stride"]))),
            float(max(_sizes(problem["dilation"]))), float(phases), math.log2(max(m, 1)),
            math.log2(max(n, 1)), math.log2(max(r, 1)),
            math.log2(max(2.0 * m * n * r * gemm_groups, 1.0)),
            1.0 if kernel["pipeline"] == "sm90_cpasync_wgmma" else 0.0, 1.0 if direct else 0.0,
            float(tile_m), float(tile_n), float(tile_k), float(warps), float(kernel["stages"]),
            float(used_splits), math.log2(max(ctas, 1)), ctas / max(num_sms, 1), fill,
            math.log2(max(steps, 1.0))]  # fmt: skip
