"""The DFlash drafter against the dflash 0.1.0 package (the oracle), on tiny random fp32 drafters."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from dflash.model import DFlashDraftModel, _crop_to, _make_cache
from dflash.model import build_target_layer_ids as dflash_layer_ids

from specdeploy.engine.drafter import DFlashDrafter
from specdeploy.engine.drafter_config import build_target_layer_ids
from specdeploy.engine.loading import load_drafter, save_drafter
from specdeploy.engine.single_pass import draft_pass
from specdeploy.errors import SpecdeployError

HIDDEN, VOCAB, BLOCK = 32, 64, 8
LAYER_IDS = [1, 3]


def tiny_config(**overrides) -> dict:
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": HIDDEN,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "intermediate_size": 48,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 512,
        "rope_theta": 10000.0,
        "num_target_layers": 6,
        "block_size": BLOCK,
        "vocab_size": VOCAB,
        "dflash_config": {"target_layer_ids": LAYER_IDS, "mask_token_id": VOCAB - 1},
    }
    config.update(overrides)
    return config


VARIANTS = {
    "qwen3": tiny_config(),
    # Window 5 is shorter than the context, so it really cuts keys off.
    "sliding": tiny_config(
        layer_types=["sliding_attention", "full_attention"], use_sliding_window=True, sliding_window=5
    ),
    "yarn_without_mscale": tiny_config(
        rope_scaling={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64}
    ),
    "logit_scaling": tiny_config(
        dflash_config={
            "target_layer_ids": LAYER_IDS,
            "mask_token_id": VOCAB - 1,
            "output_multiplier": 0.5,
            "final_logit_softcapping": 3.0,
        }
    ),
}


def random_drafter(config: dict, seed: int = 0) -> DFlashDrafter:
    torch.manual_seed(seed)
    drafter = DFlashDrafter(config)
    with torch.no_grad():
        for param in drafter.parameters():  # norms too, so that a swapped norm cannot go unnoticed
            param.normal_(0.0, 0.3)
    return drafter.eval()


def oracle_from(drafter: DFlashDrafter, tmp_path: Path) -> DFlashDraftModel:
    save_drafter(drafter, tmp_path / "ours")
    return DFlashDraftModel.from_pretrained(str(tmp_path / "ours"), dtype=torch.float32).eval()


# (new context positions C, cache length to crop both caches to before the step, or None)
STEPS = [(7, None), (3, None), (2, 8), (0, None)]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@torch.no_grad()
def test_matches_dflash_step_by_step(variant: str, tmp_path: Path) -> None:
    drafter = random_drafter(VARIANTS[variant])
    oracle = oracle_from(drafter, tmp_path)
    lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    batch, start = 2, 0
    ours, theirs = drafter.new_cache(batch), _make_cache(oracle.config)
    for ctx_len, crop_to in STEPS:
        if crop_to is not None:  # ours: the next pass writes after `crop_to` committed slots
            _crop_to(theirs, crop_to)
            start = crop_to
        context = torch.randn(batch, ctx_len, len(LAYER_IDS) * HIDDEN)
        noise = torch.randn(batch, BLOCK, HIDDEN)
        start += ctx_len
        positions = torch.arange(start - ctx_len, start + BLOCK)[None].expand(batch, -1)
        expected = oracle(
            position_ids=positions,
            noise_embedding=noise,
            target_hidden=context,
            past_key_values=theirs,
            use_cache=True,
        )
        _crop_to(theirs, start)  # dflash_generate drops the block's keys after every draft
        hidden = draft_pass(drafter, noise, context, positions, ours, cached=start - ctx_len)
        torch.testing.assert_close(hidden, expected, atol=1e-4, rtol=0)
        torch.testing.assert_close(
            drafter.compute_logits(hidden, lm_head),
            oracle.compute_logits(expected, lm_head).float(),
            atol=1e-4,
            rtol=0,
        )


@torch.no_grad()
def test_loads_checkpoints_written_by_dflash(tmp_path: Path) -> None:
    from transformers import Qwen3Config

    config = VARIANTS["yarn_without_mscale"]
    torch.manual_seed(1)
    oracle = DFlashDraftModel(Qwen3Config(**config)).eval()
    with torch.no_grad():
        for param in oracle.parameters():
            param.normal_(0.0, 0.3)
    oracle.save_pretrained(str(tmp_path))
    drafter = load_drafter(tmp_path)
    assert not any(p.requires_grad for p in drafter.parameters())  # frozen for inference, as targets are
    assert drafter.rotary.attention_scaling == pytest.approx(oracle.rotary_emb.attention_scaling)
    torch.testing.assert_close(drafter.rotary.inv_freq, oracle.rotary_emb.inv_freq)
    context, noise = torch.randn(1, 5, 2 * HIDDEN), torch.randn(1, BLOCK, HIDDEN)
    positions = torch.arange(5 + BLOCK)[None]
    expected = oracle(position_ids=positions, noise_embedding=noise, target_hidden=context)
    torch.testing.assert_close(draft_pass(drafter, noise, context, positions), expected, atol=1e-4, rtol=0)


def training_mask(context_len: int, starts: list[int]) -> torch.Tensor:
    """Block j (anchored at position starts[j]) sees the context before starts[j] and its own block."""
    keys = context_len + len(starts) * BLOCK
    mask = torch.zeros(len(starts) * BLOCK, keys, dtype=torch.bool)
    for j, start in enumerate(starts):
        rows = slice(j * BLOCK, (j + 1) * BLOCK)
        mask[rows, :start] = True
        mask[rows, context_len + j * BLOCK : context_len + (j + 1) * BLOCK] = True
    return mask[None]


@pytest.mark.parametrize("variant", ["qwen3", "sliding"])
@torch.no_grad()
def test_training_mask_reproduces_inference_per_block(variant: str) -> None:
    drafter = random_drafter(VARIANTS[variant])
    context_len, starts = 12, [3, 7, 12]
    context = torch.randn(1, context_len, len(LAYER_IDS) * HIDDEN)
    noise = torch.randn(1, len(starts) * BLOCK, HIDDEN)
    block_positions = [torch.arange(start, start + BLOCK) for start in starts]
    positions = torch.cat([torch.arange(context_len), *block_positions])[None]
    trained = draft_pass(drafter, noise, context, positions, mask=training_mask(context_len, starts))
    for j, start in enumerate(starts):
        block = slice(j * BLOCK, (j + 1) * BLOCK)
        alone = draft_pass(drafter, noise[:, block], context[:, :start], torch.arange(start + BLOCK)[None])
        torch.testing.assert_close(trained[:, block], alone, atol=1e-5, rtol=0)


@torch.no_grad()
def test_all_visible_mask_equals_default_with_cache() -> None:
    drafter = random_drafter(VARIANTS["sliding"])
    cache = drafter.new_cache()
    draft_pass(
        drafter,
        torch.randn(1, BLOCK, HIDDEN),
        torch.randn(1, 6, 2 * HIDDEN),
        torch.arange(6 + BLOCK)[None],
        cache,
    )
    noise, context = torch.randn(1, BLOCK, HIDDEN), torch.randn(1, 2, 2 * HIDDEN)
    positions = torch.arange(4, 8 + BLOCK)[None][:, 2:]
    default = draft_pass(drafter, noise, context, positions, cache, cached=6)
    everything = torch.ones(1, BLOCK, 8 + BLOCK, dtype=torch.bool)
    torch.testing.assert_close(draft_pass(drafter, noise, context, positions, cache, 6, everything), default)


def test_kimi_drafter_uses_legacy_yarn_attention_factor() -> None:
    kimi_rope = {
        "type": "yarn",
        "factor": 64.0,
        "original_max_position_embeddings": 4096,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    }
    config = tiny_config(rope_theta=50000.0, max_position_embeddings=262144, rope_scaling=kimi_rope)
    drafter = DFlashDrafter(config)
    assert drafter.rotary.attention_scaling == pytest.approx(0.1 * math.log(64) + 1)
    assert drafter.rotary.attention_scaling == pytest.approx(1.4159, abs=1e-4)
    # Modern code reads mscale = mscale_all_dim and computes 1.0: the pitfall the default avoids.
    from transformers import Qwen3Config

    oracle = DFlashDraftModel(Qwen3Config(**config))
    assert oracle.rotary_emb.attention_scaling == pytest.approx(1.0)
    torch.testing.assert_close(drafter.rotary.inv_freq, oracle.rotary_emb.inv_freq)
    explicit = tiny_config(rope_theta=50000.0, rope_scaling={**kimi_rope, "attention_factor": 1.0})
    assert DFlashDrafter(explicit).rotary.attention_scaling == 1.0


@pytest.mark.parametrize(("target_layers", "draft_layers"), [(36, 5), (61, 6), (6, 2), (28, 1), (4, 3)])
def test_build_target_layer_ids_matches_dflash(target_layers: int, draft_layers: int) -> None:
    assert build_target_layer_ids(target_layers, draft_layers) == dflash_layer_ids(
        target_layers, draft_layers
    )


@pytest.mark.parametrize("target_layers", range(1, 9))
@pytest.mark.parametrize("draft_layers", range(1, 7))
def test_default_layer_ids_are_layers_of_the_target(target_layers: int, draft_layers: int) -> None:
    ids = build_target_layer_ids(target_layers, draft_layers)
    assert len(ids) == draft_layers and all(0 <= i < target_layers for i in ids), ids


def test_published_default_layer_ids() -> None:
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert build_target_layer_ids(61, 6) == [1, 12, 24, 35, 47, 58]
    drafter = DFlashDrafter(tiny_config(dflash_config={"mask_token_id": 5}))
    assert drafter.target_layer_ids == [1, 3]  # from num_target_layers 6 and 2 draft layers


def target(hidden_size: int = HIDDEN, layers: int = 6, vocab: int = VOCAB) -> SimpleNamespace:
    return SimpleNamespace(hidden_size=hidden_size, num_hidden_layers=layers, vocab_size=vocab)


def test_check_compatible_accepts_its_target_and_names_mismatches() -> None:
    drafter = DFlashDrafter(tiny_config())
    drafter.check_compatible(target())
    with pytest.raises(SpecdeployError, match="hidden size 32 differs from the target's 64"):
        drafter.check_compatible(target(hidden_size=64))
    with pytest.raises(SpecdeployError, match="6 layers, this one has 3.*target_layer_ids \\[3\\]"):
        drafter.check_compatible(target(layers=3))
    with pytest.raises(SpecdeployError, match="mask_token_id 63 is outside the target's vocabulary of 50"):
        drafter.check_compatible(target(vocab=50))


def test_round_trip_keeps_weights_and_config(tmp_path: Path) -> None:
    drafter = random_drafter(VARIANTS["logit_scaling"])
    save_drafter(drafter, tmp_path)
    loaded = load_drafter(tmp_path)
    assert loaded.config["dflash_config"] == drafter.config["dflash_config"]
    assert (loaded.block_size, loaded.mask_token_id, loaded.output_multiplier) == (BLOCK, VOCAB - 1, 0.5)
    for name, tensor in drafter.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, atol=0, rtol=0)
    assert load_drafter(tmp_path, dtype=torch.bfloat16).fc.weight.dtype == torch.bfloat16


def test_load_errors_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(SpecdeployError, match="is not a directory"):
        load_drafter(tmp_path / "absent")
    with pytest.raises(SpecdeployError, match="config.json is missing"):
        load_drafter(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(tiny_config(architectures=["Qwen3ForCausalLM"])))
    with pytest.raises(SpecdeployError, match="not \\['DFlashDraftModel'\\]"):
        load_drafter(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(tiny_config()))
    with pytest.raises(SpecdeployError, match="no weights in"):
        load_drafter(tmp_path)
    save_drafter(DFlashDrafter(tiny_config()), tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(tiny_config(num_hidden_layers=3)))
    with pytest.raises(SpecdeployError, match="lack 1[0-9] tensors the config implies, e.g. layers.2"):
        load_drafter(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(tiny_config(intermediate_size=40)))
    with pytest.raises(
        SpecdeployError, match="mlp.* has shape \\[.*48.*\\] but config.json implies \\[.*40.*\\]"
    ):
        load_drafter(tmp_path)


def test_bad_inputs_raise_clear_errors() -> None:
    drafter = DFlashDrafter(tiny_config())
    noise, context = torch.randn(1, BLOCK, HIDDEN), torch.randn(1, 2, 2 * HIDDEN)
    with pytest.raises(SpecdeployError, match="expected C\\+L=10"):
        draft_pass(drafter, noise, context, torch.arange(BLOCK)[None])
    with pytest.raises(SpecdeployError, match="context features of width 64, got 32 and 32"):
        draft_pass(drafter, noise, context[..., :HIDDEN], torch.arange(2 + BLOCK)[None])
    with pytest.raises(SpecdeployError, match="mask must be"):
        draft_pass(
            drafter,
            noise,
            context,
            torch.arange(2 + BLOCK)[None],
            mask=torch.ones(1, BLOCK, 3, dtype=torch.bool),
        )
    with pytest.raises(SpecdeployError, match="this pass needs 1 rows of 16"):  # past the cache's last slot
        draft_pass(
            drafter, noise, context, torch.arange(6, 6 + 2 + BLOCK)[None], drafter.new_cache(1, 16), cached=6
        )
    with pytest.raises(SpecdeployError, match="no dflash_config.mask_token_id"):
        DFlashDrafter(tiny_config(dflash_config={"target_layer_ids": LAYER_IDS}))
    with pytest.raises(SpecdeployError, match="RoPE type 'longrope' is not supported"):
        DFlashDrafter(tiny_config(rope_scaling={"rope_type": "longrope", "factor": 2.0}))
