"""Programmatic dependent launch (PDL, Hopper and later) for every Triton kernel of the engine.

With PDL each kernel may be launched while the kernel before it on the stream still runs: its programs wait
(`dependent_launch`) until that kernel has finished and its writes are visible, then let the next kernel launch.
They wait first, or after loading weights only (which no kernel writes: their load then overlaps the kernel
before; `tests/test_triton_launch.py` checks every kernel for it). Every read of another kernel's output and every
write thus keep the stream's order, each kernel's wait covering the ones before it in turn; what it saves is the
launch latency between kernels, a large share of a small model's step at
batch 1 (a tiny zoo pair's DDTree step makes about 160 launches, mla-moe-16b's AR step 297). On one H100 it took
mla-moe-16b's AR step from 2.80-2.94 ms to 2.72-2.79 and the zoo pairs' AR from 3,688 and 3,569 to 3,977 and
3,938 tok/s (`benchmarks/results/gpu-pdl-ab/`).

On when the GPU (the current CUDA device when this module is first imported) is sm_90 or later; off under
Triton's interpreter, which has no launch to overlap. `SPECDEPLOY_PDL=0` turns it off, `SPECDEPLOY_PDL=1` on
whatever the device (to compile kernels for sm_90 on a machine without one).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


def _pdl_wanted() -> bool:
    # griddepcontrol exists from sm_90 on: older GPUs would fail to compile the kernels with it.
    asked = os.environ.get("SPECDEPLOY_PDL")
    if os.environ.get("TRITON_INTERPRET") == "1" or asked == "0":
        return False
    if asked == "1":
        return True
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


PDL = tl.constexpr(_pdl_wanted())


def launch_options() -> dict[str, bool]:
    """Keyword options for a kernel launch: PDL's launch attribute when it is on."""
    return {"launch_pdl": True} if PDL.value else {}


@triton.jit
def dependent_launch():
    """First in every kernel launched with `launch_options()`: with PDL, wait until the kernel before has finished
    and its writes are visible, then let the next one launch; without it, nothing."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
