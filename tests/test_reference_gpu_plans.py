"""The reference engine on one CUDA GPU in plans and campaigns, `--budget auto` through them, and random
checkpoints of a named real shape (what the GPU campaign serves)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from specdeploy.campaign.matrix import server_configs
from specdeploy.campaign.spec import parse_campaign
from specdeploy.engine.decode import Decoder, SamplingParams
from specdeploy.engine.loading import load_drafter, load_target
from specdeploy.errors import SpecdeployError
from specdeploy.perf.random_models import random_pair, write_random_checkpoints
from specdeploy.perf.shapes import QWEN3_8B, Shape
from specdeploy.plan.make import make_plan
from specdeploy.recipes.loader import load_recipe
from specdeploy.recipes.schema import HardwareProfile

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_cuda_profile_serves_bf16_on_the_gpu_and_cpu_profile_fp32():
    cuda = make_plan("tiny-code", "cuda", "ddtree", budget=16)
    cpu = make_plan("tiny-code", "cpu", "ddtree", budget=16)
    assert cuda.argv[cuda.argv.index("--device") + 1] == "cuda"
    assert "--device" not in cpu.argv  # serve's default device is the CPU
    disk = load_recipe("tiny-code").target.disk_bytes
    # bf16 checkpoint: held as is on the GPU, as fp32 (twice the bytes) on a CPU
    assert cuda.memory.weights_per_gpu == disk
    assert cpu.memory.weights_per_gpu == 2 * disk


def test_reference_profiles_name_no_gpu_model_and_sglang_profiles_take_no_device():
    with pytest.raises(ValueError, match="gpu_count 1 with device cuda"):
        HardwareProfile(name="x", description="x", engine="reference", device="cuda", gpu_count=0,
                        memory_mib=1024, interconnect="none")  # fmt: skip
    with pytest.raises(ValueError, match="no device"):
        HardwareProfile(name="x", description="x", engine="sglang", device="cuda", gpu_count=1,
                        gpu_model="NVIDIA H200", compute_capability="9.0", memory_mib=1024,
                        interconnect="none")  # fmt: skip


def test_budget_auto_reaches_the_reference_server_and_sglang_refuses_it():
    plan = make_plan("tiny-code", "cuda", "ddtree", budget="auto")
    assert plan.argv[plan.argv.index("--budget") + 1] == "auto"
    assert plan.budget == "auto"
    with pytest.raises(SpecdeployError, match="reference engine's"):
        make_plan("qwen3-8b", "h200-x1", "ddtree", budget="auto")
    with pytest.raises(SpecdeployError, match="takes none"):
        make_plan("tiny-code", "cuda", "dflash", budget="auto")


def test_campaign_sweeps_fixed_and_auto_budgets_as_separate_servers(tmp_path: Path):
    data = {"name": "g", "recipe": "tiny-code", "hardware": "cuda", "modes": ["ar", "ddtree"],
            "ddtree_budgets": [16, "auto"], "concurrency": [1, 4], "datasets": ["random"], "num_prompts": 4}  # fmt: skip
    spec = parse_campaign(data, tmp_path, "test")
    ids = [server.id for server in server_configs(spec)]
    assert ids == ["tp1-ar", "tp1-ddtree-b16", "tp1-ddtree-bauto"]
    with pytest.raises(SpecdeployError, match="ddtree_budgets"):
        parse_campaign({**data, "ddtree_budgets": ["best"]}, tmp_path, "test")


TINY_SHAPE_TARGET = {**QWEN3_8B, "vocab_size": 1024, "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                     "max_position_embeddings": 512, "bos_token_id": 1000, "eos_token_id": 1001}  # fmt: skip


def tiny_shape() -> Shape:
    from specdeploy.engine.drafter_config import new_drafter_config

    drafter = new_drafter_config(
        hidden_size=64, num_target_layers=4, vocab_size=1024, mask_token_id=1023, block_size=8, num_layers=1,
        num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128, max_position_embeddings=512,
        rope_theta=QWEN3_8B["rope_theta"],
    )  # fmt: skip
    return Shape("tiny", "test", "test", TINY_SHAPE_TARGET, drafter)


def test_random_checkpoints_load_back_as_the_same_models(tmp_path: Path):
    shape = tiny_shape()
    target_dir, draft_dir = write_random_checkpoints(
        tmp_path, shape, torch.device("cpu"), torch.float32, seed=3
    )
    expected_target, expected_drafter = random_pair(shape, torch.device("cpu"), torch.float32, seed=3)
    target = load_target(target_dir, "cpu", torch.float32)
    drafter = load_drafter(draft_dir, "cpu", torch.float32)
    for loaded, expected in ((target, expected_target), (drafter, expected_drafter)):
        want, got = expected.state_dict(), loaded.state_dict()
        assert got.keys() == want.keys()
        assert all(torch.equal(got[name], want[name]) for name in want)
    prompt = list(range(5, 25))
    outputs = {
        mode: Decoder(target, drafter if mode != "ar" else None, mode, 4 if mode == "ddtree" else None)
        .generate(prompt, SamplingParams(max_new_tokens=12, ignore_eos=True)).token_ids
        for mode in ("ar", "dflash", "ddtree")
    }  # fmt: skip
    assert outputs["dflash"] == outputs["ar"] == outputs["ddtree"]
    with pytest.raises(SpecdeployError, match="not empty"):
        write_random_checkpoints(tmp_path, shape, torch.device("cpu"), torch.float32)


def test_random_checkpoint_tokenizer_covers_the_whole_vocabulary(tmp_path: Path):
    target_dir, _ = write_random_checkpoints(tmp_path, tiny_shape(), torch.device("cpu"), torch.float32)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(target_dir))
    assert len(tokenizer) == TINY_SHAPE_TARGET["vocab_size"]
    assert tokenizer.eos_token_id == TINY_SHAPE_TARGET["eos_token_id"]
    assert tokenizer.convert_tokens_to_ids("<|mask|>") == 1023
    text = "def f(x):\n    return x  # é"
    ids = tokenizer.encode(text)
    assert ids == list(text.encode())  # bytes keep their ids: nothing encodes to a placeholder
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode([300, 65]) == "<|300|>A"


def test_reference_plans_count_the_static_caches_the_engine_allocates():
    recipe = load_recipe("tiny-code")
    per_token = recipe.target.kv_bytes_per_token + recipe.dflash.kv_bytes_per_token  # bf16 on the GPU
    plan = make_plan("tiny-code", "cuda", "dflash", max_running_requests=64, context_length=1024)
    # BatchEngine reserves every row's whole context at start-up: rows x positions, not what would fit
    assert plan.memory.kv_tokens_fit == 64 * 1024
    assert plan.memory.kv_budget_per_gpu == 64 * 1024 * per_token
    assert plan.memory.full_length_requests == 64
    with pytest.raises(SpecdeployError, match="static caches hold 512 requests x 4096 positions"):
        make_plan(str(EXAMPLES / "recipes/qwen3-8b-random.toml"), "cuda", "dflash", max_running_requests=512,
                  context_length=4096)  # fmt: skip
