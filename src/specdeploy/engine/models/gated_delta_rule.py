"""The gated delta rule, Gated DeltaNet's recurrence, in float32: token by token over a tree, chunked over a chain.

With state h [Dk, Dv] per value head and, per token t, a log decay g_t <= 0, a write strength beta_t in (0, 1),
an L2-normalised key k_t, a value v_t and an L2-normalised query q_t scaled by Dk^-1/2:

    h <- exp(g_t) h;    h <- h + k_t (beta_t (v_t - h^T k_t))^T;    o_t = h^T q_t

The tree form runs each token from its own parent's state (a chain is the tree whose parents are t-1); the
chunked form is the same recurrence over a chain, rewritten per chunk as a few matrix products.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

CHUNK_SIZE = 64


@dataclass
class RuleInputs:
    """Per-token inputs of the rule in float32, [batch, value_heads, tokens, ...] (keys already per value head)."""

    query: torch.Tensor  # [B, H, T, Dk], normalised and scaled
    key: torch.Tensor  # [B, H, T, Dk], normalised
    value: torch.Tensor  # [B, H, T, Dv]
    decay: torch.Tensor  # [B, H, T], log space
    beta: torch.Tensor  # [B, H, T]

    def select(self, tokens: list[int]) -> RuleInputs:
        index = torch.tensor(tokens, device=self.query.device)
        return RuleInputs(
            *(t.index_select(2, index) for t in (self.query, self.key, self.value, self.decay, self.beta))
        )


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    # eps inside the root, as flash-linear-attention and transformers' fallback compute it
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def rule_inputs(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, decay: torch.Tensor, beta: torch.Tensor
) -> RuleInputs:
    """From the layer's [B, T, heads, dim] layout: float32, heads first, keys shared by groups of value heads."""
    groups = value.shape[2] // key.shape[2]
    query, key = (t.repeat_interleave(groups, dim=2) if groups > 1 else t for t in (query, key))
    query, key, value, decay, beta = (t.transpose(1, 2).float() for t in (query, key, value, decay, beta))
    query = l2norm(query) * query.shape[-1] ** -0.5
    return RuleInputs(query, l2norm(key), value, decay, beta)


def tree_rule(
    inputs: RuleInputs, parents: list[int], initial: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every token run from its parent's state (-1: from `initial` [B, H, Dk, Dv]).

    Returns outputs [B, H, T, Dv] and each token's state [B, H, T, Dk, Dv]. Tokens of one depth are
    independent, so they run as one batch: a tree costs as many steps as it is deep.
    """
    batch, heads, tokens, key_dim = inputs.key.shape
    depth: list[int] = []
    for parent in parents:
        depth.append(0 if parent < 0 else depth[parent] + 1)
    states = inputs.value.new_empty(batch, heads, tokens, key_dim, inputs.value.shape[-1])
    out = torch.empty_like(inputs.value)
    device = inputs.value.device
    for level in range(max(depth, default=-1) + 1):
        nodes = [i for i, d in enumerate(depth) if d == level]
        index = torch.tensor(nodes, device=device)
        if level == 0:
            h = initial.float()[:, :, None].expand(-1, -1, len(nodes), -1, -1)
        else:
            h = states.index_select(2, torch.tensor([parents[i] for i in nodes], device=device))
        q, k, v = (t.index_select(2, index) for t in (inputs.query, inputs.key, inputs.value))
        decay, beta = (t.index_select(2, index) for t in (inputs.decay, inputs.beta))
        h = h * decay.exp()[..., None, None]
        predicted = (h * k[..., None]).sum(dim=-2)  # what the state already recalls for this key
        correction = (v - predicted) * beta[..., None]
        h = h + k[..., None] * correction[..., None, :]
        states[:, :, index] = h
        out[:, :, index] = (h * q[..., None]).sum(dim=-2)
    return out, states


def chunked_rule(
    inputs: RuleInputs, initial: torch.Tensor, chunk: int = CHUNK_SIZE
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule over a chain, `chunk` tokens per matrix step. Returns outputs [B, H, T, Dv] and the final state.

    Inside a chunk, with c_t the cumulative log decay from the chunk start, the delta rule's writes satisfy
    a unit lower-triangular system (the UT / WY form); solving it gives each token's effective write
    u_t = w_t - W_t h_start, so the chunk's outputs and end state follow from h_start by matrix products.
    """
    tokens = inputs.key.shape[2]
    pad = (chunk - tokens % chunk) % chunk
    query, key, value = (F.pad(t, (0, 0, 0, pad)) for t in (inputs.query, inputs.key, inputs.value))
    decay, beta = (F.pad(t, (0, pad)) for t in (inputs.decay, inputs.beta))
    batch, heads, padded, key_dim = key.shape

    def chunks(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(batch, heads, padded // chunk, chunk, *t.shape[3:])

    query, key, value, decay, beta = (chunks(t) for t in (query, key, value, decay, beta))
    cum = decay.cumsum(dim=-1)  # [B, H, N, C]
    later = torch.ones(chunk, chunk, dtype=torch.bool, device=key.device).triu(1)
    # exp(c_i - c_j) for j <= i: the decay between token j's write and token i's read
    between = (cum[..., :, None] - cum[..., None, :]).masked_fill(later, float("-inf")).exp()
    key_beta = key * beta[..., None]
    system = (key_beta @ key.transpose(-1, -2)) * between
    writes = torch.linalg.solve_triangular(system, value * beta[..., None], upper=False, unitriangular=True)
    reads = torch.linalg.solve_triangular(
        system, key_beta * cum.exp()[..., None], upper=False, unitriangular=True
    )
    scores = (query @ key.transpose(-1, -2)) * between
    query_decayed = query * cum.exp()[..., None]
    key_to_end = key * (cum[..., -1:] - cum).exp()[..., None]
    chunk_decay = cum[..., -1].exp()[..., None, None]

    h = initial.float()
    out = torch.empty_like(value)
    for n in range(padded // chunk):
        effective = writes[:, :, n] - reads[:, :, n] @ h
        out[:, :, n] = query_decayed[:, :, n] @ h + scores[:, :, n] @ effective
        h = h * chunk_decay[:, :, n] + key_to_end[:, :, n].transpose(-1, -2) @ effective
    return out.reshape(batch, heads, padded, -1)[:, :, :tokens], h
