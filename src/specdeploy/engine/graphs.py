"""Replaying fixed-shape decoding stages as CUDA graphs: captured on first use, one launch per stage after.

A stage is a function over static buffers (no host synchronisation, no new shapes). Before capture it runs
once on a side stream, so that kernels compile and libraries initialise outside the capture; tensors a
stage updates in place are saved before that warm-up and restored after it, so the warm-up leaves no trace.
A stage whose capture fails runs eagerly from then on, and says why in `eager_reasons`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence

import torch

log = logging.getLogger(__name__)


class StageGraphs:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}
        self.eager_reasons: dict[Hashable, str] = {}
        self._pool = None

    def run(
        self,
        key: Hashable,
        stage: Callable[[], None],
        protect: Sequence[torch.Tensor] = (),
        neutral: Callable[[], None] | None = None,
    ) -> None:
        """Run `stage` (replaying its graph for `key`). `protect` lists the tensors it updates in place that
        must survive its warm-up; `neutral` puts its inputs in a state whose warm-up is harmless."""
        if not self.enabled or key in self.eager_reasons:
            stage()
            return
        graph = self.graphs.get(key)
        if graph is None:
            graph = self._capture(key, stage, protect, neutral)
            if graph is None:
                stage()
                return
        graph.replay()

    def _capture(
        self,
        key: Hashable,
        stage: Callable[[], None],
        protect: Sequence[torch.Tensor],
        neutral: Callable[[], None] | None,
    ) -> torch.cuda.CUDAGraph | None:
        saved = [t.clone() for t in protect]
        if neutral is not None:
            neutral()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            stage()
        torch.cuda.current_stream().wait_stream(side)
        for tensor, value in zip(protect, saved, strict=True):
            tensor.copy_(value)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool):
                stage()
        except RuntimeError as exc:  # an operation that cannot be captured: run this stage eagerly
            self.eager_reasons[key] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            log.warning("stage %s runs eagerly: %s", key, self.eager_reasons[key])
            torch.cuda.synchronize()
            return None
        self._pool = graph.pool()
        self.graphs[key] = graph
        return graph

    def clear(self) -> None:
        self.graphs.clear()
        self.eager_reasons.clear()
        self._pool = None
