"""A zoo pair's tokens/s per mode on the CPU, this checkout against another one, measured in one run.

    python benchmarks/cpu_before_after.py --before /path/to/older/checkout --rounds 3 --out result.json
    python benchmarks/cpu_before_after.py --before OLD --pair tiny-hybrid --budgets 16,64 --out result.json

Each round runs both engines, in turn, in fresh processes with one torch thread (the engine's default), on
the demo's prompts (greedy, 128 new tokens), so a load change on a shared machine hits both alike. Both
checkouts load the same shipped pair (this checkout's), so only the engine differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Runs inside the measured checkout: only APIs present in both engines (Decoder, loaders, zoo prompts).
MEASURE = """
import json, sys, time, torch
torch.set_num_threads(1)
from specdeploy.engine.decode import Decoder, SamplingParams
from specdeploy.engine.loading import load_target
try:
    from specdeploy.engine.loading import load_drafter
except ImportError:
    from specdeploy.engine.drafter import load_drafter
from specdeploy.zoo.prompts import DEMO_PROMPTS
from transformers import AutoTokenizer
target_dir, draft_dir, modes = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
tokenizer = AutoTokenizer.from_pretrained(target_dir)
prompts = [tokenizer.encode(text) for text in DEMO_PROMPTS]
target, drafter = load_target(target_dir), load_drafter(draft_dir)
params = SamplingParams(max_new_tokens=128)
out = {}
for mode, budget in modes:
    decoder = Decoder(target, drafter if mode != "ar" else None, mode, budget)
    decoder.generate(prompts[0], SamplingParams(max_new_tokens=8))
    tokens, seconds, accepted, steps = 0, 0.0, 0, 0
    for prompt in prompts:
        started = time.perf_counter()
        result = decoder.generate(prompt, params)
        seconds += time.perf_counter() - started
        tokens += len(result.token_ids)
        accepted += sum(result.accept_lengths)
        steps += result.num_steps
    key = mode if budget is None else f"{mode}-{budget}"
    out[key] = {"tokens_per_s": tokens / seconds, "tau": accepted / steps}
print(json.dumps(out))
"""


def measure(src: Path, pair: tuple[Path, Path], modes: list) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(pair[0]), str(pair[1]), json.dumps(modes)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the older specdeploy")
    parser.add_argument("--pair", default="tiny-code", help="a shipped zoo pair")
    parser.add_argument("--budgets", default="16,32", help="DDTree budgets, besides AR and DFlash")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from specdeploy.zoo.registry import resolve_pair

    pair = resolve_pair(args.pair)
    modes = [("ar", None), ("dflash", None), *(("ddtree", int(b)) for b in args.budgets.split(","))]
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        runs["before"].append(measure(args.before / "src", pair, modes))
        runs["after"].append(measure(ROOT / "src", pair, modes))
    summary = {}
    for key in runs["after"][0]:
        before = sorted(r[key]["tokens_per_s"] for r in runs["before"])[args.rounds // 2]
        after = sorted(r[key]["tokens_per_s"] for r in runs["after"])[args.rounds // 2]
        summary[key] = {
            "before_tokens_per_s": before,
            "after_tokens_per_s": after,
            "ratio": after / before,
            "tau_before": runs["before"][0][key]["tau"],
            "tau_after": runs["after"][0][key]["tau"],
        }
        print(
            f"{key:<10} before {before:7.1f} tok/s   after {after:7.1f} tok/s   {after / before:5.2f}x   "
            f"tau {summary[key]['tau_before']:.2f} -> {summary[key]['tau_after']:.2f}"
        )
    args.out.write_text(
        json.dumps({"command": " ".join(sys.argv), "rounds": runs, "median": summary}, indent=1)
    )


if __name__ == "__main__":
    main()
