"""Where `--budget auto`'s time goes: batch engines with fixed budgets and with the auto policy, without a server.

    python benchmarks/auto_step_trace.py --device cuda --concurrency 1,16 --budgets 32,64 --out trace.json

For each concurrency, each engine (AR, every fixed DDTree budget, auto: 0 and powers of two up to the largest
budget) runs the same closed loop: `--requests` requests of `--max-new-tokens` tokens (EOS ignored) from the
demo's code prompts, `concurrency` at a time, after one warm-up pass over the prompts; with `--rounds N`, every
engine runs in turn N times (built once, so auto keeps what it learnt, as a server does between cells). Per run it
prints output tok/s, tokens per step, ms per step (the runner's step, its whole iteration, and the policy's choose
and observe), and for auto the share of steps and the ms per step at each budget, with the policy's own
/server_info state; then each engine's mean over the rounds and auto's ratio to the best other engine. The JSON
has them all (and every auto step when `--steps-out`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict

import torch

from specdeploy.engine.batch import BatchEngine
from specdeploy.engine.budget import BudgetPolicy, powers_of_two
from specdeploy.engine.loading import load_drafter, load_target
from specdeploy.engine.runtime import load_tokenizer
from specdeploy.engine.sampling import SamplingParams
from specdeploy.zoo.prompts import DEMO_PROMPTS
from specdeploy.zoo.registry import resolve_models


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_loop(
    engine: BatchEngine,
    prompts: list[list[int]],
    concurrency: int,
    requests: int,
    new: int,
    explain: bool = False,
) -> dict:
    """Closed loop: keep `concurrency` requests submitted until `requests` have finished; time every part.
    `explain`: record, for every auto step, the policy's tok/s estimate of each budget when it chose."""
    policy = engine.policy
    timings: dict[str, float] = defaultdict(float)
    steps: list[dict] = []
    estimates: list[dict] = []
    if policy is not None:  # time the policy's own host work
        choose, observe = policy.choose, policy.observe

        def timed_choose(running, windows):
            started = time.perf_counter()
            budget = choose(running, windows)
            timings["choose_s"] += time.perf_counter() - started
            if explain:  # after the timing: this is the diagnostic's own work
                estimates.append({b: round(policy.throughput(running, b, windows)) for b in policy.budgets})
            return budget

        def timed_observe(budget, accept_lengths, seconds=None, *args, **kwargs):
            started = time.perf_counter()
            observe(budget, accept_lengths, seconds, *args, **kwargs)
            timings["observe_s"] += time.perf_counter() - started
            steps.append({"budget": budget, "rows": len(accept_lengths), "tokens": sum(accept_lengths),
                          "step_ms": 1e3 * (seconds or 0.0)})  # fmt: skip

        policy.choose, policy.observe = timed_choose, timed_observe
    runner_step = engine.runner.step

    def timed_step(*args, **kwargs):
        started = time.perf_counter()
        out = runner_step(*args, **kwargs)
        timings["step_s"] += time.perf_counter() - started
        timings["steps"] += 1
        timings["tokens"] += sum(len(tokens) for tokens, _ in out)
        return out

    engine.runner.step = timed_step
    submitted = finished = 0
    params = SamplingParams(max_new_tokens=new, ignore_eos=True)
    sync(engine.device)
    started = time.perf_counter()
    while finished < requests:
        while submitted < requests and engine.num_running + engine.num_waiting < concurrency:
            engine.submit(prompts[submitted % len(prompts)], params)
            submitted += 1
        for event in engine.iterate():
            if event.request.finished:
                finished += 1
    sync(engine.device)
    wall = time.perf_counter() - started
    engine.runner.step = runner_step
    if policy is not None:
        policy.choose, policy.observe = choose, observe
    iterations = max(timings["steps"], 1)
    result = {
        "output_tok_s": requests * new / wall,
        "tokens_per_step": timings["tokens"] / iterations / concurrency,
        "iteration_ms": 1e3 * wall / iterations,
        "step_ms": 1e3 * timings["step_s"] / iterations,
        "choose_ms": 1e3 * timings["choose_s"] / iterations,
        "observe_ms": 1e3 * timings["observe_s"] / iterations,
    }
    if policy is not None:
        by_budget: dict[int, list[dict]] = defaultdict(list)
        for step in steps:
            by_budget[step["budget"]].append(step)
        result["by_budget"] = {
            b: {
                "share": len(s) / len(steps),
                "step_ms_median": statistics.median(x["step_ms"] for x in s),
                "tokens_per_row": sum(x["tokens"] for x in s) / sum(x["rows"] for x in s),
            }  # fmt: skip
            for b, s in sorted(by_budget.items())
        }
        result["policy"] = policy.describe()
        if explain:
            for step, estimate in zip(steps, estimates, strict=False):
                step["tok_s_estimates"] = estimate
        result["steps"] = steps
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pair", default="tiny-code")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--budgets", default="32,64", help="fixed DDTree budgets; auto picks among 0 and powers of "
                        "two up to the largest")  # fmt: skip
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-context", type=int, default=1024, help="positions per row of every engine's "
                        "caches: one size for all, as a server's --context-length (a cache sized to each engine's "
                        "own tree would give smaller trees smaller attention windows)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=1, help="runs of every engine in turn (the engines are built "
                        "once per concurrency, so a load that changes hits all alike; auto keeps what it learnt)")  # fmt: skip
    parser.add_argument("--out", help="JSON file, rewritten after every engine")
    parser.add_argument("--steps-out", action="store_true", help="keep every auto step in the JSON, with the "
                        "policy's tok/s estimate of every budget at its choice")  # fmt: skip
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    budgets = [int(b) for b in args.budgets.split(",")]
    target_path, draft_path = resolve_models(f"zoo:{args.pair}", None, "ddtree", max(budgets))
    target = load_target(target_path, device=device, dtype=dtype)
    drafter = load_drafter(draft_path, device=device, dtype=dtype)
    tokenize = load_tokenizer(target_path)
    prompts = [tokenize(p)["input_ids"] for p in DEMO_PROMPTS]
    longest = max(len(p) for p in prompts) + args.max_new_tokens + 1
    if args.max_context < longest:
        parser.error(f"--max-context {args.max_context} is below the longest request's {longest} positions")
    context = args.max_context
    report: dict = {"pair": args.pair, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "torch": torch.__version__, "args": vars(args), "cells": []}  # fmt: skip
    for concurrency in [int(c) for c in args.concurrency.split(",")]:
        specs = [("ar", None, None)] + [(f"ddtree-{b}", b, None) for b in budgets]
        specs.append(("auto", max(budgets), [0, *powers_of_two(max(budgets))]))
        engines = {}
        for name, budget, auto in specs:  # all built first: each round runs every engine, so a load hits all
            policy = BudgetPolicy(auto) if auto else None
            engines[name] = BatchEngine(target, drafter if budget else None, "ddtree" if budget else "ar", budget,
                                        max_running=concurrency, max_context=context, policy=policy)  # fmt: skip
            run_loop(
                engines[name], prompts, concurrency, len(prompts), 8
            )  # warm-up: every prompt length once
        for round_ in range(args.rounds):
            for name, engine in engines.items():
                cell = run_loop(
                    engine, prompts, concurrency, args.requests, args.max_new_tokens, args.steps_out
                )
                if not args.steps_out:
                    cell.pop("steps", None)
                cell.update(engine=name, concurrency=concurrency, round=round_, startup_s=engine.startup_s)
                report["cells"].append(cell)
                print(f"c={concurrency} round {round_} {name:10s} {cell['output_tok_s']:9.1f} tok/s  "
                      f"{cell['tokens_per_step']:.2f} tok/step  iteration {cell['iteration_ms']:.3f} ms  step "
                      f"{cell['step_ms']:.3f}  choose {cell['choose_ms']:.3f}  observe {cell['observe_ms']:.3f}",
                      flush=True)  # fmt: skip
                for b, share in cell.get("by_budget", {}).items():
                    print(f"    budget {b:3d}: {100 * share['share']:5.1f}% of steps, {share['step_ms_median']:.3f} "
                          f"ms, {share['tokens_per_row']:.2f} tok/row", flush=True)  # fmt: skip
                if args.out:
                    with open(args.out, "w") as f:
                        json.dump(report, f, indent=1, default=str)
        means = {name: statistics.mean(c["output_tok_s"] for c in report["cells"]
                                       if c["engine"] == name and c["concurrency"] == concurrency)
                 for name in engines}  # fmt: skip
        best = max((n for n in means if n != "auto"), key=means.get)
        report.setdefault("auto_over_best", {})[concurrency] = {
            "best": best,
            "ratio": means["auto"] / means[best],
        }
        print(f"c={concurrency} mean over {args.rounds} round(s): "
              + ", ".join(f"{n} {t:.1f}" for n, t in means.items())
              + f"; auto / {best} = {means['auto'] / means[best]:.3f}", flush=True)  # fmt: skip
        if args.out:
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1, default=str)
        del engines
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
