"""A zoo pair's card.md, written from its files only: what it is, what it learned from and for how long
(train_log.json and the shared corpus.json), the command that trains it again, and the acceptance measured
on held-out prompts with the command that measured it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specdeploy.zoo.registry import ZooPair
from specdeploy.zoo.settings import DataOptions, TrainSettings
from specdeploy.zoo.table import ModeRow, markdown_table


@dataclass(frozen=True)
class Evaluation:
    rows: list[ModeRow]
    prompt_sources: list[str]  # held-out corpus files the prompts were cut from
    max_new_tokens: int
    python_version: str  # of the interpreter whose stdlib supplied the prompts
    command: str


def corpus_summary(corpus: dict) -> str:
    files, size = corpus.get("num_files", {}), corpus.get("num_bytes", {})
    packages = ", ".join(f"{p['name']}=={p['version']}" for p in corpus.get("packages", [])) or "none"
    return (
        f"Python {corpus.get('python_version')} source ({', '.join(corpus.get('roots', []))}; PyPI packages: "
        f"{packages}); {files.get('train')} training files ({size.get('train', 0) / 1e6:.1f} MB), "
        f"{files.get('held_out')} held out ({corpus.get('held_out_rule')})"
    )


def train_command(pair: ZooPair, log: dict, corpus: dict) -> str:
    """The `zoo train` invocation that repeats this run: its corpus pins and every non-default option."""
    gpu = any(chunk["device"] != "cpu" for chunk in log.get("chunks", []))
    parts = ["specdeploy zoo train --out OUT", f"--pair {pair.name}", *(["--device cuda"] if gpu else [])]
    parts += [
        "--max-minutes 8",
        *(f"--corpus-package {p['name']}=={p['version']}" for p in corpus.get("packages", [])),
    ]
    data_defaults = DataOptions()
    for name in ("vocab_size", "max_files"):
        value = log.get("corpus", {}).get(name)
        if value != getattr(data_defaults, name):
            parts.append(f"--{name.replace('_', '-')} {value}")
    defaults = TrainSettings().__dict__
    for name, value in log.get("settings", {}).items():
        if name in defaults and value != defaults[name]:
            parts.append(f"--{name.replace('_', '-')} {value}")
    return " ".join(parts)


def render_card(pair: ZooPair, evaluation: Evaluation | None) -> str:
    """The card; without an evaluation (a target the reference engine cannot run) it says so."""
    log = pair.train_log()
    corpus = pair.corpus()
    spec = pair.spec
    rows = evaluation.rows if evaluation is not None else []
    dflash = next((r for r in rows if r.label == "dflash"), None)
    summary = f"{spec.description}; DFlash drafter, block {spec.block_size}"
    if dflash is not None:
        summary += f"; DFlash tau {dflash.tau:.2f} on held-out code"
    lines = [
        f"# {pair.name}",
        "",
        f"{summary}. Reference engine: {spec.engine_support}.",
        "",
        "## Models",
        "",
        f"- target: `{spec.family}` (transformers `{_architecture(pair.target_dir)}`), "
        f"{log.get('target_parameters', 0) / 1e6:.2f}M parameters, bf16 safetensors",
        f"- drafter: DFlash (z-lab format), {log.get('draft_parameters', 0) / 1e6:.2f}M parameters, "
        f"block size {spec.block_size}, target layers {_draft_layers(pair.draft_dir)}",
        "- tokenizer: byte-level BPE, `<|endoftext|>` (EOS) and `<|mask|>` (drafter mask)",
        "",
        "## Training",
        "",
        *_training_lines(log, corpus, spec.loss_gamma),
        "",
        f"Train it again (run the command until it says finished; each run stops within about 8 minutes): "
        f"`{train_command(pair, log, corpus)}`",
        "",
        "## Acceptance on held-out prompts",
        "",
        *(_evaluation_lines(evaluation) if evaluation is not None else _no_evaluation_lines()),
    ]
    return "\n".join(lines)


def _training_lines(log: dict, corpus: dict, gamma: float) -> list[str]:
    settings = log.get("settings", {})
    target, rollouts, draft = log.get("target", {}), log.get("rollouts", {}), log.get("draft", {})
    chunks = log.get("chunks", [])
    devices = ", ".join(dict.fromkeys(c["device"] for c in chunks)) or "-"
    versions = chunks[-1]["versions"] if chunks else {}
    return [
        f"- corpus: {corpus_summary(corpus)}; every file with its sha256 in `../corpus.json`",
        f"- target: {target.get('steps')} steps in {target.get('seconds')} s, batch {settings.get('target_batch')} "
        f"x {settings.get('seq_len')} tokens ({target.get('tokens_seen', 0) / 1e6:,.1f}M tokens); final train loss "
        f"{target.get('final_train_loss')}, held-out loss {target.get('held_out_loss')}",
        f"- drafter data: {rollouts.get('sequences')} greedy target continuations of "
        f"{settings.get('rollout_new_tokens')} tokens after {settings.get('rollout_prompt')}-token prefixes of the "
        f"training split, {rollouts.get('distinct_prompts')} distinct prompts, in {rollouts.get('seconds', 0):.0f} s",
        f"- drafter: {draft.get('steps')} steps in {draft.get('seconds')} s, batch {settings.get('draft_batch')} "
        f"rollouts x {settings.get('blocks_per_sequence')} blocks, {draft.get('passes_over_rollouts')} passes over "
        f"the rollouts; final loss {draft.get('final_train_loss')} (labels: the target's greedy tokens; slot "
        f"weights exp(-(i-1)/{gamma}))",
        *_memorisation_lines(draft, rollouts),
        f"- trained in {len(chunks)} invocation{'' if len(chunks) == 1 else 's'} of `zoo train` on {devices}, seed "
        f"{settings.get('seed')}, Python "
        f"{versions.get('python')}, torch {versions.get('torch')}, transformers {versions.get('transformers')}; "
        "full log (every chunk, loss history) in `train_log.json`",
    ]


def _memorisation_lines(draft: dict, rollouts: dict) -> list[str]:
    """A warning when the drafter saw its rollouts many times over: it then memorises them."""
    passes = draft.get("passes_over_rollouts") or 0
    if passes < 10:
        return []
    return [
        f"- caution: the drafter saw each of its {rollouts.get('sequences')} rollouts about {passes:.0f} times "
        "and may have memorised them (high training accuracy, low acceptance on new text); more rollouts fix this"
    ]


def _evaluation_lines(evaluation: Evaluation) -> list[str]:
    return [
        f"{len(evaluation.prompt_sources)} prompts cut from held-out files of the Python "
        f"{evaluation.python_version} stdlib (none whose bytes are among the training files), greedy, up to "
        f"{evaluation.max_new_tokens} new tokens, reference engine on CPU (float32, one thread). tau = tokens "
        "committed per verify step, bonus included; tokens/s and speedup are of this engine in-process.",
        "",
        markdown_table(evaluation.rows),
        "",
        f"Measured with `{evaluation.command}`; prompt files: {', '.join(evaluation.prompt_sources)}.",
        "",
    ]


def _no_evaluation_lines() -> list[str]:
    return ["Not measured: the reference engine cannot decode this target's family.", ""]


def _architecture(target_dir: Path) -> str:
    config = json.loads((target_dir / "config.json").read_text())
    return (config.get("architectures") or ["?"])[0]


def _draft_layers(draft_dir: Path) -> list[int]:
    config = json.loads((draft_dir / "config.json").read_text())
    return config.get("dflash_config", {}).get("target_layer_ids", [])
