"""Static checks of a target/drafter pair, from their files only (config.json, tokenizer files, model cards)
and the recipe when there is one: nothing is loaded into an engine.

Each check returns findings; a check whose inputs are missing (no recipe, no card, a server whose model
directories are not on this machine) says nothing rather than guess.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdeploy.doctor.findings import Finding
from specdeploy.engine.drafter_config import build_target_layer_ids, draft_value
from specdeploy.engine.models.rope import yarn_mscale
from specdeploy.errors import SpecdeployError
from specdeploy.recipes.schema import Recipe

# The RoPE keys that set the rotary frequencies or their scale; anything else (a transformers version's
# bookkeeping) is left out of the comparison. Absent keys take the defaults transformers gives them.
ROPE_KEYS: dict[str, Any] = {
    "rope_type": "default",
    "rope_theta": 10000.0,
    "factor": None,
    "original_max_position_embeddings": None,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": None,
    "mscale_all_dim": None,
    "attention_factor": None,
    "low_freq_factor": None,
    "high_freq_factor": None,
}
_CARD_LAYERS = re.compile(r"target[ _]layer(?:s|_ids)\W{0,4}\[([\d,\s]+)\]", re.IGNORECASE)
_BASE_MODEL = re.compile(r"^base_model:\s*(?:\n\s*-\s*)?['\"]?([^'\"\n]+)", re.MULTILINE)
THINKING_SWITCHES = ("enable_thinking", "thinking")  # Qwen3's kwarg, then Kimi's


@dataclass(frozen=True)
class PairFiles:
    """What the checks read: the two config.json files, the target's tokenizer files and the model cards."""

    target_config: dict[str, Any]
    draft_config: dict[str, Any]
    target_dir: Path | None = None
    draft_dir: Path | None = None

    @classmethod
    def read(cls, target_dir: Path, draft_dir: Path) -> PairFiles:
        return cls(
            read_json(target_dir / "config.json"), read_json(draft_dir / "config.json"), target_dir, draft_dir
        )

    @property
    def text_config(self) -> dict[str, Any]:
        """The language model's config (multimodal checkpoints such as Kimi K2.5 nest it)."""
        return self.target_config.get("text_config") or self.target_config

    def target_value(self, key: str) -> Any:
        return self.text_config.get(key, self.target_config.get(key))

    def draft_card(self) -> str:
        return _card(self.draft_dir)


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise SpecdeployError(f"{path} does not exist: give a checkpoint directory with its config.json")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SpecdeployError(f"{path} is not valid JSON ({exc})") from exc


def _card(model_dir: Path | None) -> str:
    """A model's card: README.md in its directory (Hugging Face), else card.md one up (the zoo's pairs)."""
    if model_dir is None:
        return ""
    for path in (model_dir / "README.md", model_dir.parent / "card.md"):
        if path.is_file():
            return path.read_text(errors="replace")
    return ""


def zoo_pair_name(model_dir: Path | None) -> str | None:
    """The pair a model of the zoo's layout (`<pair>/{target,draft}` beside `<pair>/card.md`) belongs to: the
    card's title."""
    if model_dir is None or model_dir.name not in ("target", "draft"):
        return None
    match = re.search(r"^# (\S+)\s*$", _card(model_dir), re.MULTILINE)
    return match.group(1) if match else None


def static_findings(
    pair: PairFiles, recipe: Recipe | None = None, draft_tokens: int | None = None
) -> list[Finding]:
    """Every static check; `draft_tokens` is SGLang's speculative_num_draft_tokens of a DFlash server."""
    return [
        *check_vocabulary(pair),
        *check_hidden_size(pair),
        *check_target_layers(pair),
        *check_rope(pair),
        *check_mask_token(pair),
        *check_block_size(pair, recipe, draft_tokens),
        *check_pairing(pair, recipe),
        *check_quantization(pair),
        *check_chat_template(pair),
    ]


def check_vocabulary(pair: PairFiles) -> list[Finding]:
    target, draft = pair.target_value("vocab_size"), pair.draft_config.get("vocab_size")
    if target is None or draft is None or target == draft:
        return []
    return [
        Finding(
            "error",
            "vocabulary",
            "the drafter's vocabulary differs from the target's: its token ids mean other tokens",
            f"drafter vocab_size {draft}, target vocab_size {target}",
            "use the drafter trained for this target (it shares the target's tokenizer)",
        )
    ]


