"""Continuous batching against one request at a time: the same greedy requests, both ways, in one run.

    python benchmarks/batching_speed.py --pairs tiny-code,tiny-hybrid --modes ar,ddtree-8 --out result.json

For each shipped pair and mode, N held-out prompts run one after another (an engine of one row, each request
submitted when the previous one finished) and all at once (an engine of N rows, all submitted together); the
two take turns for --rounds rounds and each keeps its fastest. Prints the concurrent time as a fraction of the
sequential one (lower is better) and checks that every concurrent output equals its single output.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from specdeploy.engine.batch import BatchEngine  # noqa: E402
from specdeploy.engine.loading import load_drafter, load_target  # noqa: E402
from specdeploy.engine.runtime import load_tokenizer  # noqa: E402
from specdeploy.engine.sampling import SamplingParams  # noqa: E402
from specdeploy.zoo.prompts import held_out_prompts  # noqa: E402
from specdeploy.zoo.registry import get_pair  # noqa: E402


def drain(
    engine: BatchEngine, prompts: list[list[int]], params: SamplingParams, together: bool
) -> list[list[int]]:
    """Every prompt's output tokens, submitted all at once or each after the previous one finished."""
    outputs = []
    batches = [prompts] if together else [[p] for p in prompts]
    for batch in batches:
        requests = [engine.submit(p, params) for p in batch]
        tokens: dict[int, list[int]] = {r.id: [] for r in requests}
        while not engine.idle:
            for event in engine.iterate():
                if event.error is not None:
                    raise RuntimeError(event.error)
                tokens[event.request.id] += event.step.token_ids
        outputs += [tokens[r.id] for r in requests]
    return outputs


def measure(pair_name: str, mode_key: str, args: argparse.Namespace) -> dict:
    pair = get_pair(pair_name)
    tokenizer = load_tokenizer(pair.target_dir)
    trained = {f["sha256"] for f in pair.corpus()["files"] if f["split"] == "train"}
    texts, _ = held_out_prompts(tokenizer.encode, args.requests, trained)
    prompts = [tokenizer.encode(text)[: args.prompt_tokens] for text in texts]
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    target = load_target(pair.target_dir, args.device, dtype)
    mode, _, budget = mode_key.partition("-")
    drafter = load_drafter(pair.draft_dir, args.device, dtype) if mode != "ar" else None
    params = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True)
    context = max(len(p) for p in prompts) + args.new_tokens
    engines = {
        together: BatchEngine(target, drafter, mode, int(budget) if budget else None,
                              max_running=len(prompts) if together else 1, max_context=context)
        for together in (False, True)
    }  # fmt: skip
    best = {False: float("inf"), True: float("inf")}
    outputs = {}
    for _ in range(args.rounds):
        for together, engine in engines.items():
            started = time.perf_counter()
            outputs[together] = drain(engine, prompts, params, together)
            best[together] = min(best[together], time.perf_counter() - started)
    row = {
        "pair": pair_name,
        "mode": mode_key,
        "requests": len(prompts),
        "sequential_s": best[False],
        "concurrent_s": best[True],
        "concurrent_over_sequential": best[True] / best[False],
        "same_outputs": sum(a == b for a, b in zip(outputs[True], outputs[False], strict=True)),
    }
    print(f"{pair_name:<12} {mode_key:<9} one at a time {best[False]:7.2f} s   all at once {best[True]:7.2f} s   "
          f"ratio {row['concurrent_over_sequential']:.3f}   same outputs {row['same_outputs']}/{len(prompts)}",
          flush=True)  # fmt: skip
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", default="tiny-code,tiny-hybrid")
    parser.add_argument("--modes", default="ar,ddtree-8", help="ar, dflash or ddtree-B, comma-separated")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=64, help="each prompt cut to this many tokens")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = [measure(pair, mode, args) for pair in args.pairs.split(",") for mode in args.modes.split(",")]
    if args.out is not None:
        meta = {"machine": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
                "threads": torch.get_num_threads(), "command": " ".join(sys.argv)}  # fmt: skip
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
