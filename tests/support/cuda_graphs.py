"""CUDA-graph capture for GPU tests that replay a call with changed device inputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def capture(run: Callable[[], Any]) -> Any:
    """A torch CUDA graph of ``run``, after one warm-up call on a side stream (torch's capture
    rules)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph
