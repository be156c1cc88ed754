"""This engine's target and drafter built straight on the device with random weights of a named shape."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from specdeploy.engine.drafter import DFlashDrafter
from specdeploy.engine.loading import on_meta, resolve_family, save_drafter, target_config
from specdeploy.engine.models.base import TargetModel
from specdeploy.perf.shapes import Shape
from specdeploy.zoo.byte_tokenizer import padded_byte_tokenizer, write_byte_tokenizer
from specdeploy.zoo.random_pair import empty_directory


def randomize_(module: nn.Module, device: torch.device, seed: int) -> nn.Module:
    """Materialise a module built on the meta device: normal(0, 0.02) weights, unit norms, zero biases.

    Buffers computed at construction (RoPE inverse frequencies) are kept; parameters the module keeps in
    float32 (`keep_fp32`) are made float32.
    """
    computed = {name: b for name, b in module.named_buffers() if not b.is_meta}
    module.to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    keep_fp32 = getattr(module, "keep_fp32", ())
    with torch.no_grad():
        for name, param in module.named_parameters():
            owner = module.get_submodule(name.rpartition(".")[0])
            if keep_fp32 and name.endswith(keep_fp32):
                param.data = param.data.float()
            if "norm" in name:
                param.fill_(
                    0.0 if getattr(owner, "zero_centered", False) else 1.0
                )  # zero-centred: weight - 1
            elif name.endswith("bias") or param.dim() < 2:
                param.zero_()
            else:
                param.normal_(0.0, 0.02, generator=generator)
        for name, buffer in module.named_buffers():
            if name in computed:
                buffer.copy_(computed[name])
            else:
                buffer.data = torch.zeros_like(buffer, dtype=torch.float32 if keep_fp32 else buffer.dtype)
    return module.eval().requires_grad_(False)


def random_pair(
    shape: Shape, device: torch.device, dtype: torch.dtype, seed: int = 0
) -> tuple[TargetModel, DFlashDrafter]:
    family, text, _ = resolve_family(shape.target)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # parameters are allocated in the model dtype from the start
    try:
        with on_meta():
            target = family(target_config(shape.target, text, None))
            drafter = DFlashDrafter(shape.drafter)
    finally:
        torch.set_default_dtype(default)
    return randomize_(target, device, seed), randomize_(drafter, device, seed + 1)


def write_random_checkpoints(
    out_dir: str | Path, shape: Shape, device: torch.device, dtype: torch.dtype, seed: int = 0
) -> tuple[Path, Path]:
    """OUT_DIR/target (config.json, model.safetensors, a byte-level tokenizer over the whole vocabulary) and
    OUT_DIR/draft (z-lab format): `random_pair`'s weights as checkpoints that `serve` and campaigns load."""
    out_dir = Path(out_dir)
    target_dir, draft_dir = empty_directory(out_dir / "target"), empty_directory(out_dir / "draft")
    target, drafter = random_pair(shape, device, dtype, seed)
    config = {**shape.target, "dtype": str(dtype).removeprefix("torch.")}
    (target_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    # state_dict names the tensors as checkpoints do (merged projections split into their parts).
    tensors = {name: t.detach().contiguous().cpu() for name, t in target.state_dict().items()}
    save_file(tensors, str(target_dir / "model.safetensors"), metadata={"format": "pt"})
    eos = shape.target["eos_token_id"]
    tokenizer = padded_byte_tokenizer(
        shape.target["vocab_size"], eos, shape.drafter["dflash_config"]["mask_token_id"]
    )
    write_byte_tokenizer(target_dir, tokenizer)
    save_drafter(drafter, draft_dir)
    return target_dir, draft_dir
