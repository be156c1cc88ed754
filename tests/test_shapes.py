"""The named random shapes: Qwen3.6-27B's against its published numbers, `tiny` copies, and the help texts."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.engine.decode import Decoder, SamplingParams
from specdeploy.engine.loading import load_target, resolve_family, target_config
from specdeploy.engine.models.gated_deltanet import Qwen3_5GatedDeltaNet
from specdeploy.engine.models.qwen3_next import GatedAttention, Qwen3_5ForCausalLM
from specdeploy.perf.random_models import random_pair, write_random_checkpoints
from specdeploy.perf.shapes import SHAPES, get_shape, tiny

# Qwen/Qwen3.6-27B model card, "Model Overview" (also on Qwen/Qwen3.5-27B's card): 27B parameters, hidden 5120,
# 64 layers, "Hidden Layout: 16 x (3 x (Gated DeltaNet -> FFN) -> 1 x (Gated Attention -> FFN))"; Gated
# DeltaNet: 48 linear attention heads for V and 16 for QK, head dim 128; Gated Attention: 24 heads for Q and 4
# for KV, head dim 256, rotary position embedding dim 64; FFN intermediate 17408; token embedding and LM output
# 248320 (padded). Its config.json (Qwen3.5-27B's text_config): linear_conv_kernel_dim 4, rope_theta 1e7.
PUBLISHED = {
    "hidden": 5120,
    "groups": 16,  # repeats of the layout
    "linear_per_group": 3,
    "attention_per_group": 1,
    "v_heads": 48,
    "qk_heads": 16,
    "linear_head_dim": 128,
    "q_heads": 24,
    "kv_heads": 4,
    "attention_head_dim": 256,
    "rotary_dim": 64,
    "ffn": 17408,
    "vocab": 248320,
    "conv_kernel": 4,
    "rope_theta": 1e7,
    "parameters": 27e9,
}
SHAPE = get_shape("qwen3.6-27b")


def build_on_meta(config: dict) -> torch.nn.Module:
    family, text, _ = resolve_family(config)
    with torch.device("meta"):
        return family(target_config(config, text, None))


def published_pattern() -> list[type]:
    group = [Qwen3_5GatedDeltaNet] * PUBLISHED["linear_per_group"] + [GatedAttention] * PUBLISHED[
        "attention_per_group"
    ]
    return group * PUBLISHED["groups"]


@pytest.fixture(scope="module")
def full() -> torch.nn.Module:
    return build_on_meta(SHAPE.target)  # 27B parameters on the meta device: shapes only, no memory


def test_qwen36_full_shape_has_the_published_layout_and_dims(full) -> None:
    assert isinstance(full, Qwen3_5ForCausalLM)
    assert [type(layer.mixer) for layer in full.layers] == published_pattern()
    linear, attention = full.layers[0].mixer, full.layers[3].mixer
    assert (linear.k_heads, linear.v_heads) == (PUBLISHED["qk_heads"], PUBLISHED["v_heads"])
    assert linear.k_dim == linear.v_dim == PUBLISHED["linear_head_dim"]
    assert linear.conv1d.weight.shape[-1] == PUBLISHED["conv_kernel"]
    assert (attention.heads, attention.kv_heads) == (PUBLISHED["q_heads"], PUBLISHED["kv_heads"])
    assert attention.head_dim == PUBLISHED["attention_head_dim"]
    # q_proj yields the query and its output gate: twice the query width, then K and V
    width = (2 * PUBLISHED["q_heads"] + 2 * PUBLISHED["kv_heads"]) * PUBLISHED["attention_head_dim"]
    assert attention.qkv_proj.weight.shape == (width, PUBLISHED["hidden"])
    assert 2 * full.rotary.inv_freq.numel() == PUBLISHED["rotary_dim"]
    assert full.layers[0].mlp.down_proj.weight.shape == (PUBLISHED["hidden"], PUBLISHED["ffn"])
    assert full.lm_head.weight.shape == (PUBLISHED["vocab"], PUBLISHED["hidden"])
    assert full.embed_tokens.weight.shape == (PUBLISHED["vocab"], PUBLISHED["hidden"])
    assert SHAPE.target["rope_parameters"]["rope_theta"] == PUBLISHED["rope_theta"]
    # the text model alone; the published 27B also counts the vision encoder and the MTP layer
    parameters = sum(p.numel() for p in full.parameters())
    assert 0.97 * PUBLISHED["parameters"] < parameters < PUBLISHED["parameters"]


def test_qwen36_drafter_reads_the_full_target() -> None:
    assert SHAPE.drafter["num_target_layers"] == PUBLISHED["groups"] * 4
    assert SHAPE.drafter["hidden_size"] == PUBLISHED["hidden"]
    assert SHAPE.drafter["vocab_size"] == PUBLISHED["vocab"]
    assert SHAPE.drafter["block_size"] == 16  # DOMAIN.md: DDTree budget 15 = DFlash block size - 1 there
    assert max(SHAPE.drafter["dflash_config"]["target_layer_ids"]) < PUBLISHED["groups"] * 4


@pytest.mark.parametrize("name", list(SHAPES))
def test_tiny_copies_keep_each_layers_kind(name: str) -> None:
    shape = SHAPES[name]
    small = tiny(shape)
    kinds = [type(layer.mixer) for layer in build_on_meta(shape.target).layers]
    assert [type(layer.mixer) for layer in build_on_meta(small.target).layers] == kinds
    assert small.target["hidden_size"] < shape.target["hidden_size"]
    assert small.drafter["block_size"] == shape.drafter["block_size"]
    assert small.drafter["num_hidden_layers"] == shape.drafter["num_hidden_layers"]


def test_tiny_qwen36_builds_and_ddtree_decodes_as_ar() -> None:
    target, drafter = random_pair(tiny(SHAPE), torch.device("cpu"), torch.float32)
    assert [type(layer.mixer) for layer in target.layers] == published_pattern()
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    prompt = [5, 9, 2, 40, 7, 11]
    ar = Decoder(target, None, "ar", None).generate(prompt, params).token_ids
    assert Decoder(target, drafter, "ddtree", 8).generate(prompt, params).token_ids == ar


def test_random_weights_of_the_tiny_qwen36_load_back(tmp_path) -> None:
    target_dir, _ = write_random_checkpoints(tmp_path, tiny(SHAPE), torch.device("cpu"), torch.float32)
    assert [type(layer.mixer) for layer in load_target(target_dir).layers] == published_pattern()


def bf16_gigabytes(shape_name: str) -> float:
    """The shape's target and drafter weights in bf16 (GB), counted on the meta device."""
    from specdeploy.engine.drafter import DFlashDrafter

    shape = SHAPES[shape_name]
    with torch.device("meta"):
        drafter = DFlashDrafter(shape.drafter)
    models = (build_on_meta(shape.target), drafter)
    return sum(2 * t.numel() for m in models for t in [*m.parameters(), *m.buffers()]) / 1e9


