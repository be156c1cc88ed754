"""What each zoo pair is: its target architecture (a transformers config), drafter shape and block size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from specdeploy.engine.drafter_config import new_drafter_config
from specdeploy.errors import SpecdeployError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

VOCAB_SIZE = 2048
MAX_POSITIONS = 2048


@dataclass(frozen=True)
class PairSpec:
    name: str
    family: str  # the target's transformers model_type
    description: str
    # The target's width and depth (heads and the family's extras follow in `target_config`).
    hidden_size: int
    num_layers: int
    intermediate_size: int
    block_size: int
    draft_layers: int
    draft_heads: int
    draft_kv_heads: int
    draft_head_dim: int
    draft_intermediate: int
    # Loss weight of block slot i (1-based) is exp(-(i - 1) / loss_gamma): early slots decide acceptance.
    loss_gamma: float
    engine_support: str  # what the reference engine can do with this target


PAIRS: dict[str, PairSpec] = {
    spec.name: spec
    for spec in (
        PairSpec(
            name="tiny-code",
            family="qwen3",
            description="Qwen3 dense target on Python code",
            # Sized for a 2-core CPU (benchmarks/zoo_sizes.py): deep and narrow keeps a speculative step near
            # 2.3x an AR step at DDTree budget 16, and a 2-layer drafter costs about one AR step less than 3.
            hidden_size=256,
            num_layers=8,
            intermediate_size=768,
            block_size=16,
            draft_layers=2,
            draft_heads=5,
            draft_kv_heads=1,
            draft_head_dim=64,
            draft_intermediate=640,
            loss_gamma=7.0,
            engine_support="ar, dflash and ddtree",
        ),
        PairSpec(
            name="tiny-mla",
            family="deepseek_v3",
            description="DeepSeek-V3 style target (MLA + MoE), a Kimi in miniature",
            hidden_size=256,
            num_layers=6,
            intermediate_size=768,
            block_size=8,
            draft_layers=2,
            draft_heads=4,
            draft_kv_heads=1,
            draft_head_dim=64,
            draft_intermediate=512,
            loss_gamma=4.0,
            engine_support="ar, dflash and ddtree",
        ),
        PairSpec(
            name="tiny-hybrid",
            family="qwen3_next",
            description="Qwen3-Next style hybrid target (full attention + Gated DeltaNet)",
            hidden_size=256,
            num_layers=6,
            intermediate_size=768,
            block_size=16,
            draft_layers=2,
            draft_heads=4,
            draft_kv_heads=1,
            draft_head_dim=64,
            draft_intermediate=512,
            loss_gamma=7.0,
            engine_support="ar, dflash and ddtree (exact per-node recurrent state under tree verification)",
        ),
    )
}


def pair_spec(name: str) -> PairSpec:
    if name not in PAIRS:
        raise SpecdeployError(f"unknown zoo pair {name!r}; choose one of: {', '.join(PAIRS)}")
    return PAIRS[name]


def target_config(spec: PairSpec, eos_token_id: int, scale: float = 1.0) -> PretrainedConfig:
    """The target's transformers config; `scale` < 1 shrinks widths and depth for quick CPU runs."""
    # Imported here: transformers pulls in torch, which `specdeploy --help` must not pay for.
    from transformers import DeepseekV3Config, Qwen3Config, Qwen3NextConfig

    def width(n: int, multiple: int = 32) -> int:
        return max(multiple, int(n * scale) // multiple * multiple)

    full_size = scale >= 1
    hidden, intermediate = width(spec.hidden_size, 64), width(spec.intermediate_size)
    common = dict(
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    if spec.family == "qwen3":
        return Qwen3Config(
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_hidden_layers=spec.num_layers if full_size else 4,
            num_attention_heads=hidden // 64,
            num_key_value_heads=1,
            head_dim=64,
            **common,
        )
    if spec.family == "deepseek_v3":
        return DeepseekV3Config(
            hidden_size=hidden,
            intermediate_size=intermediate,
            moe_intermediate_size=width(160),
            num_hidden_layers=spec.num_layers if full_size else 4,
            num_attention_heads=4,
            num_key_value_heads=4,
            first_k_dense_replace=1,  # like Kimi: the first layer dense, the rest MoE
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=1,
            n_group=1,
            topk_group=1,
            routed_scaling_factor=1.0,
            q_lora_rank=128,
            kv_lora_rank=64,
            qk_rope_head_dim=32,
            qk_nope_head_dim=32,
            v_head_dim=32,
            **common,
        )
    if spec.family == "qwen3_next":
        # At least one full-attention layer (the cache needs one).
        num_layers = spec.num_layers if full_size else 3
        return Qwen3NextConfig(
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_hidden_layers=num_layers,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=64,
            # Two Gated DeltaNet layers, then one full-attention layer (Qwen3-Next uses 3:1; 2:1 fits six layers).
            layer_types=[
                "full_attention" if (i + 1) % 3 == 0 else "linear_attention" for i in range(num_layers)
            ],
            linear_num_key_heads=4,
            linear_num_value_heads=4,
            linear_key_head_dim=64,
            linear_value_head_dim=64,
            mlp_only_layers=list(range(num_layers)),  # dense MLPs: the hybrid is about GDN, not MoE
            **common,
        )
    raise SpecdeployError(f"pair {spec.name!r} has unknown family {spec.family!r}")


def drafter_config(
    spec: PairSpec, target_cfg: PretrainedConfig, mask_token_id: int, scale: float = 1.0
) -> dict:
    """The drafter's config.json (z-lab's layout) for a target built by `target_config`."""
    return new_drafter_config(
        hidden_size=target_cfg.hidden_size,
        num_target_layers=target_cfg.num_hidden_layers,
        vocab_size=target_cfg.vocab_size,
        mask_token_id=mask_token_id,
        block_size=spec.block_size,
        num_layers=spec.draft_layers if scale >= 1 else 1,
        num_heads=spec.draft_heads,
        num_kv_heads=spec.draft_kv_heads,
        head_dim=spec.draft_head_dim,
        intermediate_size=max(64, int(spec.draft_intermediate * scale)),
        max_position_embeddings=MAX_POSITIONS,
        rope_theta=10000.0,
    )
