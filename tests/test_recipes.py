"""Recipe and hardware TOML: every shipped file validates, and bad files fail with a clear message."""

from __future__ import annotations

from importlib import resources

import pytest

from specdeploy.errors import SpecdeployError
from specdeploy.recipes import list_hardware, list_recipes, load_hardware, load_recipe

PAIRS = {"kimi-k2.6", "qwen3.6-27b", "qwen3-8b", "tiny-code", "tiny-mla", "tiny-hybrid"}
PROFILES = {"rtx-pro-6000-x8", "b200-x8", "b300-x8", "h200-x8", "h200-x1", "h100-x8", "cpu", "cuda"}


def test_every_shipped_pair_and_profile_loads():
    assert {recipe.name for recipe in list_recipes()} == PAIRS
    assert {profile.name for profile in list_hardware()} == PROFILES


def test_each_drafter_names_its_own_target():
    for recipe in list_recipes():
        drafters = [recipe.dflash, *([recipe.eagle3] if recipe.eagle3 else [])]
        assert all(drafter.trained_for == recipe.target.path for drafter in drafters), recipe.name


def test_kimi_facts_match_the_model_card():
    kimi = load_recipe("kimi-k2.6")
    assert kimi.target.kv_bytes_per_token == 61 * 576 * 2 == 70_272
    assert (kimi.target.layers, kimi.target.hidden, kimi.target.attention) == (61, 7168, "mla")
    assert kimi.dflash.block_size == 8 and kimi.dflash.gated and kimi.dflash.access_url
    assert kimi.eagle3 is not None and kimi.eagle3.path == "lightseekorg/kimi-k2.6-eagle3"
    # No verified commit is known: unpinned revisions are carried as None, never invented.
    assert kimi.target.revision is None and kimi.dflash.revision is None


def test_zoo_pairs_run_on_the_reference_engine_and_gpu_pairs_on_sglang():
    for recipe in list_recipes():
        assert (recipe.engine == "reference") == recipe.target.path.startswith("zoo:"), recipe.name


def test_profiles_carry_the_architecture():
    assert load_hardware("rtx-pro-6000-x8").sm == "sm_120"
    assert load_hardware("rtx-pro-6000-x8").interconnect == "pcie"
    assert load_hardware("b200-x8").sm_major == 10
    assert load_hardware("h200-x1").gpu_count == 1
    assert load_hardware("cpu").engine == "reference"


def test_unknown_name_lists_the_choices():
    with pytest.raises(SpecdeployError, match="unknown recipe 'kimi-k9'.*kimi-k2.6"):
        load_recipe("kimi-k9")
    with pytest.raises(SpecdeployError, match="unknown hardware profile 'a100'.*rtx-pro-6000-x8"):
        load_hardware("a100")


def test_missing_file_is_reported(tmp_path):
    with pytest.raises(SpecdeployError, match="does not exist"):
        load_recipe(str(tmp_path / "nope.toml"))


def test_recipe_file_by_path_with_a_pinned_revision(tmp_path):
    text = (resources.files("specdeploy.recipes") / "pairs" / "qwen3-8b.toml").read_text()
    pinned = text.replace('path = "Qwen/Qwen3-8B"\n', 'path = "Qwen/Qwen3-8B"\nrevision = "abc123"\n')
    path = tmp_path / "mine.toml"
    path.write_text(pinned.replace('name = "qwen3-8b"', 'name = "mine"'))
    recipe = load_recipe(str(path))
    assert recipe.name == "mine" and recipe.target.revision == "abc123"


def test_typo_in_a_key_is_an_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(
        'name = "x"\ndescription = "x"\nengine = "reference"\ngpu_count = 0\nmemory_mib = 10\n'
        'interconect = "none"\n'
    )
    with pytest.raises(SpecdeployError, match="interconect: Extra inputs are not permitted"):
        load_hardware(str(path))


def test_invalid_toml_is_an_error(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("name = \n")
    with pytest.raises(SpecdeployError, match="not valid TOML"):
        load_recipe(str(path))


def test_gpu_profile_without_compute_capability_is_rejected(tmp_path):
    path = tmp_path / "gpu.toml"
    path.write_text(
        'name = "x"\ndescription = "x"\nengine = "sglang"\ngpu_model = "NVIDIA X"\ngpu_count = 8\n'
        'memory_mib = 1000\ninterconnect = "nvlink"\n'
    )
    with pytest.raises(SpecdeployError, match="go together"):
        load_hardware(str(path))


def _kv_bytes_per_token(config) -> int:
    """bf16 KV bytes per token of a transformers config, the way the recipes count them."""
    if config.model_type == "deepseek_v3":  # MLA caches one latent plus the rope key per layer
        return config.num_hidden_layers * (config.kv_lora_rank + config.qk_rope_head_dim) * 2
    layer_types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    attention_layers = sum(kind == "full_attention" for kind in layer_types)
    return attention_layers * 2 * config.num_key_value_heads * config.head_dim * 2


@pytest.mark.parametrize("name", ["tiny-code", "tiny-mla", "tiny-hybrid"])
def test_zoo_recipes_match_the_zoo_specs(name):
    from specdeploy.zoo.specs import PAIRS as ZOO_PAIRS
    from specdeploy.zoo.specs import target_config

    recipe, spec = load_recipe(name), ZOO_PAIRS[name]
    config = target_config(spec, eos_token_id=0)
    assert (recipe.target.layers, recipe.target.hidden) == (config.num_hidden_layers, config.hidden_size)
    assert recipe.target.kv_bytes_per_token == _kv_bytes_per_token(config)
    assert recipe.dflash.block_size == spec.block_size
    assert (recipe.dflash.layers, recipe.dflash.kv_heads) == (spec.draft_layers, spec.draft_kv_heads)
    assert (
        recipe.dflash.kv_bytes_per_token
        == spec.draft_layers * 2 * spec.draft_kv_heads * spec.draft_head_dim * 2
    )
