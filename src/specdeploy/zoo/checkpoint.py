"""Saving zoo models as they train: bf16 safetensors, written to a temporary folder and swapped in whole."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import torch


def bf16_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    # Shipped weights are bf16 to halve the repository's size; small integer/bool buffers stay as they are.
    return {
        name: tensor.detach().to("cpu", torch.bfloat16) if tensor.is_floating_point() else tensor.cpu()
        for name, tensor in model.state_dict().items()
    }


def save_atomically(directory: Path, write: Callable[[Path], None]) -> None:
    """Run `write(tmp_dir)` and then replace `directory` with it, so a cut-off never leaves half a model."""
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    old = directory.with_name(directory.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if directory.exists():
        directory.rename(old)
    tmp.rename(directory)
    shutil.rmtree(old, ignore_errors=True)
