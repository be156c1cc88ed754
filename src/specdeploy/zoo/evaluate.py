"""`specdeploy zoo eval NAME`: tau per mode on held-out prompts with the reference engine, and the card."""

from __future__ import annotations

import platform
from collections.abc import Callable
from pathlib import Path

from specdeploy.engine.runtime import load_tokenizer
from specdeploy.errors import SpecdeployError
from specdeploy.zoo.card import Evaluation, render_card
from specdeploy.zoo.measure import ModeSpec, run_modes
from specdeploy.zoo.prompts import held_out_prompts
from specdeploy.zoo.registry import MODELS_DIR, get_pair
from specdeploy.zoo.table import mode_rows

ENGINE_FAMILIES = ("qwen3", "deepseek_v3", "qwen3_next")  # target families the reference engine can decode


def engine_can_run(name: str) -> bool:
    return get_pair(name).spec.family in ENGINE_FAMILIES


def evaluate_pair(
    name: str,
    budgets: tuple[int, ...],
    num_prompts: int = 8,
    max_new_tokens: int = 128,
    say: Callable[[str], None] | None = None,
    models_dir: Path = MODELS_DIR,
) -> Evaluation:
    pair = get_pair(name, models_dir)
    if pair.spec.family not in ENGINE_FAMILIES:
        raise SpecdeployError(f"{name}: {pair.spec.engine_support}, so it cannot be evaluated")
    if not pair.corpus_path.is_file():
        raise SpecdeployError(
            f"no corpus record at {pair.corpus_path}: without it no prompt can be shown to be held out; "
            "copy the training run's corpus.json there"
        )
    tokenizer = load_tokenizer(pair.target_dir)
    trained = {f["sha256"] for f in pair.corpus()["files"] if f["split"] == "train"}
    prompts, sources = held_out_prompts(lambda text: tokenizer.encode(text), num_prompts, trained)
    modes = (ModeSpec("ar"), ModeSpec("dflash"), *(ModeSpec("ddtree", b) for b in budgets))
    results = run_modes(
        pair.target_dir,
        pair.draft_dir,
        [tokenizer.encode(p) for p in prompts],
        modes,
        max_new_tokens,
        say=say,
    )
    command = (
        f"specdeploy zoo eval {name} --prompts {num_prompts} --max-new-tokens {max_new_tokens} "
        + " ".join(f"--budget {b}" for b in budgets)
    )
    return Evaluation(mode_rows(results), sources, max_new_tokens, platform.python_version(), command)


def write_card(name: str, evaluation: Evaluation | None, models_dir: Path = MODELS_DIR) -> None:
    pair = get_pair(name, models_dir)
    pair.card_path.write_text(render_card(pair, evaluation))