def check_hidden_size(pair: PairFiles) -> list[Finding]:
    target, draft = pair.target_value("hidden_size"), pair.draft_config.get("hidden_size")
    if target is None or draft is None or target == draft:
        return []
    return [
        Finding(
            "error",
            "hidden-size",
            "the drafter reads target hidden states of another width",
            f"drafter hidden_size {draft}, target hidden_size {target}",
            "use the drafter trained for this target",
        )
    ]


def check_target_layers(pair: PairFiles) -> list[Finding]:
    layers = pair.target_value("num_hidden_layers")
    ids = draft_value(pair.draft_config, "target_layer_ids")
    made_for = pair.draft_config.get("num_target_layers")
    draft_layers = pair.draft_config.get("num_hidden_layers")
    if layers is None or ids is None:
        return []
    findings: list[Finding] = []
    evidence = f"target_layer_ids {ids}, target num_hidden_layers {layers}"
    if made_for is not None and made_for != layers:
        findings.append(
            Finding(
                "error",
                "target-layers",
                f"the drafter was made for a target with {made_for} layers; this target has {layers}",
                f"drafter num_target_layers {made_for}, target num_hidden_layers {layers}",
                "use the drafter trained for this target",
            )
        )
    outside = [i for i in ids if not 0 <= i < layers]
    if outside:
        findings.append(
            Finding(
                "error",
                "target-layers",
                f"target_layer_ids {outside} do not exist in this target",
                evidence,
                "restore dflash_config.target_layer_ids from the drafter's published config.json",
            )
        )
    card_ids = card_layer_ids(pair.draft_card())
    if card_ids is not None and card_ids != list(ids):
        findings.append(
            Finding(
                "error",
                "target-layers",
                "the drafter's target_layer_ids differ from its card's: it reads features from layers it "
                "was not trained on",
                f"config.json {list(ids)}, card {card_ids}",
                f"set dflash_config.target_layer_ids to {card_ids}",
            )
        )
    elif card_ids is None and not outside and draft_layers is not None:
        default = build_target_layer_ids(layers, len(ids))
        if list(ids) != default:
            findings.append(
                Finding(
                    "warning",
                    "target-layers",
                    "the drafter's target_layer_ids are not z-lab's default spread for this target",
                    f"{evidence}; default for {len(ids)} context layers: {default}",
                    "compare dflash_config.target_layer_ids with the drafter's published config.json",
                )
            )
    return findings


def card_layer_ids(card: str) -> list[int] | None:
    match = _CARD_LAYERS.search(card)
    return [int(i) for i in match.group(1).replace(",", " ").split()] if match else None


