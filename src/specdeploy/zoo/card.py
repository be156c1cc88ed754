"""A zoo pair's card.md: what it is, what it learned from, how long, final losses and measured tau."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specdeploy.zoo.registry import ZooPair
from specdeploy.zoo.table import ModeRow, markdown_table


@dataclass(frozen=True)
class Evaluation:
    rows: list[ModeRow]
    prompt_sources: list[str]  # held-out corpus files the prompts were cut from
    max_new_tokens: int
    python_version: str  # of the interpreter whose stdlib supplied the prompts
    command: str


def corpus_summary(corpus_manifest: dict) -> str:
    roots = ", ".join(corpus_manifest.get("roots", []))
    files = corpus_manifest.get("num_files", {})
    size = corpus_manifest.get("num_bytes", {})
    return (
        f"Python {corpus_manifest.get('python_version')} source: {roots}; {files.get('train')} training files "
        f"({size.get('train', 0) / 1e6:.1f} MB), {files.get('held_out')} held out "
        f"({corpus_manifest.get('held_out_rule')})"
    )


def render_card(pair: ZooPair, evaluation: Evaluation | None) -> str:
    """The card; without an evaluation (a target the reference engine cannot run) it says so."""
    log = pair.train_log()
    spec = pair.spec
    target, draft = log.get("target", {}), log.get("draft", {})
    corpus_file = pair.directory / "corpus.json"
    corpus = json.loads(corpus_file.read_text()) if corpus_file.is_file() else {}
    versions = log.get("versions", {})
    settings = log.get("settings", {})
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
        "- tokenizer: byte-level BPE, 2048 tokens, `<|endoftext|>` (EOS) and `<|mask|>` (drafter mask)",
        "",
        "## Training",
        "",
        f"- corpus: {corpus_summary(corpus)}; file list with sha256 in `corpus.json`",
        f"- target: {target.get('steps')} steps in {target.get('seconds')} s, batch {settings.get('target_batch')} x "
        f"{settings.get('seq_len')} tokens; final train loss {target.get('final_train_loss')}, held-out loss "
        f"{target.get('held_out_loss')}",
        f"- drafter data: {log.get('rollouts', {}).get('sequences')} greedy target continuations of "
        f"{settings.get('rollout_new_tokens')} tokens after {settings.get('rollout_prompt')}-token corpus prefixes",
        f"- drafter: {draft.get('steps')} steps in {draft.get('seconds')} s, batch {settings.get('draft_batch')} x "
        f"{settings.get('blocks_per_sequence')} blocks; final loss {draft.get('final_train_loss')} "
        f"(slot weights exp(-(i-1)/{spec.loss_gamma}))",
        *_memorisation_lines(log),
        *_retrain_lines(log.get("draft_retrain")),
        f"- on {log.get('device')}, seed {settings.get('seed')}, Python {versions.get('python')}, torch "
        f"{versions.get('torch')}, transformers {versions.get('transformers')}; full log in `train_log.json`",
        "",
        "## Acceptance on held-out prompts",
        "",
        *(_evaluation_lines(evaluation) if evaluation is not None else _no_evaluation_lines(draft)),
    ]
    return "\n".join(lines)


def _memorisation_lines(log: dict) -> list[str]:
    """A warning when the drafter saw its few rollouts many times over: it then memorises them."""
    sequences = log.get("rollouts", {}).get("sequences") or 0
    passes = (
        (log.get("draft", {}).get("steps") or 0)
        * log.get("settings", {}).get("draft_batch", 0)
        / max(1, sequences)
    )
    if passes < 10:
        return []
    return [
        f"- caution: the drafter saw each of its {sequences} rollouts about {passes:.0f} times and memorised them "
        "(near-perfect training accuracy, low acceptance on new text); more rollouts would fix this"
    ]


def _retrain_lines(runs: list[dict] | None) -> list[str]:
    return [
        f"- drafter, continued: {run.get('steps')} steps in {run.get('seconds')} s on {run.get('device')}, "
        f"batch {run.get('settings', {}).get('draft_batch')} x {run.get('settings', {}).get('blocks_per_sequence')} "
        f"blocks of {run.get('data')}; final loss {run.get('final_train_loss')} (`zoo train --draft-only`, seed "
        f"{run.get('settings', {}).get('seed')})"
        for run in runs or []
    ]


def _evaluation_lines(evaluation: Evaluation) -> list[str]:
    return [
        f"{len(evaluation.prompt_sources)} prompts cut from held-out files of the Python "
        f"{evaluation.python_version} stdlib, greedy, up to {evaluation.max_new_tokens} new tokens, "
        "reference engine on CPU (float32). tau = tokens committed per verify step, bonus included.",
        "",
        markdown_table(evaluation.rows),
        "",
        f"Measured with `{evaluation.command}`; prompt files: {', '.join(evaluation.prompt_sources)}.",
        "",
    ]


def _no_evaluation_lines(draft_log: dict) -> list[str]:
    history = draft_log.get("history") or [{}]
    accuracy = history[-1].get("slot_accuracy", [])
    return [
        "Not measured: the reference engine cannot run Gated DeltaNet layers yet, so no decoding loop can",
        "verify this target's drafts here. The weights load with transformers (`AutoModelForCausalLM`).",
        f"Last training batch, drafter top-1 accuracy per block slot 1..{len(accuracy)} on target rollouts: "
        f"{', '.join(f'{a:.2f}' for a in accuracy)}.",
        "",
    ]


def _architecture(target_dir: Path) -> str:
    config = json.loads((target_dir / "config.json").read_text())
    return (config.get("architectures") or ["?"])[0]


def _draft_layers(draft_dir: Path) -> list[int]:
    config = json.loads((draft_dir / "config.json").read_text())
    return config.get("dflash_config", {}).get("target_layer_ids", [])
