"""Tiny random target + drafter pairs built in a temporary directory, for the decoding tests, and the exact
three-token distribution and chi-square test that check sampling against it."""

from __future__ import annotations

from pathlib import Path

import torch
from scipy.stats import chisquare
from transformers import DeepseekV3Config, Qwen3Config, Qwen3MoeConfig, Qwen3NextConfig

from specdeploy.engine.decode import SamplingParams
from specdeploy.engine.drafter import DFlashDrafter
from specdeploy.engine.loading import save_drafter
from specdeploy.engine.sampling import sampling_probs
from specdeploy.engine.single_pass import target_pass

HIDDEN = 32


def target_config(family: str, vocab: int, layers: int = 4):
    common = dict(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=vocab - 2,
        bos_token_id=0,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    if family == "qwen3":
        return Qwen3Config(**common, intermediate_size=64, head_dim=8)
    if family == "qwen3_moe":
        return Qwen3MoeConfig(
            **common,
            intermediate_size=64,
            moe_intermediate_size=16,
            num_experts=4,
            num_experts_per_tok=2,
            head_dim=8,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    if family in ("deepseek_v3", "kimi"):
        common["num_key_value_heads"] = common["num_attention_heads"]  # MLA: every head has its own K/V
        groups = 1 if family == "kimi" else 2  # Kimi K2 routes among all its experts: one group
        return DeepseekV3Config(
            **common,
            intermediate_size=64,
            moe_intermediate_size=16,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=groups,
            topk_group=1,
            n_shared_experts=1,
            first_k_dense_replace=1,
            q_lora_rank=16,
            # a latent head of 32 + 16 runs the Triton MLA kernels (16 + 4 never reached the Triton attention);
            # the nope and value widths of 8 take their padded paths
            kv_lora_rank=32,
            qk_nope_head_dim=8,
            qk_rope_head_dim=16,
            v_head_dim=8,
        )
    if family == "qwen3_next":  # hybrid: Gated DeltaNet layers around one full-attention layer, dense MLPs
        return Qwen3NextConfig(
            **common,
            intermediate_size=64,
            head_dim=8,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
            layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"][
                :layers
            ],
            mlp_only_layers=list(range(layers)),
        )
    raise ValueError(family)


def drafter_config(vocab: int, block_size: int, target_layers: int = 4) -> dict:
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": HIDDEN,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "intermediate_size": 64,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 512,
        "rope_theta": 10000.0,
        "num_target_layers": target_layers,
        "block_size": block_size,
        "vocab_size": vocab,
        "dflash_config": {"target_layer_ids": [0, 2], "mask_token_id": vocab - 1},
    }


def write_pair(
    root: Path, family: str, vocab: int = 64, block_size: int = 8, seed: int = 0, logit_scale: float = 1.0
) -> tuple[Path, Path]:
    """Save a random target (with transformers) and a random drafter (z-lab format) under root."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(target_config(family, vocab))
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)  # sharper targets make sampling tests see more structure
    target_dir, draft_dir = root / f"{family}-target", root / f"{family}-draft"
    model.save_pretrained(target_dir)
    drafter = DFlashDrafter(drafter_config(vocab, block_size))
    with torch.no_grad():
        for p in drafter.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    save_drafter(drafter, draft_dir)
    return target_dir, draft_dir


def exact_three_token_distribution(target, prompt, params):
    """P(t1, t2, t3 | prompt) from the target alone, over every sequence of the (tiny) vocabulary."""
    vocab, device = target.config.vocab_size, target.embed_tokens.weight.device

    def probs(prefix):
        ids, positions = torch.tensor([prefix], device=device), torch.arange(len(prefix), device=device)[None]
        logits = target_pass(target, ids, positions)[0][0, -1]
        return sampling_probs(logits, params)

    table = {}
    with torch.inference_mode():
        p1 = probs(prompt)
        for t1 in torch.nonzero(p1).flatten().tolist():
            p2 = probs(prompt + [t1])
            for t2 in torch.nonzero(p2).flatten().tolist():
                p3 = probs(prompt + [t1, t2])
                for t3 in torch.nonzero(p3).flatten().tolist():
                    table[(t1, t2, t3)] = float(p1[t1] * p2[t2] * p3[t3])
    assert abs(sum(table.values()) - 1) < 1e-4 and len(table) <= vocab**3
    return table


def with_seed(params: SamplingParams, seed: int) -> SamplingParams:
    return SamplingParams(**{**params.__dict__, "seed": seed})


def sample_counts(decoder, prompt, params, runs):
    counts = {}
    for seed in range(runs):
        tokens = tuple(decoder.generate(prompt, with_seed(params, seed)).token_ids)
        counts[tokens] = counts.get(tokens, 0) + 1
    return counts


def chi_square_p(counts, table, runs):
    """Goodness of fit, with cells of small expectation pooled so the chi-square approximation holds."""
    assert set(counts) <= set(table), "sampled a sequence the target gives zero probability"
    observed, expected, pool_o, pool_e = [], [], 0, 0.0
    for key, p in table.items():
        if p * runs >= 5:
            observed.append(counts.get(key, 0))
            expected.append(p * runs)
        else:
            pool_o, pool_e = pool_o + counts.get(key, 0), pool_e + p * runs
    if pool_e > 0:
        observed.append(pool_o)
        expected.append(pool_e)
    total = sum(expected)
    return chisquare(observed, [e * runs / total for e in expected]).pvalue


# the chi-square tests of lossless sampling: samples per test, and the sampling parameters they draw with
RUNS = 1000
SAMPLING = [
    SamplingParams(temperature=1.0, max_new_tokens=3, ignore_eos=True),
    SamplingParams(temperature=0.7, top_k=3, top_p=0.9, max_new_tokens=3, ignore_eos=True),
]


def assert_sampling_is_lossless(decoder, target, prompt: list[int], params: SamplingParams) -> None:
    """RUNS seeded samples of `decoder` pass the chi-square test against `target`'s exact three-token distribution,
    and the draft really was used: some steps committed more than the bonus token."""
    counts = sample_counts(decoder, prompt, params, RUNS)
    table = exact_three_token_distribution(target, prompt, params)
    assert chi_square_p(counts, table, RUNS) > 1e-3
    seeds = (with_seed(params, seed) for seed in range(20))
    assert any(n > 1 for seeded in seeds for n in decoder.generate(prompt, seeded).accept_lengths)
