"""Which version of an engine op runs: the Triton kernels have no backward, so training must not get them."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import torch

from specdeploy.engine import ops


def test_triton_kernels_only_for_cuda_tensors_with_autograd_off(monkeypatch) -> None:
    kernels = object()
    monkeypatch.setattr(ops, "_triton_kernels", lambda: kernels)
    on_gpu, on_cpu = SimpleNamespace(is_cuda=True), SimpleNamespace(is_cuda=False)
    with torch.inference_mode():
        assert ops.triton_kernels_for(on_gpu) is kernels
        assert ops.triton_kernels_for(on_cpu) is None
    with torch.no_grad():
        assert ops.triton_kernels_for(on_gpu) is kernels
    with torch.enable_grad():
        assert ops.triton_kernels_for(on_gpu) is None  # a training step: autograd's torch path


INTERPRETED = """
import sys
import torch
if sys.argv[1] == "triton-first":
    import triton  # noqa: F401  (compiled for a GPU from here on)
from specdeploy.engine import ops
from specdeploy.errors import SpecdeployError
x, w = torch.randn(3, 40), 1 + 0.1 * torch.randn(40)
with torch.inference_mode():
    try:
        kernels = ops.triton_kernels_for(x)
    except SpecdeployError as exc:
        print("error:", exc)
        raise SystemExit(0)
    assert kernels is not None and ops.triton_kernels_for(torch.zeros(1, dtype=torch.long)) is kernels
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6), ops.torch_rms_norm(x, w, 1e-6))
print("interpreted")
"""


def test_interpret_runs_the_triton_versions_on_cpu_tensors_or_says_why_it_cannot() -> None:
    """SPECDEPLOY_TRITON=interpret: CPU tensors take the Triton versions, through Triton's interpreter, which it
    switches on itself; in a process that imported Triton before, a clear error instead of GPU kernels."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {
        "SPECDEPLOY_TRITON": "interpret"
    }
    runs = {
        case: subprocess.run(
            [sys.executable, "-c", INTERPRETED, case], env=env, capture_output=True, text=True, timeout=300
        )  # fmt: skip
        for case in ("fresh", "triton-first")
    }
    assert runs["fresh"].stdout.strip() == "interpreted", runs["fresh"].stderr[-2000:]
    assert "set TRITON_INTERPRET=1 before the process starts" in runs["triton-first"].stdout, runs[
        "triton-first"
    ].stderr[-2000:]
