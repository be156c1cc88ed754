"""The bytes a decoding step must read, and the time that takes at the copy bandwidth measured in the same run.

A step reads every weight of the target but the embedding table (one row per token), only the routed experts
its tokens route to, the cache entries of its context, and in speculative modes the drafter's weights, the
LM head again (the drafter's logits) and the drafter's context cache. A recurrent (Gated DeltaNet) layer keeps
no per-token cache: its state, the fp32 recurrent matrix per value head and the short convolution's last inputs,
is read once and written once per step whatever the context (a lower bound: an engine that stores every tree
node's state writes that many more).

Which experts a verify of n tokens touches is measured, not assumed: the target routes a prompt eagerly and the
union of the experts chosen by each run of n consecutive tokens is counted, layer by layer (independent routing
would give 1 - (1 - k/E)^n of the experts).
"""

from __future__ import annotations

from collections.abc import Iterable
from math import prod

import torch
from torch import nn

from specdeploy.engine.forward_batch import append_batch
from specdeploy.engine.models.gated_deltanet import GatedDeltaNet
from specdeploy.engine.models.moe import Experts

ROUTED = ".experts."  # parameter-name infix of routed experts (shared ones are `shared_experts`)


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, repeats: int = 10) -> float:
    """Bytes per second of a device-to-device copy of `nbytes`, counting bytes read plus bytes written."""
    source = torch.empty(nbytes // 4, dtype=torch.float32, device=device).normal_()
    dest = torch.empty_like(source)
    dest.copy_(source)  # warm-up: first-touch page faults and lazy allocation
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            dest.copy_(source)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3 / repeats
    else:
        import time

        started = time.perf_counter()
        for _ in range(repeats):
            dest.copy_(source)
        seconds = (time.perf_counter() - started) / repeats
    del source, dest
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return 2 * nbytes / seconds


def weight_bytes(target: nn.Module) -> dict[str, int]:
    """Target weights a step reads in full ('dense': all but the embedding table and the routed experts) and
    the routed experts' weights of all layers ('routed')."""
    dense = routed = 0
    for name, param in target.named_parameters():
        if name.startswith("embed_tokens") and param is not target.lm_head.weight:
            continue
        size = param.numel() * param.element_size()
        if ROUTED in name:
            routed += size
        else:
            dense += size
    return {"dense": dense, "routed": routed}


def cache_bytes_per_token(model: nn.Module) -> int:
    """Bytes of cache entries one context position holds across `model`'s layers."""
    element = next(model.parameters()).element_size()  # the model dtype: embeddings or first projection
    total = 0
    for layer in model.layers:
        entry = layer.mixer.cache_entry()
        if entry is not None:
            total += sum(prod(shape) for shape in entry) * element
    return total


def recurrent_state_bytes(model: nn.Module) -> int:
    """Bytes of one sequence's recurrent state across `model`'s Gated DeltaNet layers: the fp32 state
    (v_heads x k_dim x v_dim) and the convolution's last (width - 1) inputs of q|k|v in the model dtype."""
    element = next(model.parameters()).element_size()
    total = 0
    for layer in model.layers:
        mixer = layer.mixer
        if isinstance(mixer, GatedDeltaNet):
            total += mixer.v_heads * mixer.k_dim * mixer.v_dim * 4  # float32 whatever the model dtype
            total += (mixer.conv_width - 1) * (2 * mixer.key_size + mixer.value_size) * element
    return total


def expert_union(target: nn.Module, prompt_ids: list[int], sizes: Iterable[int]) -> dict[int, float]:
    """{n: mean fraction of a layer's routed experts chosen by n consecutive prompt tokens} for each n the
    prompt holds at least once, over every MoE layer and every whole run of n tokens; {} for a dense model."""
    routed = [m for m in target.modules() if isinstance(m, Experts)]
    if not routed:
        return {}
    chosen: list[torch.Tensor] = []

    def record(module: nn.Module, args: tuple) -> None:
        chosen.append(args[2].detach())

    hooks = [m.register_forward_pre_hook(record) for m in routed]
    device = target.embed_tokens.weight.device
    ids = torch.tensor([prompt_ids], device=device)
    try:
        with torch.no_grad():
            positions = torch.arange(len(prompt_ids), device=device)[None]
            cache = target.new_cache(1, len(prompt_ids) + 1)
            target.run(ids, append_batch(positions, 0, cache.capacity, 1), cache)  # routing only: no LM head
    finally:
        for hook in hooks:
            hook.remove()
    fractions = {}
    for n in sorted(set(sizes)):
        runs = len(prompt_ids) // n
        if runs == 0:
            continue
        touched = []
        for indices, module in zip(chosen, routed, strict=True):
            windows = indices[: runs * n].reshape(runs, -1)
            hit = torch.zeros(runs, module.num_experts, device=windows.device)
            touched.append(hit.scatter_(1, windows, 1.0).mean(dim=1))
        fractions[n] = torch.cat(touched).mean().item()
    return fractions


def independent_union(top_k: int, experts: int, tokens: int) -> float:
    """The fraction of experts `tokens` independently routed tokens touch: 1 - (1 - k/E)^n."""
    return 1.0 - (1.0 - top_k / experts) ** tokens


def verify_tokens(mode: str, budget: int | None, block_size: int | None) -> int:
    """Tokens the target runs per step: 1 (AR), the drafter's block (DFlash), budget + 1 (DDTree)."""
    if mode == "ar":
        return 1
    if mode == "ddtree":
        return budget + 1
    return block_size


def step_bytes(
    target: nn.Module,
    drafter: nn.Module | None,
    tokens: int,
    context: int,
    union: float | None,
) -> dict[str, int]:
    """Bytes one step reads, by kind, for `tokens` verified over `context` cached positions, the routed
    experts counted at `union` (the fraction touched; None for a dense model); `target_state` is the recurrent
    state read and written back (0 without recurrent layers)."""
    weights = weight_bytes(target)
    parts = {
        "target_weights": weights["dense"],
        "routed_experts": round(weights["routed"] * union) if union is not None else 0,
        "target_cache": context * cache_bytes_per_token(target),
        "target_state": 2 * recurrent_state_bytes(target),
    }
    if drafter is not None:
        lm_head = target.lm_head.weight
        parts["drafter_weights"] = sum(p.numel() * p.element_size() for p in drafter.parameters()) + (
            lm_head.numel() * lm_head.element_size()
        )
        parts["drafter_cache"] = context * cache_bytes_per_token(drafter)
    parts["total"] = sum(parts.values())
    return parts
