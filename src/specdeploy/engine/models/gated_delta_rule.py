"""The gated delta rule, Gated DeltaNet's recurrence, in float32: along each token's path, chunked over a chain.

With state h [Dk, Dv] per value head and, per token t, a log decay g_t <= 0, a write strength beta_t in (0, 1),
an L2-normalised key k_t, a value v_t and an L2-normalised query q_t scaled by Dk^-1/2:

    h <- exp(g_t) h;    h <- h + k_t (beta_t (v_t - h^T k_t))^T;    o_t = h^T q_t

Every tensor here is token-major, as the projections give them: [batch, tokens, heads, dim]. A chain (a
prefill) runs token by token or, when long, chunked (the same recurrence rewritten per chunk as a few matrix
products). A draft tree runs each token from its own parent's state (`tree_rule`: the chunked form over the
tree), and the accepted path is later replayed from the committed state (`replay`) token by token, so the
committed state is the recurrence's own. These torch versions are the reference; on CUDA the kernels of
`triton_gdn` replace `tree_rule` and `replay`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

CHUNK_SIZE = 64


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    # eps inside the root, as flash-linear-attention and transformers' fallback compute it
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def value_head_keys(x: torch.Tensor, value_heads: int) -> torch.Tensor:
    """L2-normalised float32 keys (or queries) [..., Hk, Dk] repeated for their value heads [..., Hv, Dk]."""
    x = l2norm(x.float())
    groups = value_heads // x.shape[-2]
    return x.repeat_interleave(groups, dim=-2) if groups > 1 else x


@dataclass
class RuleInputs:
    """Per-token inputs of the rule in float32, [batch, tokens, value_heads, ...] (keys already per value head)."""

    query: torch.Tensor  # [B, T, H, Dk], normalised and scaled
    key: torch.Tensor  # [B, T, H, Dk], normalised
    value: torch.Tensor  # [B, T, H, Dv]
    decay: torch.Tensor  # [B, T, H], log space
    beta: torch.Tensor  # [B, T, H]


def rule_inputs(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, decay: torch.Tensor, beta: torch.Tensor
) -> RuleInputs:
    """From the layer's [B, T, heads, dim] tensors: float32, keys and queries normalised per value head."""
    heads = value.shape[-2]
    query = value_head_keys(query, heads) * query.shape[-1] ** -0.5
    return RuleInputs(query, value_head_keys(key, heads), value.float(), decay.float(), beta.float())


def delta_step(
    h: torch.Tensor, key: torch.Tensor, value: torch.Tensor, decay: torch.Tensor, beta: torch.Tensor
) -> torch.Tensor:
    """One token's update of states h [N, H, Dk, Dv] with key [N, H, Dk], value [N, H, Dv], decay/beta [N, H]."""
    h = h * decay.exp()[..., None, None]
    predicted = (h * key[..., None]).sum(dim=-2)  # what the state already recalls for this key
    correction = (value - predicted) * beta[..., None]
    return h + key[..., None] * correction[..., None, :]


