"""The rounding every Triton kernel of the engine shares, so that each stores what the torch ops it replaces store."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rounded(x, dtype: tl.constexpr):
    """A float32 value rounded to the model dtype and back: what a torch op in that dtype stores."""
    return x.to(dtype).to(tl.float32)


@triton.jit
def rounded_silu(x, dtype: tl.constexpr):
    """silu of a float32 value, rounded to the model dtype and back: F.silu's output, which it rounds before
    SwiGLU's product."""
    return rounded(x / (1.0 + tl.exp(-x)), dtype)
