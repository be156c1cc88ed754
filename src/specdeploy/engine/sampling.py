"""Turning target or draft logits into tokens: greedy, or temperature / top-k / top-p sampling."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import torch

from specdeploy.engine.tree import Acceptance, TreeBatch
from specdeploy.errors import SpecdeployError

# Temperatures below this are greedy, as in SGLang (its _SAMPLING_EPS): logits / T overflows float32 long
# before T reaches 0, and a distribution that sharp is the argmax anyway.
GREEDY_BELOW_TEMPERATURE = 1e-6


def as_float32(value: float) -> float:
    """`value` as the float32 the sampling tensors hold it in; OverflowError above float32's range."""
    return struct.unpack("f", struct.pack("f", value))[0]


def _float32_or_none(value: float) -> float | None:
    try:
        return as_float32(value)
    except OverflowError:
        return None


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
        # every value is checked as the float32 it becomes: a finite float64 can still overflow or vanish there
        temperature = _float32_or_none(self.temperature)
        if temperature is None or not math.isfinite(temperature) or temperature < 0:
            raise SpecdeployError(
                f"temperature must be a number from 0 to {torch.finfo(torch.float32).max:.4g} (the largest "
                f"float32), got {self.temperature}; 0 (or anything below {GREEDY_BELOW_TEMPERATURE}) is greedy"
            )
        top_p = _float32_or_none(self.top_p)
        if top_p is None or not math.isfinite(top_p) or not 0 < top_p <= 1:
            raise SpecdeployError(
                f"top_p must be in (0, 1] and not round to 0 as a float32, got {self.top_p}"
            )
        if self.top_k < 0:
            raise SpecdeployError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise SpecdeployError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution sampling draws from: softmax(logits / T), restricted to top-k, then to the top-p nucleus."""
    return row_sampling_probs(logits, RowSampling.of([params], logits.device), rows_first=False)


TOP_K_OFF = 2**62  # any top_k at least the vocabulary size keeps every token; larger ones overflow int64


@dataclass
class RowSampling:
    """Sampling settings of several rows as tensors [R], so one call serves rows with different settings."""

    temperature: torch.Tensor  # float32; 1 where the row is greedy (its probabilities are then unused)
    top_k: torch.Tensor  # int64; 0 = off
    top_p: torch.Tensor  # float32
    greedy: torch.Tensor  # bool

    @staticmethod
    def of(params: list[SamplingParams], device: torch.device | str) -> RowSampling:
        rows = [RowSampling.settings(p) for p in params]
        return RowSampling(
            temperature=torch.tensor([floats[0] for _, floats in rows], device=device),
            top_k=torch.tensor([ints[0] for ints, _ in rows], device=device),
            top_p=torch.tensor([floats[1] for _, floats in rows], device=device),
            greedy=torch.tensor([bool(ints[1]) for ints, _ in rows], device=device),
        )

    @staticmethod
    def settings(params: SamplingParams) -> tuple[list[int], list[float]]:
        """One row's settings as these tensors hold them: [top_k, greedy] and [temperature, top_p] (float32
        values; a greedy row's temperature is 1, its probabilities go unused)."""
        temperature = 1.0 if params.greedy else params.temperature
        values = [_float32_or_none(temperature), _float32_or_none(params.top_p)]
        floats = [value for value in values if value is not None and math.isfinite(value)]
        if len(floats) < len(values):
            # SamplingParams refuses these: a row must never hold an infinite setting
            raise SpecdeployError(
                f"temperature {temperature} or top_p {params.top_p} overflows float32, the sampling tensors' type"
            )
        return [min(params.top_k, TOP_K_OFF), int(params.greedy)], floats

    def rows(self, count: int, start: int = 0) -> RowSampling:
        """Rows start..start+count-1."""
        end = start + count
        return RowSampling(
            self.temperature[start:end], self.top_k[start:end], self.top_p[start:end], self.greedy[start:end]
        )


def row_sampling_probs(logits: torch.Tensor, rows: RowSampling, rows_first: bool = True) -> torch.Tensor:
    """`sampling_probs` for logits [R, ..., V] whose row r follows rows' settings r (rows_first), or for any
    logits [..., V] under one row's settings."""
    scores = logits.float()
    shape = (-1,) + (1,) * (scores.dim() - 1) if rows_first else ()  # () views a one-row setting as a scalar
    scores = scores / rows.temperature.view(shape)
    if not (bool((rows.top_k > 0).any()) or bool((rows.top_p < 1).any())):
        return torch.softmax(scores, dim=-1)
    vocab = scores.shape[-1]
    top_k, top_p = rows.top_k.view(shape), rows.top_p.view(shape)
    sorted_scores, order = scores.sort(dim=-1, descending=True)
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, vocab)
    kth = sorted_scores.gather(-1, (k - 1).expand(*sorted_scores.shape[:-1], 1))
    sorted_scores = sorted_scores.masked_fill(sorted_scores < kth, float("-inf"))
    sorted_probs = torch.softmax(sorted_scores, dim=-1)
    # keep the smallest prefix whose mass reaches top_p (the token that crosses it included)
    keep = sorted_probs.cumsum(dim=-1) - sorted_probs < top_p
    kept = sorted_probs * keep
    kept = kept / kept.sum(dim=-1, keepdim=True)
    return torch.zeros_like(kept).scatter(-1, order, kept)


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