def chain_rule(inputs: RuleInputs, initial: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule token by token over a chain: outputs [B, T, H, Dv] and the final state [B, H, Dk, Dv]."""
    h = initial.float()
    out = torch.empty_like(inputs.value)
    for t in range(inputs.key.shape[1]):
        h = delta_step(h, inputs.key[:, t], inputs.value[:, t], inputs.decay[:, t], inputs.beta[:, t])
        out[:, t] = (h * inputs.query[:, t, ..., None]).sum(dim=-2)
    return out, h


def tree_rule(inputs: RuleInputs, paths: torch.Tensor, initial: torch.Tensor) -> torch.Tensor:
    """Every token run from its parent's state: outputs [B, T, H, Dv].

    `paths` [B, T, D]: each token's path from its row's first token (the root, a child of the committed
    state `initial` [B, H, Dk, Dv]) to itself, -1 padded; a token's ancestors sit at lower indices (trees list
    parents first). `chunked_rule`'s UT form with the tree in place of the chain: with G_t the log decay summed
    along t's path, a token's effective write u_t = beta_t (v_t - exp(G_t) h0^T k_t - sum over its ancestors s
    of exp(G_t - G_s) (k_s . k_t) u_s) is a unit lower-triangular system over the tree, and o_t = exp(G_t) h0^T q_t
    + sum over s on its path of exp(G_t - G_s) (q_t . k_s) u_s. A few matrix products instead of one state
    per node: the same values up to float32 rounding (this is the CPU reference: on CUDA `triton_gdn.tree_rule`
    walks each path with the recurrence itself).
    """
    tokens = paths.shape[1]
    on_path = torch.zeros(*paths.shape[:2], tokens + 1, device=paths.device)
    on_path.scatter_(2, torch.where(paths >= 0, paths, tokens), 1.0)  # padding lands in the extra column
    on_path = on_path[..., :tokens]  # [B, t, s]: 1 where s is on t's path (t itself included)
    query, key, value = (t.transpose(1, 2) for t in (inputs.query, inputs.key, inputs.value))  # [B, H, T, D]
    decay, beta = inputs.decay.transpose(1, 2), inputs.beta.transpose(1, 2)  # [B, H, T]
    along = torch.einsum("bts,bhs->bht", on_path, decay)  # G_t
    # exp(G_t - G_s) for s on t's path, 0 elsewhere (masked before exp: off-path differences may be positive)
    between = (
        (along[..., :, None] - along[..., None, :]).masked_fill(on_path[:, None] == 0, float("-inf")).exp()
    )
    system = ((key * beta[..., None]) @ key.transpose(-1, -2)) * between  # its diagonal is taken as 1
    h0 = initial.float()
    from_start = along.exp()[..., None]
    writes = beta[..., None] * (value - from_start * (key @ h0))
    effective = torch.linalg.solve_triangular(system, writes, upper=False, unitriangular=True)
    out = from_start * (query @ h0) + ((query @ key.transpose(-1, -2)) * between) @ effective
    return out.transpose(1, 2)


def replay(
    state: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
    path: torch.Tensor,
    count: torch.Tensor,
) -> None:
    """Advance `state` [B, H, Dk, Dv] in place along the first count[b] tokens of path[b] ([B, P] token
    indices): the state the path's last token had under `tree_rule`. key [B, T, Hk, Dk] and value
    [B, T, H, Dv] as the layer made them (normalised here, as `rule_inputs` does), decay/beta [B, T, H]."""
    inputs = rule_inputs(key, key, value, decay, beta)  # the query only matters for outputs
    rows = torch.arange(state.shape[0], device=state.device)
    h = state
    steps = path.shape[1]
    if not (state.is_cuda and torch.cuda.is_current_stream_capturing()):  # stop after the longest kept path
        steps = min(steps, int(count.max()))
    for j in range(steps):
        node = path[:, j]
        stepped = delta_step(
            h,
            inputs.key[rows, node],
            inputs.value[rows, node],
            inputs.decay[rows, node],
            inputs.beta[rows, node],
        )
        h = torch.where((j < count)[:, None, None, None], stepped, h)
    state.copy_(h)


def chunked_rule(
    inputs: RuleInputs, initial: torch.Tensor, chunk: int = CHUNK_SIZE
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule over a chain, `chunk` tokens per matrix step. Returns outputs [B, T, H, Dv] and the final state.

    Inside a chunk, with c_t the cumulative log decay from the chunk start, the delta rule's writes satisfy
    a unit lower-triangular system (the UT / WY form); solving it gives each token's effective write
    u_t = w_t - W_t h_start, so the chunk's outputs and end state follow from h_start by matrix products.
    """
    tokens = inputs.key.shape[1]
    pad = (chunk - tokens % chunk) % chunk
    # heads first: [B, H, T, ...]
    query, key, value = (
        F.pad(t.transpose(1, 2), (0, 0, 0, pad)) for t in (inputs.query, inputs.key, inputs.value)
    )
    decay, beta = (F.pad(t.transpose(1, 2), (0, pad)) for t in (inputs.decay, inputs.beta))
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
    return out.reshape(batch, heads, padded, -1)[:, :, :tokens].transpose(1, 2), h
