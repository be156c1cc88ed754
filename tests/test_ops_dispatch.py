"""Which version of an engine op runs: the Triton kernels have no backward, so training must not get them."""

from __future__ import annotations

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