def test_kimi_shapes_are_as_large_as_their_card_holds() -> None:
    # one H200: 141 GB (143,771 MiB as nvidia-smi reports it); one H100: 80 GB (81,559 MiB), of which the CUDA
    # context, caches and a step's activations need some; Kimi's MoE layer of 384 experts is 33.8 GB
    moe_layer = 384 * 3 * 7168 * 2048 * 2 / 1e9
    h200, h100 = 143771 * 2**20 / 1e9, 81559 * 2**20 / 1e9
    assert bf16_gigabytes("kimi-like") < h200 - 20 < bf16_gigabytes("kimi-like") + moe_layer
    assert bf16_gigabytes("kimi-like-h100") < h100 - 20 < bf16_gigabytes("kimi-like-h100") + moe_layer
    layers = build_on_meta(SHAPES["kimi-like-h100"].target).layers
    assert [type(layer.mlp).__name__ for layer in layers] == ["SwiGLU", "DeepseekV3MoE"]


def fused_weights(shape_name: str) -> dict[str, bool]:
    """Each one-row fusion's weight in a shape's bf16 target (meta device) -> whether the fusions take it."""
    from specdeploy.engine.triton_gemv import fuses_row

    taken = {}
    for name, module in build_on_meta(SHAPES[shape_name].target).named_modules():
        first = getattr(module, "first_projection", None)
        if isinstance(first, torch.nn.Linear):
            taken[f"{name}.first"] = fuses_row(first.weight.to(torch.bfloat16))
        if hasattr(module, "after_first_projection") and hasattr(module, "down_proj"):
            taken[f"{name}.down"] = fuses_row(module.down_proj.weight.to(torch.bfloat16))
    return taken


def test_the_one_row_fusions_take_the_weights_they_sped_up_and_not_those_they_slowed() -> None:
    # on one H100 (benchmarks/results/gpu-2026-12-06-walk-fusions/) the fusions sped mla-moe-16b's AR step (its MLA
    # first projections) and slowed Qwen3.6-27B's (every first projection and down projection there is large)
    mla = [taken for name, taken in fused_weights("mla-moe-16b").items() if name.endswith("self_attn.first")]
    assert len(mla) == SHAPES["mla-moe-16b"].target["num_hidden_layers"] and all(mla)
    qwen = fused_weights("qwen3.6-27b")  # 64 MLPs' gate|up and down, 16 gated attentions' q|k|v
    assert len(qwen) == 64 + 64 + 16 and not any(qwen.values())


@pytest.mark.parametrize("command", [["profile", "--help"], ["random-weights", "--help"]])
def test_help_lists_every_shape(command: list[str]) -> None:
    shown = " ".join(CliRunner().invoke(app, command, terminal_width=200).output.split())
    for name in SHAPES:
        assert name in shown
