"""An AR step of a drafting engine (DDTree's budget 0) against a pure AR engine's step, on the CPU.

    python benchmarks/ar_step_cost_cpu.py --rounds 12 --steps 10

Two batch engines on the zoo's tiny-code pair (fp32, one torch thread, 8 rows, the demo's 8 prompts prefilled):
AR, and DDTree with its drafter taking budget-0 steps only. Each round times `--steps` steps of one engine, then
of the other (alternated, so a load change on a shared machine hits both alike); prints the median seconds per
step of each and their ratio. The DDTree engine's AR steps keep their target features pending and take them in
(one drafter write) when the pending buffer would overflow, which these runs include.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdeploy.engine.batch import BatchEngine
from specdeploy.engine.loading import load_drafter, load_target
from specdeploy.engine.runtime import load_tokenizer, set_cpu_threads
from specdeploy.engine.sampling import SamplingParams
from specdeploy.zoo.prompts import DEMO_PROMPTS
from specdeploy.zoo.registry import resolve_models


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=10, help="steps per engine per round")
    args = parser.parse_args()
    set_cpu_threads(1)
    target_path, draft_path = resolve_models("zoo:tiny-code", None, "ddtree", 16)
    target, drafter = load_target(target_path), load_drafter(draft_path, dtype=torch.float32)
    prompts = [load_tokenizer(target_path)(p)["input_ids"] for p in DEMO_PROMPTS]
    max_new = args.rounds * args.steps + 1  # no request finishes: every step runs 8 rows
    context = max(512, 64 + max_new)  # the demo prompts are under 64 tokens; 512 as auto_budget_cpu's servers
    engines = {
        "ar": BatchEngine(target, None, "ar", None, max_running=8, max_context=context),
        "ddtree-budget-0": BatchEngine(target, drafter, "ddtree", 16, max_running=8, max_context=context),
    }
    for engine in engines.values():
        for prompt in prompts:
            engine.submit(prompt, SamplingParams(max_new_tokens=max_new, ignore_eos=True))
        while len(engine.running) < len(prompts):
            engine.iterate()
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.rounds):
        for name, engine in engines.items():
            budget = 0 if name != "ar" else None
            started = time.perf_counter()
            for _ in range(args.steps):
                engine.runner.step(budget)
            seconds[name].append((time.perf_counter() - started) / args.steps)
    medians = {name: statistics.median(s) for name, s in seconds.items()}
    print(", ".join(f"{name} {1e3 * s:.2f} ms/step" for name, s in medians.items())
          + f"; ratio {medians['ddtree-budget-0'] / medians['ar']:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
