"""Training the zoo in resumable chunks: shared data, then per pair: target -> greedy rollouts -> drafter.

One invocation works until its time limit (or SIGTERM / Ctrl-C), checkpoints and returns; the next one, with
the same options, continues where it stopped, until every stage's budget is spent.

Output layout (OUT/corpus.json and each pair's target/, draft/ and train_log.json are what ships):
    OUT/corpus.json, OUT/tokenizer/, OUT/tokens/    shared data (see zoo/data.py)
    OUT/<pair>/target/           transformers checkpoint (config.json, bf16 safetensors, tokenizer)
    OUT/<pair>/draft/            DFlash drafter in z-lab's format
    OUT/<pair>/train_log.json    settings, corpus, every stage's steps, losses and history, every chunk
    OUT/<pair>/state/            resume state: fp32 weights, optimizer, generators, rollout shards
"""

from __future__ import annotations

import copy
import json
import os
import platform
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM

from specdeploy.engine.drafter import DFlashDrafter
from specdeploy.engine.loading import save_drafter
from specdeploy.engine.runtime import load_tokenizer
from specdeploy.errors import SpecdeployError
from specdeploy.zoo.archive import archive_pair
from specdeploy.zoo.checkpoint import bf16_state_dict, save_atomically
from specdeploy.zoo.chunk import ChunkLimit
from specdeploy.zoo.data import CORPUS_FILE, prepare_data
from specdeploy.zoo.locks import exclusive
from specdeploy.zoo.loop import Resumable, train_loop
from specdeploy.zoo.rollouts import RolloutStore, distinct_prompts, generate_rollouts
from specdeploy.zoo.schedule import TrainBudget
from specdeploy.zoo.settings import ChunkOptions, DataOptions, TrainSettings
from specdeploy.zoo.specs import PairSpec, drafter_config, pair_spec, target_config
from specdeploy.zoo.tokenizer import EOS_TOKEN, MASK_TOKEN
from specdeploy.zoo.train_drafter import drafter_optimizer, drafter_step, last_valid_positions
from specdeploy.zoo.train_target import held_out_loss, target_optimizer, target_step

STAGES = ("target", "rollouts", "draft", "done")
LOG_FILE = "train_log.json"


def versions() -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def write_json_atomically(path: Path, value: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=1) + "\n")
    os.replace(tmp, path)