def rope_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The RoPE settings that matter, from either config.json layout (rope_scaling wins, as in transformers)."""
    params = dict(config.get("rope_scaling") or config.get("rope_parameters") or {})
    params.setdefault("rope_type", params.get("type", "default"))
    if "rope_theta" not in params and config.get("rope_theta") is not None:
        params["rope_theta"] = config["rope_theta"]
    settings = {key: params.get(key, default) for key, default in ROPE_KEYS.items()}
    if settings["rope_type"] != "default" and settings["original_max_position_embeddings"] is None:
        settings["original_max_position_embeddings"] = config.get("max_position_embeddings")
    if settings["rope_type"] == "default":  # scaling keys mean nothing without scaling
        settings = {"rope_type": "default", "rope_theta": float(settings["rope_theta"])}
    return settings


def check_rope(pair: PairFiles) -> list[Finding]:
    target, draft = rope_settings(pair.text_config), rope_settings(pair.draft_config)
    findings: list[Finding] = []
    differ = {
        k: (draft.get(k), target.get(k))
        for k in target.keys() | draft.keys()
        if draft.get(k) != target.get(k)
    }
    if differ:
        findings.append(
            Finding(
                "error",
                "rope",
                "the drafter's RoPE differs from the target's: drafted positions are rotated differently "
                "from what it was trained with",
                "; ".join(f"{k}: drafter {d}, target {t}" for k, (d, t) in sorted(differ.items())),
                "restore the drafter's rope settings from its published config.json (z-lab drafters copy the "
                "target's)",
            )
        )
    findings += _legacy_yarn(draft)
    return findings


def _legacy_yarn(rope: dict[str, Any]) -> list[Finding]:
    """z-lab trained its drafters with YaRN's legacy attention factor 0.1*ln(factor)+1; an engine that derives
    it from mscale/mscale_all_dim instead gets another value (1.0 when they are equal, as in Kimi's config)."""
    if rope.get("rope_type") != "yarn" or rope.get("attention_factor") is not None:
        return []
    factor, mscale, all_dim = rope.get("factor"), rope.get("mscale"), rope.get("mscale_all_dim")
    if not (factor and mscale and all_dim):
        return []
    legacy = yarn_mscale(float(factor))
    derived = yarn_mscale(float(factor), float(mscale)) / yarn_mscale(float(factor), float(all_dim))
    if abs(legacy - derived) < 1e-4:
        return []
    return [
        Finding(
            "warning",
            "yarn-attention-factor",
            f"engines disagree on this drafter's YaRN attention factor: {legacy:.4f} (legacy 0.1*ln({factor:g})+1, "
            f"what z-lab's drafters were trained with) or {derived:.4f} (from mscale/mscale_all_dim)",
            f"drafter rope: yarn factor {factor:g}, mscale {mscale:g}, mscale_all_dim {all_dim:g}, no "
            "attention_factor",
            f"if tau is low, set rope_scaling.attention_factor = {legacy:.4f} in the drafter's config.json "
            "(the reference engine applies the legacy factor already)",
        )
    ]


def _tokenizer_tokens(target_dir: Path | None) -> dict[str, int]:
    """The target tokenizer's special (added) tokens by content."""
    if target_dir is None or not (target_dir / "tokenizer.json").is_file():
        return {}
    tokenizer = json.loads((target_dir / "tokenizer.json").read_text())
    return {t["content"]: t["id"] for t in tokenizer.get("added_tokens", [])}


def check_mask_token(pair: PairFiles) -> list[Finding]:
    mask = draft_value(pair.draft_config, "mask_token_id")
    vocab = pair.target_value("vocab_size")
    if mask is None:
        return []
    if vocab is not None and not 0 <= mask < vocab:
        return [
            Finding(
                "error",
                "mask-token",
                "the drafter's mask token is outside the target's vocabulary",
                f"mask_token_id {mask}, target vocab_size {vocab}",
                "restore dflash_config.mask_token_id from the drafter's published config.json",
            )
        ]
    special = _tokenizer_tokens(pair.target_dir)
    named = {content: i for content, i in special.items() if "mask" in content.lower()}
    by_id = {i: content for content, i in special.items()}
    if named and mask not in named.values():
        return [
            Finding(
                "error",
                "mask-token",
                "the drafter's mask token id is not the tokenizer's mask token: the drafter fills its block "
                "with a token it was not trained to read as a blank",
                f"mask_token_id {mask} ({by_id.get(mask, 'an ordinary token')!r}); tokenizer: "
                + ", ".join(f"{c!r} = {i}" for c, i in named.items()),
                f"set dflash_config.mask_token_id to {next(iter(named.values()))}",
            )
        ]
    eos = pair.target_value("eos_token_id")
    eos_ids = set(eos) if isinstance(eos, list) else {eos}
    if mask in eos_ids:
        return [
            Finding(
                "error",
                "mask-token",
                "the drafter's mask token is the target's end-of-sequence token",
                f"mask_token_id {mask}, eos_token_id {eos}",
                "restore dflash_config.mask_token_id from the drafter's published config.json",
            )
        ]
    return []


def check_block_size(pair: PairFiles, recipe: Recipe | None, draft_tokens: int | None) -> list[Finding]:
    block = draft_value(pair.draft_config, "block_size")
    if block is None:
        return []
    findings: list[Finding] = []
    if recipe is not None and recipe.dflash.block_size != block:
        findings.append(
            Finding(
                "error",
                "block-size",
                f"recipe {recipe.name} plans {recipe.dflash.block_size} draft tokens per block; the drafter "
                f"was trained on blocks of {block}",
                f"recipe dflash.block_size {recipe.dflash.block_size}, drafter block_size {block}",
                f"set dflash.block_size = {block} in the recipe",
            )
        )
    if draft_tokens is not None and draft_tokens != block:
        findings.append(
            Finding(
                "error" if draft_tokens > block else "warning",
                "block-size",
                f"the server runs DFlash with {draft_tokens} draft tokens; the drafter was trained on blocks "
                f"of {block}"
                + (" and cannot fill more" if draft_tokens > block else ", so it sees a block it never saw"),
                f"speculative_num_draft_tokens {draft_tokens}, drafter block_size {block}",
                f"launch with --speculative-num-draft-tokens {block}",
            )
        )
    return findings


def check_pairing(pair: PairFiles, recipe: Recipe | None) -> list[Finding]:
    """Was the drafter trained for this target? From the cards (a zoo pair's, a Hugging Face card's
    base_model) and the recipe's trained_for, pinned revisions and known issues."""
    findings: list[Finding] = []
    target_pair, draft_pair = zoo_pair_name(pair.target_dir), zoo_pair_name(pair.draft_dir)
    if target_pair and draft_pair and target_pair != draft_pair:
        findings.append(
            Finding(
                "error",
                "pairing",
                f"the drafter belongs to pair {draft_pair}, the target to pair {target_pair}",
                f"drafter {pair.draft_dir}, target {pair.target_dir}",
                f"use zoo:{target_pair}-draft with this target",
            )
        )
    base = _BASE_MODEL.search(pair.draft_card())
    target_name = (
        recipe.target.path if recipe is not None else (pair.target_dir.name if pair.target_dir else None)
    )
    if base and target_name and _short(base.group(1)) != _short(target_name):
        findings.append(
            Finding(
                "error",
                "pairing",
                f"the drafter's card says it was trained for {base.group(1).strip()}, not {target_name}",
                f"base_model: {base.group(1).strip()} (drafter card)",
                f"use the drafter published for {target_name}",
            )
        )
    if recipe is not None:
        findings += _recipe_pairing(recipe)
    return findings


def _short(name: str) -> str:
    return name.strip().rstrip("/").rsplit("/", 1)[-1].lower()


def _recipe_pairing(recipe: Recipe) -> list[Finding]:
    findings = []
    if recipe.dflash.trained_for != recipe.target.path:
        findings.append(
            Finding(
                "error",
                "pairing",
                f"recipe {recipe.name} pairs a drafter trained for {recipe.dflash.trained_for} with "
                f"{recipe.target.path}",
                f"dflash.trained_for {recipe.dflash.trained_for}, target.path {recipe.target.path}",
                "use the drafter published for this target",
            )
        )
    unpinned = [m.path for m in (recipe.target, recipe.dflash) if m.revision is None and not m.is_zoo]
    if unpinned:
        findings.append(
            Finding(
                "info",
                "revisions",
                "unpinned revisions: a later upload of either model may no longer match the other",
                "no revision for " + ", ".join(unpinned),
                "pin both with `specdeploy lock`",
            )
        )
    # the pair's known issues: the recipe's own, and what its target and DFlash drafter carry as notes
    sources = [(f"recipe {recipe.name}", recipe.known_issues), (recipe.target.path, recipe.target.notes)]
    if recipe.dflash is not None:
        sources.append((recipe.dflash.path, recipe.dflash.notes))
    findings += [
        Finding("info", "known-issue", issue, where, "-") for where, issues in sources for issue in issues
    ]
    return findings


def check_quantization(pair: PairFiles) -> list[Finding]:
    quant = pair.draft_config.get("quantization_config")
    if not quant:
        return []
    return [
        Finding(
            "warning",
            "draft-quantization",
            "the drafter is quantized: quantized DFlash drafters have been seen to accept almost nothing",
            f"drafter quantization_config: {quant.get('quant_method', quant)}",
            "serve the drafter in bf16 (it is small next to the target)",
        )
    ]


def chat_template(target_dir: Path | None) -> str:
    if target_dir is None:
        return ""
    if (target_dir / "chat_template.jinja").is_file():
        return (target_dir / "chat_template.jinja").read_text()
    config = target_dir / "tokenizer_config.json"
    template = json.loads(config.read_text()).get("chat_template") if config.is_file() else None
    return template if isinstance(template, str) else ""


def thinking_switch(template: str) -> str | None:
    """The chat-template variable that turns thinking on or off, if the template has one."""
    return next((name for name in THINKING_SWITCHES if re.search(rf"\b{name}\b", template)), None)


def check_chat_template(pair: PairFiles) -> list[Finding]:
    template = chat_template(pair.target_dir)
    switch = thinking_switch(template)
    if switch is None:
        return []
    return [
        Finding(
            "info",
            "thinking",
            f"the chat template has a thinking switch ({switch}); acceptance differs with thinking on and off, "
            "so the probe measures both",
            f"chat template mentions {switch}",
            f"serve requests with the setting the drafter was trained for (chat_template_kwargs {{{switch!r}: ...}})",
        )
    ]
