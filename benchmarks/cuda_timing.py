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


def sweep_header(default: tuple | None) -> dict:
    """A sweep's JSON head: the device, torch, the copy bandwidth measured now, the setting in use."""
    from specdeploy.perf.roofline import copy_bandwidth

    return {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "copy_tb_per_s": copy_bandwidth(torch.device("cuda")) / 1e12,
        "default": list(default) if default else None,
        "shapes": {},
    }


def layer_weights(projections: list[tuple[int, int]], layers: int) -> list[torch.Tensor]:
    """bf16 weights [out, in] of every projection of `layers` layers, each layer its own (so that a chain of them
    finds none in L2), scaled like a trained layer's."""
    return [
        torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
        for _ in range(layers)
        for n, k in projections
    ]
