"""DeepSeek-V3 (the Kimi K2.x text model): multi-head latent attention (MLA) and a sigmoid-routed MoE.

Layers below `first_k_dense_replace` use a dense SwiGLU MLP; the others route each token to
`num_experts_per_tok` of `n_routed_experts` experts (restricted to the `topk_group` best of `n_group`
groups) and add `n_shared_experts` always-on experts.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specdeploy.engine import ops
from specdeploy.engine.cache import EntryShape, StaticCache
from specdeploy.engine.forward_batch import ForwardBatch
from specdeploy.engine.models.base import TargetConfig, TargetModel
from specdeploy.engine.models.config import config_value, require_silu
from specdeploy.engine.models.layers import DecoderLayer, MergedLinear, RMSNorm, SwiGLU, attend
from specdeploy.engine.models.moe import Experts
from specdeploy.engine.models.rope import RotaryEmbedding, apply_rope, rope_parameters, yarn_mscale
from specdeploy.errors import SpecdeployError


def triton_mla_fits(latent: int, rope: int) -> bool:
    """Widths the MLA query/entry kernel takes: powers of two, the latent at least 16 for its matrix product
    (DeepSeek's and Kimi's 512 and 64)."""
    return latent >= 16 and all(n >= 2 and not n & (n - 1) for n in (latent, rope))


# DeepSeek's reference code and transformers build the q/kv latent norms with the default eps, not rms_norm_eps.
LATENT_NORM_EPS = 1e-6


def softmax_scale(config: dict[str, Any], rope: dict[str, Any], qk_head_dim: int) -> float:
    """1/sqrt(qk_head_dim), times mscale(factor, mscale_all_dim)^2 under YaRN, as transformers does."""
    scale = qk_head_dim**-0.5
    mscale_all_dim = rope.get("mscale_all_dim")
    if rope["rope_type"] != "default" and mscale_all_dim:
        factor = (
            rope.get("factor") or config["max_position_embeddings"] / rope["original_max_position_embeddings"]
        )
        scale *= yarn_mscale(factor, mscale_all_dim) ** 2
    return scale


class MultiLatentAttention(nn.Module):
    """MLA, with the cache holding the compressed latent, not expanded keys and values.

    Per slot the cache keeps [normalised kv latent (kv_lora_rank) | rotated shared rope key
    (qk_rope_head_dim)]: 576 values for Kimi against 64 heads x 320 expanded, which is the layout SGLang's
    MLA backends keep and what makes long contexts fit. Attention then runs in latent space ("weight
    absorption"): kv_b_proj's key half maps each query into the latent, its value half maps the attended
    latent back out, so cached positions are never re-expanded. The two projections of the layer input
    (the query's, and the latent's) run as one matmul.
    """

    def __init__(self, config: dict[str, Any], rope: dict[str, Any], layer_idx: int) -> None:
        super().__init__()
        hidden = config["hidden_size"]
        self.layer_idx = layer_idx
        self.heads = config["num_attention_heads"]
        self.q_lora_rank = config.get("q_lora_rank")  # null means a plain q_proj, so no default here
        self.kv_lora_rank = config["kv_lora_rank"]
        self.nope_dim, self.rope_dim = config["qk_nope_head_dim"], config["qk_rope_head_dim"]
        self.v_dim = config["v_head_dim"]
        self.interleaved = config_value(config, "rope_interleave", True)
        bias = config_value(config, "attention_bias", False)
        qk_head_dim = self.nope_dim + self.rope_dim
        latent = self.kv_lora_rank + self.rope_dim
        if self.q_lora_rank is None:
            # transformers builds q_proj without a bias even when attention_bias is set
            self.input_proj = MergedLinear(
                hidden, {"q_proj": self.heads * qk_head_dim, "kv_a_proj_with_mqa": latent}, bias=False
            )
            self.query_size = self.heads * qk_head_dim
        else:
            self.input_proj = MergedLinear(
                hidden, {"q_a_proj": self.q_lora_rank, "kv_a_proj_with_mqa": latent}, bias=bias
            )
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(self.q_lora_rank, self.heads * qk_head_dim, bias=False)
            self.query_size = self.q_lora_rank
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(self.kv_lora_rank, self.heads * (self.nope_dim + self.v_dim), bias=False)
        self.o_proj = nn.Linear(self.heads * self.v_dim, hidden, bias=bias)
        self.scale = softmax_scale(config, rope, qk_head_dim)

    def cache_entry(self) -> EntryShape:
        return ((1, self.kv_lora_rank + self.rope_dim),)

    @property
    def first_projection(self) -> nn.Linear:
        return self.input_proj

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: StaticCache) -> torch.Tensor:
        return self.after_first_projection(ops.linear(x, self.input_proj), batch, cache)

    def after_first_projection(
        self, projected: torch.Tensor, batch: ForwardBatch, cache: StaticCache
    ) -> torch.Tensor:
        b, tokens, _ = projected.shape
        q, kv = projected.split([self.query_size, self.kv_lora_rank + self.rope_dim], -1)
        if self.q_lora_rank is not None:
            q = ops.linear(self.q_a_layernorm(q), self.q_b_proj)
        q = q.view(b, tokens, self.heads, -1)
        up = self.kv_b_proj.weight.view(self.heads, self.nope_dim + self.v_dim, self.kv_lora_rank)
        key_up, value_up = up[:, : self.nope_dim], up[:, self.nope_dim :]
        if ops.triton_kernels_for(projected) is not None and triton_mla_fits(
            self.kv_lora_rank, self.rope_dim
        ):
            from specdeploy.engine.triton_mla import mla_query_entry

            norm = self.kv_a_layernorm
            query = mla_query_entry(
                q, key_up, kv, norm.weight, norm.eps, *batch.rope, batch.flat_slots,
                cache.flat_entry(self.layer_idx)[0], self.interleaved,
            )  # fmt: skip
        else:
            q_nope, q_rot = q.split([self.nope_dim, self.rope_dim], -1)
            latent, k_rot = kv.split([self.kv_lora_rank, self.rope_dim], -1)
            k_rot = apply_rope(k_rot[:, :, None], batch.rope, self.interleaved)
            entry = torch.cat([self.kv_a_layernorm(latent)[:, :, None], k_rot], dim=-1)
            cache.store(self.layer_idx, batch.flat_slots, entry)
            absorbed = torch.einsum("bthn,hnr->bthr", q_nope, key_up)
            query = torch.cat([absorbed, apply_rope(q_rot, batch.rope, self.interleaved)], dim=-1)
        keys = batch.view(cache.entry(self.layer_idx)[0])
        out = attend(query, keys, keys[..., : self.kv_lora_rank], batch, self.scale, value_up)
        return ops.linear(out, self.o_proj)


class GroupLimitedRouter(nn.Module):
    """Sigmoid scores; the bias-corrected scores pick groups then experts, the raw scores weight them."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        num_experts = config["n_routed_experts"]
        self.top_k = config["num_experts_per_tok"]
        self.n_group = config_value(config, "n_group", 1)  # absent or null: one group, no group limit
        self.topk_group = config_value(config, "topk_group", self.n_group)
        self.norm_topk_prob = config_value(config, "norm_topk_prob", True)
        self.routed_scaling_factor = config_value(config, "routed_scaling_factor", 2.5)
        self.weight = nn.Parameter(torch.empty(num_experts, config["hidden_size"]))
        self.register_buffer("e_score_correction_bias", torch.zeros(num_experts))

    def _one_kernel(self, x: torch.Tensor) -> bool:
        """Whether the routing of x runs as one Triton kernel (no group limit: Kimi's one group)."""
        return ops.triton_kernels_for(x) is not None and self.topk_group >= self.n_group

    def norm_route(
        self, x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(weights, indices, norm(x + residual), x + residual) of x [N, hidden] in one kernel, where the routing
        takes one (`triton_moe.norm_route`) and the norm's weight is in x's dtype; None elsewhere."""
        if not self._one_kernel(x) or norm.weight.dtype != x.dtype:
            return None
        from specdeploy.engine import triton_moe

        if x.shape[0] > triton_moe.ROUTE_TOKENS:
            return None
        args = (self.e_score_correction_bias, self.top_k, self.norm_topk_prob, self.routed_scaling_factor)
        return triton_moe.norm_route(
            x, residual, (norm.weight, norm.eps, norm.zero_centered), self.weight, *args
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, hidden] -> (weights float32 [N, top_k], expert indices [N, top_k])."""
        args = (self.e_score_correction_bias, self.top_k, self.norm_topk_prob, self.routed_scaling_factor)
        one_kernel = self._one_kernel(x)
        if one_kernel:
            from specdeploy.engine import triton_moe

            if x.shape[0] <= triton_moe.ROUTE_TOKENS:
                return triton_moe.route(x, self.weight, *args)
        logits = F.linear(x.float(), self.weight.float())
        if one_kernel:
            return triton_moe.sigmoid_top_k(logits, *args)
        scores = logits.sigmoid()
        choice = scores + self.e_score_correction_bias
        if self.topk_group < self.n_group:  # otherwise every group is allowed (Kimi: one group)
            # A group's score is the sum of its two best experts' scores.
            group_scores = choice.view(x.shape[0], self.n_group, -1).topk(2, dim=-1)[0].sum(dim=-1)
            groups = group_scores.topk(self.topk_group, dim=-1, sorted=False)[1]
            allowed = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)
            allowed = allowed.repeat_interleave(choice.shape[1] // self.n_group, dim=1)
            choice = choice.masked_fill(~allowed, float("-inf"))
        indices = choice.topk(self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, indices)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.routed_scaling_factor, indices


class DeepseekV3MoE(nn.Module):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        hidden, expert_size = config["hidden_size"], config["moe_intermediate_size"]
        self.gate = GroupLimitedRouter(config)
        # One module per expert, so that the checkpoint's experts.N.* names load unchanged.
        self.experts = Experts(config["n_routed_experts"], hidden, expert_size)
        self.shared_experts = SwiGLU(hidden, expert_size * config_value(config, "n_shared_experts", 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, indices = self.gate(flat)
        return self.experts(flat, weights, indices, self.shared_experts).view_as(x)

    def normed_forward(
        self, norm: RMSNorm, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(self(norm(x + residual)), x + residual) with the norm made in the router's kernel
        (`GroupLimitedRouter.norm_route`: one launch fewer); None where that does not run."""
        routed = self.gate.norm_route(x.reshape(-1, x.shape[-1]), residual, norm)
        if routed is None:
            return None
        weights, indices, normed, total = routed
        out = self.experts(normed, weights, indices, self.shared_experts)
        return out.view_as(x), total.view_as(residual)


class DeepseekV3ForCausalLM(TargetModel):
    keep_fp32 = ("mlp.gate.weight", "mlp.gate.e_score_correction_bias")  # routing decisions stay float32

    def __init__(self, config: TargetConfig) -> None:
        super().__init__()
        raw = config.raw
        require_silu(raw)
        scoring = config_value(raw, "scoring_func", "sigmoid")
        if scoring != "sigmoid":
            raise SpecdeployError(
                f"scoring_func {scoring!r} is not supported: DeepSeek-V3 routing is sigmoid"
            )
        rope = rope_parameters(raw)
        eps = config_value(raw, "rms_norm_eps", 1e-6)
        first_moe = config_value(raw, "first_k_dense_replace", 3)
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(
                MultiLatentAttention(raw, rope, i),
                DeepseekV3MoE(raw)
                if i >= first_moe
                else SwiGLU(config.hidden_size, raw["intermediate_size"]),
                config.hidden_size,
                eps,
            )
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(rope, raw["qk_rope_head_dim"], config.max_position_embeddings)
