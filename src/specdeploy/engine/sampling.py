"""Turning target or draft logits into tokens: greedy, or temperature / top-k / top-p sampling."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdeploy.engine.tree import Acceptance, TreeBatch
from specdeploy.errors import SpecdeployError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 128
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()  # added to the model's EOS ids unless ignore_eos
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise SpecdeployError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise SpecdeployError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise SpecdeployError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise SpecdeployError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution sampling draws from: softmax(logits / T), restricted to top-k, then to the top-p nucleus."""
    scores = logits.float() / params.temperature
    if 0 < params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if params.top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the token that crosses it included)
        keep = sorted_probs.cumsum(dim=-1) - sorted_probs < params.top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs * keep)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One token per row of probs [..., V] by inverting its CDF at `uniform` [...] in [0, 1).

    A uniform per output position (not one random stream per call) is what lets a speculative step reproduce
    an AR step's sample exactly: both draw the token at position n from the same u_n.
    """
    cdf = probs.float().cumsum(dim=-1)
    # right=True skips zero-probability tokens; the clamp keeps u * total strictly below the total
    threshold = (uniform.clamp(max=1 - 2**-23) * cdf[..., -1])[..., None]
    index = torch.searchsorted(cdf, threshold.contiguous(), right=True)[..., 0]
    return index.clamp(max=probs.shape[-1] - 1)


class UniformStream:
    """The uniforms of one request: one per output position and purpose, from the request's seed.

    `table[purpose][n]` is used for the token at output position n (0 = the first generated token), so
    every decoding mode consumes the same values for the same positions.
    """

    PURPOSES = ("target", "draft", "accept")

    def __init__(self, length: int, seed: int | None, device: torch.device) -> None:
        generator = torch.Generator()
        if seed is None:
            generator.seed()  # a fresh nondeterministic seed, leaving torch's global RNG alone
        else:
            generator.manual_seed(seed)
        # One sub-stream per purpose, so that a table's first n values do not depend on its length.
        sub_seeds = torch.randint(2**62, (len(self.PURPOSES),), generator=generator).tolist()
        rows = [torch.rand(length, generator=generator.manual_seed(s)) for s in sub_seeds]
        self.table = torch.stack(rows).to(device)

    def __getitem__(self, purpose: str) -> torch.Tensor:
        return self.table[self.PURPOSES.index(purpose)]


def accept_sampled_chain(
    tree: TreeBatch,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    accept_uniform: torch.Tensor,
    bonus_uniform: torch.Tensor,
) -> Acceptance:
    """Speculative rejection sampling along a sampled chain: lossless, and accepts more than matching samples.

    Draft token d at depth i (drawn from q_i, draft_probs [B, L, V]) is kept with probability
    min(1, p_i(d) / q_i(d)) (target_probs [B, L+1, V]); the first rejection draws the bonus from the residual
    max(p_i - q_i, 0), and a fully accepted chain draws it from the target's distribution after the last
    node. accept_uniform [B, L] and bonus_uniform [B, L+1] are the step's uniforms by depth.
    """
    length = draft_probs.shape[1]
    tokens = tree.tokens[:, 1:, None]
    p = target_probs[:, :length].gather(-1, tokens)[..., 0]
    q = draft_probs.gather(-1, tokens)[..., 0]
    accepted = (accept_uniform * q <= p).long().cumprod(dim=1).sum(dim=1)
    residual = (target_probs[:, :length] - draft_probs).clamp(min=0)
    total = residual.sum(dim=-1, keepdim=True)
    # p == q on the support up to rounding: the residual vanishes, and sampling p itself is exact.
    residual = torch.where(total > 0, residual / total.clamp(min=1e-30), target_probs[:, :length])
    bonus_rows = torch.cat([residual, target_probs[:, length:]], dim=1)
    row = bonus_rows.gather(1, accepted[:, None, None].expand(-1, 1, bonus_rows.shape[-1]))[:, 0]
    bonus = sample(row, bonus_uniform.gather(1, accepted[:, None])[:, 0])
    index = torch.arange(length + 1, device=tokens.device).expand(tokens.shape[0], -1)
    return Acceptance(
        path=torch.where(index <= accepted[:, None], index, 0), length=accepted + 1, bonus=bonus
    )
