"""Training the zoo end to end: corpus -> tokenizer -> per pair: target, greedy rollouts, drafter.

Output layout (each pair folder is what ships):
    OUT/corpus.json                      what was read, with sha256 and split of every file
    OUT/tokenizer/                       the shared BPE tokenizer
    OUT/tokens/{train,held_out}.pt       the encoded corpus, reused by every pair
    OUT/<pair>/target/                   transformers checkpoint (config.json, bf16 safetensors, tokenizer)
    OUT/<pair>/draft/                    DFlash drafter in z-lab's format
    OUT/<pair>/train_log.json            settings, versions, steps, losses
"""

from __future__ import annotations

import copy
import json
import multiprocessing
import os
import platform
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM

from specdeploy.engine.drafter import DFlashDrafter
from specdeploy.engine.drafter_config import build_target_layer_ids
from specdeploy.engine.loading import load_drafter, save_drafter
from specdeploy.errors import SpecdeployError
from specdeploy.zoo.archive import archive_pair
from specdeploy.zoo.checkpoint import bf16_state_dict, save_atomically
from specdeploy.zoo.corpus import collect_corpus
from specdeploy.zoo.rollouts import greedy_rollouts
from specdeploy.zoo.schedule import TrainBudget
from specdeploy.zoo.specs import MAX_POSITIONS, VOCAB_SIZE, PairSpec, pair_spec, target_config
from specdeploy.zoo.tokenizer import EOS_TOKEN, MASK_TOKEN, encode_documents, load_tokenizer, train_tokenizer
from specdeploy.zoo.train_drafter import last_valid_positions, train_drafter
from specdeploy.zoo.train_target import sample_windows, train_target


@dataclass
class TrainSettings:
    seed: int = 0
    device: str = "cpu"
    scale: float = 1.0  # model width factor; < 1 for quick runs
    vocab_size: int = VOCAB_SIZE
    max_files: int | None = None
    target_steps: int = 100_000
    target_seconds: float = 180.0
    target_batch: int = 64
    target_lr: float = 2e-3
    seq_len: int = 512
    rollout_prompt: int = 64
    rollout_new_tokens: int = 192
    rollout_batch: int = 256
    rollout_batches: int = 1000
    rollout_seconds: float = 45.0
    draft_steps: int = 100_000
    draft_seconds: float = 120.0
    draft_batch: int = 64
    draft_lr: float = 2e-3
    blocks_per_sequence: int = 16
    checkpoint_every: int = 500
    archive_part_bytes: int = 15 << 20


