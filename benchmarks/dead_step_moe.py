"""What a dead step times on an MoE target, against real steps: step ms and the share of experts routed to.

    python benchmarks/dead_step_moe.py --out dead_step_moe.json

`--budget auto`'s start-up cost times dead steps (`StepRunner.dead_step`), whose rows hold no sequence. An MoE
target reads the experts its tokens route to, so what a dead row verifies sets what its step costs. This builds a
random qwen3_moe target (64 experts, top 4; `--hidden`, `--experts`, `--top-k`) and a random DFlash drafter of
its width, then, at `--rows` rows and each of `--budgets` (0: an AR step), times dead steps whose rows all verify
one root (as before 2026-12-05) and dead steps with distinct random roots (`_distinct_dead_roots`), against real
steps of as many requests with random prompts, and prints each one's median ms and mean share of the experts
its MoE layers routed to. CPU by default (one torch thread); on CUDA eager, without CUDA graphs, so that the MoE
layers' routing can be counted (a captured step replays without running Python).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

from specdeploy.engine.batch import BatchEngine
from specdeploy.engine.drafter import DFlashDrafter
from specdeploy.engine.loading import load_drafter, load_target, save_drafter
from specdeploy.engine.models.moe import Experts
from specdeploy.engine.sampling import SamplingParams
from specdeploy.engine.step import StepRunner

VOCAB = 512
HEAD_DIM = 64


def write_pair(root: Path, hidden: int, experts: int, top_k: int) -> tuple[Path, Path]:
    config = Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=4, num_attention_heads=hidden // HEAD_DIM,
        num_key_value_heads=2, head_dim=HEAD_DIM, max_position_embeddings=1024, eos_token_id=VOCAB - 2,
        bos_token_id=0, pad_token_id=0, tie_word_embeddings=False, intermediate_size=2 * hidden,
        moe_intermediate_size=hidden, num_experts=experts, num_experts_per_tok=top_k, decoder_sparse_step=1,
        mlp_only_layers=[],
    )  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(root / "target")
    drafter = DFlashDrafter({
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": hidden,
        "num_hidden_layers": 2, "num_attention_heads": hidden // HEAD_DIM, "num_key_value_heads": 2,
        "head_dim": HEAD_DIM, "intermediate_size": 2 * hidden, "rms_norm_eps": 1e-6, "max_position_embeddings": 1024,
        "rope_theta": 10000.0, "num_target_layers": 4, "block_size": 8, "vocab_size": VOCAB,
        "dflash_config": {"target_layer_ids": [0, 2], "mask_token_id": VOCAB - 1},
    })  # fmt: skip
    save_drafter(drafter, root / "draft")
    return root / "target", root / "draft"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--budgets", default="0,4,16")
    parser.add_argument("--repeats", type=int, default=9, help="steps timed per cell")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.device == "cpu":
        torch.set_num_threads(1)
    device = torch.device(args.device)
    synchronize = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    with tempfile.TemporaryDirectory() as folder:
        target_dir, draft_dir = write_pair(Path(folder), args.hidden, args.experts, args.top_k)
        target = load_target(target_dir, device=device, dtype=torch.float32)
        drafter = load_drafter(draft_dir, device=device, dtype=torch.float32)
    routed: list[tuple[int, float]] = []  # (tokens, share of the experts reached) per MoE layer call
    forward = Experts.forward

    def counting(self, x, weights, indices, shared=None):
        routed.append((indices.shape[0], indices.unique().numel() / self.num_experts))
        return forward(self, x, weights, indices, shared)

    Experts.forward = counting
    rows, generator = args.rows, torch.Generator().manual_seed(1)
    cells: dict[str, dict[int, dict]] = defaultdict(dict)
    for budget in [int(b) for b in args.budgets.split(",")]:
        tokens = rows * (budget + 1)
        runner = StepRunner(target, drafter, "ddtree", max(budget, 1), rows=rows, cuda_graphs=False)
        runner.reserve(256)
        distinct = runner._distinct_dead_roots
        for label, roots in (("dead, one root", lambda r: None), ("dead, distinct roots", distinct)):
            runner._distinct_dead_roots = roots
            runner.dead_step(rows, budget)  # warm-up
            routed.clear()
            times = []
            for _ in range(args.repeats):
                synchronize()
                started = time.perf_counter()
                runner.dead_step(rows, budget)
                synchronize()
                times.append(time.perf_counter() - started)
            cells[label][budget] = {"ms": statistics.median(times) * 1e3, "experts": share(routed, tokens)}
        engine = BatchEngine(
            target, drafter, "ddtree", max(budget, 1), max_running=rows, max_context=256, cuda_graphs=False
        )
        for _ in range(rows):
            prompt = torch.randint(3, VOCAB - 3, (30,), generator=generator).tolist()
            engine.submit(prompt, SamplingParams(max_new_tokens=200, ignore_eos=True))
        while engine.num_waiting:
            engine.iterate()
        engine.runner.step(budget)  # warm-up
        routed.clear()
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            engine.runner.step(budget)
            times.append(time.perf_counter() - started)
        cells["real"][budget] = {"ms": statistics.median(times) * 1e3, "experts": share(routed, tokens)}
        for label in ("dead, one root", "dead, distinct roots", "real"):
            cell = cells[label][budget]
            print(f"budget {budget:3d} {rows} rows  {label:22s} {cell['ms']:8.2f} ms  experts {cell['experts']:.3f}",
                  flush=True)  # fmt: skip
    Experts.forward = forward
    if args.out:
        result = {
            "command": " ".join(["python", "benchmarks/dead_step_moe.py", *sys.argv[1:]]),
            "device": args.device,
            "torch": torch.__version__,
            "shape": {"hidden": args.hidden, "experts": args.experts, "top_k": args.top_k, "layers": 4},
            "rows": rows,
            "cells": cells,
        }
        args.out.write_text(json.dumps(result, indent=1) + "\n")


def share(routed: list[tuple[int, float]], tokens: int) -> float:
    """Mean share of the experts reached by the MoE calls of a step's verify (`tokens` tokens)."""
    shares = [s for n, s in routed if n == tokens]
    return sum(shares) / len(shares) if shares else float("nan")


if __name__ == "__main__":
    main()
