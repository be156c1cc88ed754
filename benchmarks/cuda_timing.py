"""A call timed as CUDA graph replays, for the sweep scripts (the copy bandwidth is `perf.roofline`'s)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def graph_replay_ms(call: Callable[[], None], replays: int = 20) -> float:
    """Milliseconds of one `call` captured in a CUDA graph and replayed (launch overhead excluded); the first
    call runs eagerly, so Triton compiles outside the capture."""
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / replays