def prepare_data(
    out: Path, corpus_roots: list[Path] | None, settings: TrainSettings, say: Callable[[str], None]
) -> None:
    """Collect the corpus, train the tokenizer and encode both splits (once, shared by all pairs)."""
    corpus = collect_corpus(corpus_roots, settings.max_files)
    out.mkdir(parents=True, exist_ok=True)
    corpus.write_manifest(out / "corpus.json")
    say(
        f"corpus: Python {corpus.python_version}, {len(corpus.split('train'))} train files, "
        f"{len(corpus.split('held_out'))} held-out files"
    )
    train_texts = corpus.texts("train")
    tokenizer = train_tokenizer(train_texts, settings.vocab_size)
    tokenizer.save_pretrained(str(out / "tokenizer"))
    (out / "tokens").mkdir(exist_ok=True)
    for split, texts in (("train", train_texts), ("held_out", corpus.texts("held_out"))):
        stream = encode_documents(tokenizer, texts)
        torch.save(stream, out / "tokens" / f"{split}.pt")
        say(f"tokens: {split} {stream.numel():,}")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def drafter_config(spec: PairSpec, target_cfg, mask_token_id: int, scale: float) -> dict:
    num_layers = spec.draft_layers if scale >= 1 else 1
    num_target_layers = target_cfg.num_hidden_layers
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": target_cfg.hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": spec.draft_heads,
        "num_key_value_heads": spec.draft_kv_heads,
        "head_dim": spec.draft_head_dim,
        "intermediate_size": max(64, int(spec.draft_intermediate * scale)),
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "vocab_size": target_cfg.vocab_size,
        "max_position_embeddings": MAX_POSITIONS,
        "rope_theta": 10000.0,
        "num_target_layers": num_target_layers,
        "block_size": spec.block_size,
        "dflash_config": {
            "target_layer_ids": build_target_layer_ids(num_target_layers, num_layers),
            "mask_token_id": mask_token_id,
        },
    }


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def train_pair(
    name: str, out: Path, settings: TrainSettings, archive_dir: Path | None, threads: int | None = None
) -> dict:
    """Train one pair's target and drafter; checkpoints (and archives) as it goes; returns its log."""
    spec = pair_spec(name)
    if threads is not None:
        torch.set_num_threads(threads)  # side-by-side workers would otherwise oversubscribe the cores

    def say(message: str) -> None:
        print(f"[{name}] {message}", flush=True)

    seed_everything(settings.seed)
    device = torch.device(settings.device)
    tokenizer = load_tokenizer(out / "tokenizer")
    eos, mask = tokenizer.convert_tokens_to_ids([EOS_TOKEN, MASK_TOKEN])
    train_stream = torch.load(out / "tokens" / "train.pt").to(device)
    held_out_stream = torch.load(out / "tokens" / "held_out.pt").to(device)
    pair_dir = out / name
    pair_dir.mkdir(parents=True, exist_ok=True)
    log: dict = {
        "pair": asdict(spec),
        "settings": asdict(settings),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }

    def save_log_and_archive() -> None:
        (pair_dir / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
        if archive_dir is not None:
            archive_pair(pair_dir, archive_dir, settings.archive_part_bytes)

    cfg = target_config(spec, eos, settings.scale)
    cfg.vocab_size = len(tokenizer)
    target = AutoModelForCausalLM.from_config(cfg).to(device)
    log["target_parameters"] = count_parameters(target)
    say(f"target {spec.family}: {log['target_parameters'] / 1e6:.2f}M parameters")

    def save_target() -> None:
        def write(tmp: Path) -> None:
            target.config.dtype = torch.bfloat16  # what the safetensors hold
            target.save_pretrained(str(tmp), state_dict=bf16_state_dict(target))
            tokenizer.save_pretrained(str(tmp))

        save_atomically(pair_dir / "target", write)
        save_log_and_archive()

    target_log = train_target(
        target,
        train_stream,
        held_out_stream,
        TrainBudget(settings.target_steps, settings.target_seconds, peak_lr=settings.target_lr),
        settings.target_batch,
        settings.seq_len,
        settings.seed,
        save_target,
        settings.checkpoint_every,
        say=say,
    )
    log["target"] = {**target_log.summary(), "history": target_log.history}
    save_log_and_archive()

    sequences = greedy_rollouts(
        target,
        train_stream,
        settings.rollout_prompt,
        settings.rollout_new_tokens,
        settings.rollout_batch,
        settings.rollout_seconds,
        settings.rollout_batches,
        eos,
        settings.seed,
        say=say,
    )
    last_valid = last_valid_positions(sequences, settings.rollout_prompt, eos)
    log["rollouts"] = {
        "sequences": sequences.shape[0],
        "length": sequences.shape[1],
        "prompt": settings.rollout_prompt,
    }

    drafter = DFlashDrafter(drafter_config(spec, cfg, mask, settings.scale)).to(device)
    log["draft_parameters"] = count_parameters(drafter)
    say(f"drafter: {log['draft_parameters'] / 1e6:.2f}M parameters, block {spec.block_size}")

    def save_draft() -> None:
        save_atomically(
            pair_dir / "draft", lambda tmp: save_drafter(copy.deepcopy(drafter).to(torch.bfloat16), tmp)
        )
        save_log_and_archive()

    def rollout_batch(batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.randint(0, sequences.shape[0], (batch,), generator=generator)
        return sequences[rows], last_valid[rows]

    draft_log = train_drafter(
        drafter,
        target,
        rollout_batch,
        False,
        TrainBudget(settings.draft_steps, settings.draft_seconds, peak_lr=settings.draft_lr),
        settings.draft_batch,
        settings.blocks_per_sequence,
        spec.loss_gamma,
        settings.seed,
        save_draft,
        settings.checkpoint_every,
        say=say,
    )
    log["draft"] = {**draft_log.summary(), "history": draft_log.history}
    save_log_and_archive()
    say("done")
    return log


def train_zoo(
    out: Path,
    pairs: list[str],
    settings: TrainSettings,
    corpus_roots: list[Path] | None = None,
    parallel: bool = False,
    archive_dir: Path | None = None,
    reuse_data: bool = False,
) -> None:
    """Prepare the data once (or reuse OUT's), then train each pair (side by side when `parallel`)."""
    for name in pairs:
        pair_spec(name)  # fail on a bad name before minutes of work
    if not reuse_data:
        prepare_data(out, corpus_roots, settings, print)
    elif not (out / "tokens" / "train.pt").is_file() or not (out / "tokenizer").is_dir():
        raise SpecdeployError(f"--reuse-data: {out} holds no tokenizer and tokens from an earlier run")
    if not parallel:
        for name in pairs:
            train_pair(name, out, settings, archive_dir)
        return
    # Tiny models leave a big GPU mostly idle, so pairs train side by side; spawn keeps CUDA happy.
    context = multiprocessing.get_context("spawn")
    threads = max(1, (os.cpu_count() or 1) // len(pairs))
    workers = [
        context.Process(target=train_pair, args=(name, out, settings, archive_dir, threads)) for name in pairs
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    failed = [name for name, worker in zip(pairs, workers, strict=True) if worker.exitcode != 0]
    if failed:
        raise RuntimeError(f"training failed for {', '.join(failed)}; see the log above")


def retrain_drafter(pair_dir: Path, corpus_roots: list[Path] | None, settings: TrainSettings) -> dict:
    """Continue training a pair's drafter against its frozen, already trained target on fresh corpus
    windows, labelled with the target's greedy tokens; the log's `draft_retrain` list gains an entry."""
    spec = pair_spec(pair_dir.name)

    def say(message: str) -> None:
        print(f"[{spec.name}] {message}", flush=True)

    seed_everything(settings.seed)
    device = torch.device(settings.device)
    tokenizer = load_tokenizer(pair_dir / "target")
    corpus = collect_corpus(corpus_roots, settings.max_files)
    stream = encode_documents(tokenizer, corpus.texts("train")).to(device)
    say(
        f"corpus: Python {corpus.python_version}, {len(corpus.split('train'))} train files, {stream.numel():,} tokens"
    )
    target = AutoModelForCausalLM.from_pretrained(str(pair_dir / "target"), dtype=torch.float32).to(device)
    drafter = load_drafter(pair_dir / "draft", device=device).train()
    log = json.loads((pair_dir / "train_log.json").read_text())

    def save_draft() -> None:
        save_atomically(
            pair_dir / "draft", lambda tmp: save_drafter(copy.deepcopy(drafter).to(torch.bfloat16), tmp)
        )
        (pair_dir / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")

    def window_batch(batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        windows = sample_windows(stream, batch, settings.seq_len, generator)
        return windows, torch.full((batch,), settings.seq_len - 1)

    draft_log = train_drafter(
        drafter,
        target,
        window_batch,
        True,
        TrainBudget(settings.draft_steps, settings.draft_seconds, peak_lr=settings.draft_lr),
        settings.draft_batch,
        settings.blocks_per_sequence,
        spec.loss_gamma,
        settings.seed,
        save_draft,
        settings.checkpoint_every,
        say=say,
    )
    log.setdefault("draft_retrain", []).append(
        {
            **draft_log.summary(),
            "history": draft_log.history,
            "data": f"{settings.seq_len}-token windows of the Python {corpus.python_version} corpus training split, "
            "labelled with the target's greedy tokens",
            "settings": asdict(settings),
            "versions": {
                "python": platform.python_version(),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
            },
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        }
    )
    save_draft()
    return log
