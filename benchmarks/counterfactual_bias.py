"""What a step's tree tells of smaller budgets against what runs at those budgets commit, per step.

    python benchmarks/counterfactual_bias.py --budgets 4,16,64 --prompts 12 --out bias.json

A predicting step at budget B tells, exactly, what each smaller budget b would have committed from the same state
(`tree.realised_accept_lengths`: b's tree is the best-scored prefix of B's). `--budget auto` calibrates each
budget by such counterfactual steps. They are exact per step, but a run at b starts its steps elsewhere than a run
at B: where b's tree ran out of nodes while B's went on, b's next step starts inside a stretch its drafts match,
which B's steps never do; so the counterfactuals sample b's acceptance at B's step boundaries, not at b's own.
Here, for each budget run alone (batch 1, fp32 on a CPU, greedy, the zoo pair on HumanEval prompts, every step
predicting), the tokens a step committed, and the mean counterfactual of every smaller budget; the ratio of a
budget's own run to its counterfactual from larger runs is the bias.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from specdeploy.bench.workloads import WorkloadOptions, load_prompts
from specdeploy.engine.batch import BatchEngine
from specdeploy.engine.loading import load_drafter, load_target
from specdeploy.engine.runtime import load_tokenizer
from specdeploy.engine.sampling import SamplingParams
from specdeploy.engine.tree import realised_accept_lengths
from specdeploy.zoo.registry import resolve_pair


def run(target, drafter, prompt_ids: list[int], budget: int, told: list[int], tokens: int):
    """Steps of one request at `budget` until it has `tokens` tokens: the tokens each committed, and what each told
    of the budgets `told` (the length limit lies beyond any step's reach, so that none is cut by it)."""
    limit = tokens + budget + 1
    engine = BatchEngine(
        target, drafter, "ddtree", budget, max_running=1, max_context=len(prompt_ids) + limit + 8
    )
    runner = engine.runner
    runner.predict_acceptance(told, every=1)
    runner.begin(prompt_ids, SamplingParams(max_new_tokens=limit, ignore_eos=True), None)
    while runner.prefill(runner.prefill_remaining) is None:
        pass
    committed, counterfactual, done = [], [], 1  # the prefill made the first token
    while done < tokens:
        ((step_tokens, _),) = runner.step(budget)
        committed.append(len(step_tokens))
        counterfactual.append(realised_accept_lengths(*runner.walked, told)[0].tolist())
        done += len(step_tokens)
    return committed, counterfactual


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pair", default="tiny-code")
    parser.add_argument("--budgets", default="4,16,64")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--out")
    args = parser.parse_args()
    budgets = sorted(int(b) for b in args.budgets.split(","))
    target_dir, draft_dir = resolve_pair(args.pair)
    target = load_target(target_dir, device=torch.device("cpu"), dtype=torch.float32)
    drafter = load_drafter(draft_dir, device=torch.device("cpu"), dtype=torch.float32)
    tokenize = load_tokenizer(target_dir)
    prompts = [
        tokenize(p.turns[0])["input_ids"]
        for p in load_prompts(WorkloadOptions("humaneval", num_prompts=args.prompts))
    ]
    rows = {}
    for budget in budgets:
        told = [b for b in budgets if b <= budget]
        committed, counterfactual = [], []
        for prompt in prompts:
            c, t = run(target, drafter, prompt, budget, told, args.tokens)
            committed += c
            counterfactual += t
        means = {b: statistics.mean(step[i] for step in counterfactual) for i, b in enumerate(told)}
        rows[budget] = {"steps": len(committed), "committed_per_step": statistics.mean(committed),
                        "counterfactual_per_step_by_budget": means}  # fmt: skip
        told_text = ", ".join(f"{b}: {m:.3f}" for b, m in means.items())
        print(f"run at {budget:3d}: {len(committed)} steps, {rows[budget]['committed_per_step']:.3f} tokens a step; "
              f"its steps tell {told_text}", flush=True)  # fmt: skip
    for budget in budgets:
        own = rows[budget]["committed_per_step"]
        for larger in (b for b in budgets if b > budget):
            told = rows[larger]["counterfactual_per_step_by_budget"][budget]
            print(
                f"budget {budget} run alone over its counterfactual from runs at {larger}: {own / told:.3f}"
            )
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
