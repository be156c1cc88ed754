"""Timing helpers the CUDA sweep scripts share: the device copy bandwidth, and a call replayed from a graph."""

from __future__ import annotations

from collections.abc import Callable

import torch


def copy_bandwidth() -> float:
    """Bytes per second of a 4 GiB device-to-device copy (read + write)."""
    source = torch.empty(1 << 30, dtype=torch.float32, device="cuda")
    dest = torch.empty_like(source)
    dest.copy_(source)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dest.copy_(source)
    end.record()
    end.synchronize()
    return 2 * (4 << 30) * 10 / (start.elapsed_time(end) / 1e3)


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
