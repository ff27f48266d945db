"""Timing GPU work alone: one call captured in a CUDA graph, then replays between two events."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def capture_graph(fn: Callable[[], Any], pool: Any) -> Any:
    """One call of fn captured in a CUDA graph: replaying it times the GPU work alone,
    without the host path (which differs between forced and automatic calls, not between
    kernels). The graphs of a problem share one memory pool: they replay one at a time on one
    stream, and nothing reads their outputs."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # a first call outside the capture: lazy loads and allocations happen here
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        fn()
    return graph


def replay_ms(graph: Any, calls: int) -> float:
    """Milliseconds per replay over `calls` back-to-back replays."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls
