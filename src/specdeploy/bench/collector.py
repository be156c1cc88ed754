"""The garbage collector held off while a cell is measured.

A full collection walks every object the process holds; with 64 streams open it stalled all of them at
once for 25-90 ms, and those stalls were the client's chunk-lag p99. Inside `collector_paused()` no
collection runs; reference counting still frees everything but cycles, which the collection at the end
of the block (untimed) takes. Objects made before the block (modules, prompts, tokenizers) are frozen
out of that collection's walk.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """No garbage collection inside the block; restores the collector's previous state after it."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()
        gc.collect()
