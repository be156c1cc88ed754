"""Loading a ready-to-decode engine (target, optional drafter, tokenizer) from checkpoint paths."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdeploy.engine.batch import BatchEngine
from specdeploy.engine.budget import BudgetPolicy
from specdeploy.engine.decode import Decoder
from specdeploy.engine.request import check_mode
from specdeploy.errors import SpecdeployError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Engine:
    """A loaded target (+ drafter): `decoder` makes an engine for one request at a time, `batch_engine` a
    batching one."""

    target: torch.nn.Module
    drafter: torch.nn.Module | None
    tokenizer: Any  # a transformers tokenizer loaded from the target directory
    model_name: str
    target_path: Path
    draft_path: Path | None
    mode: str
    budget: int | None
    block_size: int | None
    max_context: int
    device: str
    dtype: str

    def decoder(self) -> Decoder:
        return Decoder(self.target, self.drafter, self.mode, self.budget)

    def batch_engine(self, max_running: int, policy: BudgetPolicy | None = None) -> BatchEngine:
        return BatchEngine(
            self.target,
            self.drafter,
            self.mode,
            self.budget,
            max_running=max_running,
            max_context=self.max_context,
            policy=policy,
        )


def resolve_device(device: str) -> torch.device:
    if device == "cuda" and not torch.cuda.is_available():
        raise SpecdeployError("--device cuda was asked for, but torch sees no CUDA device: use --device cpu")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise SpecdeployError(f"unknown device {device!r}: use cpu or cuda")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise SpecdeployError(f"unknown dtype {dtype!r}: use auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as exc:
        raise SpecdeployError(f"no usable tokenizer in {path}: {exc}") from exc


def set_cpu_threads(threads: int | None) -> None:
    """One intra-op thread unless asked otherwise: batch-1 decoding of small models gains nothing from more,
    and OpenMP threads that spin on a busy machine slowed it by up to 100x in our measurements."""
    if threads is not None and threads < 1:
        raise SpecdeployError(f"--threads must be at least 1, got {threads}")
    torch.set_num_threads(threads or 1)


def load_engine(
    target: Path,
    draft: Path | None,
    mode: str,
    budget: int | None = None,
    device: str = "cpu",
    dtype: str = "auto",
    threads: int | None = None,
    context_length: int | None = None,
    weights: bool = True,
) -> Engine:
    """`context_length`: positions (prompt + new tokens) a request may reach, at most the model's own; the
    batching engine's static caches hold that many per running request. `weights=False`: everything but the
    weights (the models on the meta device: configurations and shapes, checked as with weights), for a
    process that serves an engine loaded by another."""
    from specdeploy.engine.loading import load_drafter, load_target

    check_mode(mode, draft is not None, budget)  # before any weights load
    torch_device = resolve_device(device)
    if torch_device.type == "cpu" and weights:
        set_cpu_threads(threads)
    torch_dtype = resolve_dtype(dtype, torch_device)
    load_on = torch_device if weights else torch.device("meta")
    target_path = Path(target)
    model = load_target(target_path, device=load_on, dtype=torch_dtype)
    drafter = None
    draft_path = None
    if mode != "ar":
        draft_path = Path(draft)
        drafter = load_drafter(draft_path, device=load_on, dtype=torch_dtype)
        drafter.check_compatible(model.config)
    positions = model.config.max_position_embeddings
    if context_length is not None and not 1 <= context_length <= positions:
        raise SpecdeployError(
            f"--context-length {context_length} is outside 1..{positions} (the model's max_position_embeddings)"
        )
    return Engine(
        target=model,
        drafter=drafter,
        tokenizer=load_tokenizer(target_path),
        model_name=target_path.name,
        target_path=target_path,
        draft_path=draft_path,
        mode=mode,
        budget=budget,
        block_size=drafter.block_size if drafter is not None else None,
        max_context=context_length or positions,
        device=str(torch_device),
        dtype=str(torch_dtype).removeprefix("torch."),
    )