class PairRun:
    """One pair's training run in OUT/<pair>: its log, its stages, and this invocation's chunk."""

    def __init__(
        self,
        spec: PairSpec,
        out: Path,
        settings: TrainSettings,
        data: dict,
        chunk: ChunkOptions,
        limit: ChunkLimit,
    ) -> None:
        self.spec, self.out, self.settings, self.chunk, self.limit = spec, out, settings, chunk, limit
        self.dir = out / spec.name
        self.state = self.dir / "state"
        self.device = torch.device(chunk.device)
        self.tokenizer = load_tokenizer(out / "tokenizer")
        self.eos, self.mask = self.tokenizer.convert_tokens_to_ids([EOS_TOKEN, MASK_TOKEN])
        self.log = self.open_log(data)
        self.chunk_record = {
            "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "device": device_name(self.device),
            "versions": versions(),
            "stages": [],
            "seconds": 0.0,
            "ended": "running",
        }
        self.started = time.monotonic()

    def say(self, message: str) -> None:
        print(f"[{self.spec.name}] {message}", flush=True)

    def open_log(self, data: dict) -> dict:
        path = self.dir / LOG_FILE
        settings = asdict(self.settings)
        if path.is_file():
            log = json.loads(path.read_text())
            changed = sorted(k for k, v in settings.items() if log["settings"].get(k) != v)
            changed += sorted(f"pair {k}" for k, v in asdict(self.spec).items() if log["pair"].get(k) != v)
            if changed:
                raise SpecdeployError(
                    f"{self.dir} holds a run with other settings ({', '.join(changed)}): continue it with the "
                    "same options, or choose another --out"
                )
            if log["corpus"]["sha256"] != data["corpus_sha256"]:
                raise SpecdeployError(
                    f"{self.dir} was trained on other data than {self.out / CORPUS_FILE} holds"
                )
            return log
        return {
            "pair": asdict(self.spec),
            "settings": settings,
            "corpus": {
                "file": CORPUS_FILE,
                "sha256": data["corpus_sha256"],
                "tokens": data["tokens"],
                "vocab_size": data["options"]["vocab_size"],
                "max_files": data["options"]["max_files"],
            },
            "stage": STAGES[0],
            "chunks": [],
        }

    def save_log(self) -> None:
        self.chunk_record["seconds"] = round(time.monotonic() - self.started, 1)
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json_atomically(self.dir / LOG_FILE, self.log)
        if self.chunk.archive_dir is not None:
            archive_pair(self.dir, self.chunk.archive_dir, self.chunk.archive_part_bytes)

    def stream(self, split: str) -> torch.Tensor:
        return torch.load(self.out / "tokens" / f"{split}.pt").to(self.device)

    def run(self) -> bool:
        """Work through the stages until done (True) or this chunk's limit (False)."""
        stage_functions = {
            "target": self.train_target,
            "rollouts": self.make_rollouts,
            "draft": self.train_draft,
        }
        if self.log["stage"] == "done":
            self.say("finished earlier; nothing to do")
            return True
        self.log["chunks"].append(self.chunk_record)
        try:
            while self.log["stage"] != "done" and not self.limit.reached():
                stage = self.log["stage"]
                self.chunk_record["stages"].append(stage)
                if not stage_functions[stage]():
                    break
                self.log["stage"] = STAGES[STAGES.index(stage) + 1]
                self.save_log()
            self.chunk_record["ended"] = "finished" if self.log["stage"] == "done" else self.limit.reason
        except BaseException as exc:
            self.chunk_record["ended"] = f"error: {type(exc).__name__}: {exc}"
            raise
        finally:
            self.save_log()
        return self.log["stage"] == "done"

    # -- target ------------------------------------------------------------------------------------------

    def new_target(self) -> torch.nn.Module:
        cfg = target_config(self.spec, self.eos, self.settings.scale)
        cfg.vocab_size = len(self.tokenizer)
        torch.manual_seed(self.settings.seed)
        return AutoModelForCausalLM.from_config(cfg).to(self.device)

    def shipped_target(self) -> torch.nn.Module:
        """The saved bf16 target, in fp32: rollouts and the drafter see the weights verification will use."""
        model = AutoModelForCausalLM.from_pretrained(str(self.dir / "target"), dtype=torch.float32)
        return model.to(self.device)

    def train_target(self) -> bool:
        s = self.settings
        model = self.new_target()
        self.log["target_parameters"] = count_parameters(model)
        run = Resumable(
            self.state / "target.pt",
            model,
            target_optimizer(model, s.target_lr),
            torch.Generator().manual_seed(s.seed),
        )
        resumed = run.restore()
        self.say(
            f"target {self.spec.family}: {self.log['target_parameters'] / 1e6:.2f}M parameters, "
            + (f"resuming at step {run.log.steps}" if resumed else "starting")
        )
        train, held_out = self.stream("train"), self.stream("held_out")
        if held_out.numel() <= s.seq_len + 1:
            raise SpecdeployError(
                f"the held-out split has {held_out.numel()} tokens, not one window of --seq-len {s.seq_len}: give "
                "more corpus files or a shorter --seq-len"
            )

        def evaluate() -> float:
            return round(held_out_loss(model, held_out, s.target_batch, s.seq_len, 4, s.seed), 4)

        def checkpoint() -> None:
            run.log.history.append(
                {"step": run.log.steps, "held_out_loss": evaluate(), "s": round(run.log.seconds, 1)}
            )
            run.save()
            self.log["target"] = {**run.log.summary(), "history": run.log.history}
            self.save_log()

        done = train_loop(
            run,
            TrainBudget(s.target_steps, 60 * s.target_minutes, peak_lr=s.target_lr),
            target_step(model, train, s.target_batch, s.seq_len, run.generator),
            self.limit,
            checkpoint,
            60 * self.chunk.checkpoint_minutes,
            self.chunk.log_every,
            "target",
            self.say,
        )
        if done:
            run.log.held_out_loss = evaluate()
            self.say(f"target held-out loss {run.log.held_out_loss:.4f}")
            self.log["target"] = {**run.log.summary(), "history": run.log.history}

            def write(tmp: Path) -> None:
                model.config.dtype = torch.bfloat16  # what the safetensors hold
                model.save_pretrained(str(tmp), state_dict=bf16_state_dict(model))
                self.tokenizer.save_pretrained(str(tmp))

            save_atomically(self.dir / "target", write)
        return done

    # -- rollouts ----------------------------------------------------------------------------------------

    def make_rollouts(self) -> bool:
        s = self.settings
        store = RolloutStore(self.state / "rollouts")
        self.say(f"rollouts: {store.progress.sequences} of {s.rollouts} so far")

        def record() -> None:
            self.log["rollouts"] = {
                **asdict(store.progress),
                "length": s.rollout_prompt + s.rollout_new_tokens,
                "prompt": s.rollout_prompt,
            }
            self.save_log()

        def on_shard() -> None:
            record()
            self.say(f"rollouts: {store.progress.sequences} sequences in {store.progress.seconds:.0f} s")

        done = generate_rollouts(
            self.shipped_target(),
            self.stream("train"),
            store,
            s.rollout_prompt,
            s.rollout_new_tokens,
            s.rollout_batch,
            s.rollouts,
            60 * s.rollout_minutes,
            self.eos,
            s.seed,
            self.limit,
            on_shard,
        )
        record()
        if done:
            self.log["rollouts"]["distinct_prompts"] = distinct_prompts(store.load(), s.rollout_prompt)
        return done

    # -- drafter -----------------------------------------------------------------------------------------

    def train_draft(self) -> bool:
        s = self.settings
        target = self.shipped_target()
        torch.manual_seed(s.seed + 1)  # the same initial drafter whichever chunk starts this stage
        drafter = DFlashDrafter(drafter_config(self.spec, target.config, self.mask, s.scale)).to(self.device)
        self.log["draft_parameters"] = count_parameters(drafter)
        rows = RolloutStore(self.state / "rollouts").load()
        last_valid = last_valid_positions(rows, s.rollout_prompt, self.eos)
        run = Resumable(
            self.state / "draft.pt",
            drafter,
            drafter_optimizer(drafter, s.draft_lr),
            torch.Generator().manual_seed(s.seed),
            extra={"epoch": 0, "cursor": 0},
        )
        resumed = run.restore()
        self.say(
            f"drafter: {self.log['draft_parameters'] / 1e6:.2f}M parameters, block {self.spec.block_size}, "
            f"{rows.shape[0]} rollouts; " + (f"resuming at step {run.log.steps}" if resumed else "starting")
        )
        order = self.epoch_order(run.extra["epoch"], rows.shape[0])

        def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
            """The next rows of this epoch's shuffled order: each rollout is seen once per pass."""
            nonlocal order
            position = run.extra
            if position["cursor"] + s.draft_batch > rows.shape[0]:
                position["epoch"], position["cursor"] = position["epoch"] + 1, 0
                order = self.epoch_order(position["epoch"], rows.shape[0])
            picked = order[position["cursor"] : position["cursor"] + s.draft_batch]
            position["cursor"] += s.draft_batch
            return rows[picked], last_valid[picked]

        def checkpoint() -> None:
            run.save()
            self.log["draft"] = {
                **run.log.summary(),
                "passes_over_rollouts": round(run.log.steps * s.draft_batch / rows.shape[0], 2),
                "history": run.log.history,
            }
            self.save_log()

        step = drafter_step(
            drafter,
            target,
            next_batch,
            s.blocks_per_sequence,
            self.spec.loss_gamma,
            s.rollout_prompt
            - 1,  # anchors on the last prompt token or later: labels are then the target's own
            run.generator,
        )
        done = train_loop(
            run,
            TrainBudget(s.draft_steps, 60 * s.draft_minutes, peak_lr=s.draft_lr),
            step,
            self.limit,
            checkpoint,
            60 * self.chunk.checkpoint_minutes,
            self.chunk.log_every,
            "draft",
            self.say,
        )
        if done:
            save_atomically(
                self.dir / "draft", lambda tmp: save_drafter(copy.deepcopy(drafter).to(torch.bfloat16), tmp)
            )
        return done

    def epoch_order(self, epoch: int, rows: int) -> torch.Tensor:
        return torch.randperm(
            rows, generator=torch.Generator().manual_seed(self.settings.seed * 1_000_003 + epoch)
        )


def train_zoo(
    out: Path,
    pairs: list[str],
    settings: TrainSettings,
    data_options: DataOptions,
    chunk: ChunkOptions,
    limit: ChunkLimit | None = None,
) -> dict[str, bool]:
    """Prepare (or reuse) OUT's data, then train each pair in turn until done or this invocation's limit
    (`limit`, by default --max-minutes from `chunk`). Returns each pair's state: True when finished.
    """
    specs = [pair_spec(name) for name in pairs]  # fail on a bad name before minutes of work
    transformers.utils.logging.disable_progress_bar()  # a bar per save and load would bury the training log
    limit = limit or ChunkLimit(None if chunk.max_minutes is None else 60 * chunk.max_minutes)
    finished: dict[str, bool] = {}
    with limit.catching_signals():
        data = prepare_data(out, data_options, print)
        for spec in specs:
            if limit.reached():
                finished[spec.name] = False
                continue
            with exclusive(out / spec.name / ".lock", wait=False, what=f"{out / spec.name}"):
                finished[spec.name] = PairRun(spec, out, settings, data, chunk, limit).run()
    return finished
