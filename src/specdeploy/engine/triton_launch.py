"""Programmatic dependent launch (PDL, Hopper and later) for every Triton kernel of the engine, when asked for.

With `SPECDEPLOY_PDL=1` (read when this module is first imported) each kernel may be launched while the kernel
before it on the stream still runs: its programs wait at their first instruction (`dependent_launch`) until that
kernel has finished and its writes are visible, then let the next kernel launch. Every read and write thus keeps
the stream's order, each kernel's wait covering the ones before it in turn; what it can save is the launch
latency between kernels, a large share of a small model's step at batch 1 (a tiny zoo pair's DDTree step makes
about 160 launches, mla-moe-16b's AR step 297). Off by default, and under Triton's interpreter, which has no
launch to overlap: it has not yet run on a GPU, where `benchmarks/results/gpu-pdl-ab/run.sh` tests and times it.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

PDL = tl.constexpr(os.environ.get("SPECDEPLOY_PDL") == "1" and os.environ.get("TRITON_INTERPRET") != "1")


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
