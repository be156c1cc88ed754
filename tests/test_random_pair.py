"""Random tiny pairs: the tokenizer, the target and the drafter load with their ordinary loaders and fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.engine.loading import load_drafter
from specdeploy.engine.single_pass import draft_pass
from specdeploy.errors import SpecdeployError
from specdeploy.zoo.byte_tokenizer import EOS_TOKEN_ID, MASK_TOKEN_ID
from specdeploy.zoo.random_pair import FAMILIES, write_random_pair

TEXT = "def f(x):\n\treturn x * 2  # ünïcödé 🙂"


@pytest.fixture(scope="module")
def qwen3_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_random_pair(tmp_path_factory.mktemp("pair"), "qwen3", seed=0, block_size=8)


def test_tokenizer_round_trips_bytes_and_chats(qwen3_pair: tuple[Path, Path]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(qwen3_pair[0]))
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert ids == list(TEXT.encode())  # token id == byte value
    assert tokenizer.decode(ids) == TEXT
    assert (tokenizer.eos_token_id, tokenizer.mask_token_id, len(tokenizer)) == (
        EOS_TOKEN_ID,
        MASK_TOKEN_ID,
        258,
    )
    assert tokenizer.convert_ids_to_tokens([EOS_TOKEN_ID, MASK_TOKEN_ID]) == ["<|endoftext|>", "<|mask|>"]
    chat = [{"role": "user", "content": "hi"}]
    prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert prompt == "user: hi\nassistant: "


@pytest.mark.parametrize("family", FAMILIES)
def test_pair_loads_and_fits(family: str, tmp_path: Path) -> None:
    target_dir, draft_dir = write_random_pair(tmp_path, family, seed=1, block_size=16)
    config = AutoConfig.from_pretrained(str(target_dir))
    assert config.model_type == family
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    assert config.vocab_size == len(tokenizer)
    target = AutoModelForCausalLM.from_pretrained(str(target_dir)).eval()
    drafter = load_drafter(draft_dir)
    drafter.check_compatible(config)
    assert (drafter.block_size, drafter.mask_token_id) == (16, MASK_TOKEN_ID)

    # One draft step on real target features, as the decoding loop does it.
    ids = torch.tensor([tokenizer(TEXT)["input_ids"]])
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
        context = torch.cat([out.hidden_states[i + 1] for i in drafter.target_layer_ids], dim=-1)
        block = torch.full((1, drafter.block_size), MASK_TOKEN_ID)
        noise = target.get_input_embeddings()(block)
        positions = torch.arange(ids.shape[1] + drafter.block_size)[None]
        hidden = draft_pass(drafter, noise, context, positions)
        logits = drafter.compute_logits(hidden, target.lm_head)
    assert logits.shape == (1, drafter.block_size, len(tokenizer))
    assert torch.isfinite(logits).all()


def test_kimi_like_pair_carries_yarn_to_the_drafter(tmp_path: Path) -> None:
    _, draft_dir = write_random_pair(tmp_path, "deepseek_v3", block_size=8)
    rope = json.loads((draft_dir / "config.json").read_text())["rope_scaling"]
    assert (rope["rope_type"], rope["mscale"], rope["mscale_all_dim"]) == ("yarn", 1.0, 1.0)
    assert load_drafter(draft_dir).rotary.attention_scaling == pytest.approx(1.1386, abs=1e-4)  # 0.1 ln 4 + 1


def test_same_seed_same_weights(tmp_path: Path) -> None:
    first = load_drafter(write_random_pair(tmp_path / "a", seed=5)[1])
    again = load_drafter(write_random_pair(tmp_path / "b", seed=5)[1])
    other = load_drafter(write_random_pair(tmp_path / "c", seed=6)[1])
    assert torch.equal(first.fc.weight, again.fc.weight)
    assert not torch.equal(first.fc.weight, other.fc.weight)


def test_bad_requests_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecdeployError, match="unknown model family 'llama'"):
        write_random_pair(tmp_path, "llama")
    with pytest.raises(SpecdeployError, match="block size 4 is not supported"):
        write_random_pair(tmp_path, block_size=4)
    write_random_pair(tmp_path)
    with pytest.raises(SpecdeployError, match="already exists and is not empty"):
        write_random_pair(tmp_path)


def test_cli_writes_a_pair(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["zoo", "random", str(tmp_path), "--block-size", "8", "--json"])
    assert result.exit_code == 0, result.output
    paths = json.loads(result.stdout)
    assert load_drafter(paths["draft"]).block_size == 8
    assert (Path(paths["target"]) / "tokenizer.json").is_file()
