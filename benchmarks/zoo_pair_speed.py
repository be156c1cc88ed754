"""Shipped zoo pairs on a GPU: tokens/s and tau per mode on held-out prompts, modes taking turns.

    python benchmarks/zoo_pair_speed.py --pair tiny-code --out result.json
    python benchmarks/zoo_pair_speed.py --pair tiny-code,tiny-hybrid --budgets 16,64 --stage-times --out r.json

Real acceptance (trained pair, held-out prompts, greedy, 128 new tokens), so the speedup over AR is the one a
user would see with this engine on this GPU, in bf16 with CUDA graphs. Several pairs run one after another in
one process, so their ratios compare one machine at one time. `--stage-times` adds, per mode, the milliseconds
per step of each stage (draft, tree, verify, commit, host) over one more, instrumented, request on the first
prompt. The JSON is written after each pair.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from specdeploy.engine.decode import Decoder, SamplingParams  # noqa: E402
from specdeploy.engine.loading import load_drafter, load_target  # noqa: E402
from specdeploy.engine.runtime import load_tokenizer  # noqa: E402
from specdeploy.perf.profile import stage_breakdown  # noqa: E402
from specdeploy.zoo.prompts import held_out_prompts  # noqa: E402
from specdeploy.zoo.registry import get_pair  # noqa: E402


def measure_pair(name: str, args: argparse.Namespace) -> dict:
    """One pair's rows: tau, tokens/s, speedup over AR, outputs equal to AR's, and stage ms if asked."""
    pair = get_pair(name)
    tokenizer = load_tokenizer(pair.target_dir)
    trained = {f["sha256"] for f in pair.corpus()["files"] if f["split"] == "train"}
    texts, sources = held_out_prompts(tokenizer.encode, args.prompts, trained)
    prompts = [tokenizer.encode(text) for text in texts]
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    target = load_target(pair.target_dir, args.device, dtype)
    drafter = load_drafter(pair.draft_dir, args.device, dtype)
    modes = [("ar", None), ("dflash", None), *(("ddtree", int(b)) for b in args.budgets.split(","))]
    decoders = {
        mode if budget is None else f"{mode}-{budget}": Decoder(
            target, drafter if mode != "ar" else None, mode, budget
        )
        for mode, budget in modes
    }
    params = SamplingParams(max_new_tokens=args.new_tokens)
    longest = max(prompts, key=len)  # its caches hold every prompt: no timed request grows (re-captures) them
    for decoder in decoders.values():
        decoder.generate(longest, params)  # warm-up: kernels compile, graphs are captured
    for prompt in prompts:  # a first prefill of each prompt length compiles kernel variants (Triton
        # specialises on sizes and alignments): the mode that happened to meet a length first would pay it
        for decoder in decoders.values():
            decoder.generate(prompt, SamplingParams(max_new_tokens=1))
    totals = {
        key: {"tokens": 0, "seconds": 0.0, "prefill_s": 0.0, "accepted": 0, "steps": 0, "outputs": []}
        for key in decoders
    }
    for prompt in prompts:  # modes take turns prompt by prompt
        for key, decoder in decoders.items():
            started = time.perf_counter()
            result = decoder.generate(prompt, params)
            totals[key]["seconds"] += time.perf_counter() - started
            totals[key]["tokens"] += len(result.token_ids)
            totals[key]["prefill_s"] += result.prefill_s
            totals[key]["accepted"] += sum(result.accept_lengths)
            totals[key]["steps"] += result.num_steps
            totals[key]["outputs"].append(result.token_ids)
    ar = totals["ar"]
    rows = {}
    for key, total in totals.items():
        rate = total["tokens"] / total["seconds"]
        rows[key] = {
            "tau": total["accepted"] / max(total["steps"], 1),
            "tokens_per_s": rate,
            "speedup_vs_ar": rate / (ar["tokens"] / ar["seconds"]),
            "same_output_as_ar": sum(a == b for a, b in zip(total["outputs"], ar["outputs"], strict=True)),
            # where a request's time goes: its prefill (to the first token) and each step, loop included
            "prefill_ms_per_request": 1e3 * total["prefill_s"] / len(prompts),
            "ms_per_step": 1e3 * (total["seconds"] - total["prefill_s"]) / max(total["steps"], 1),
        }
        if args.stage_times:
            rows[key]["stage_ms"] = stage_breakdown(decoders[key], prompts[0], params)
        if args.profile_dir is not None:
            profile_request(decoders[key], prompts[0], params, args.profile_dir / f"{name}_{key}.txt")
        print(f"{name} {key:<10} tau {rows[key]['tau']:5.2f}  {rate:8.1f} tok/s  "
              f"{rows[key]['speedup_vs_ar']:5.2f}x  same as ar {rows[key]['same_output_as_ar']}/{len(prompts)}",
              flush=True)  # fmt: skip
    # the prompts come from this Python's stdlib: taus compare across machines only on the same files
    return {
        "prompts": len(prompts),
        "prompt_files": sources,
        "python": platform.python_version(),
        "rows": rows,
    }


def profile_request(decoder: Decoder, prompt: list[int], params: SamplingParams, path: Path) -> None:
    """torch.profiler's operator table (host and device time, call counts) of one request, to `path`."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profiler:
        decoder.generate(prompt, params)
    averages = profiler.key_averages()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        averages.table(sort_by="self_cpu_time_total", row_limit=40)
        + "\n"
        + averages.table(sort_by="count", row_limit=25)
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pair", default="tiny-code", help="zoo pair, or several separated by commas")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--budgets", default="16,32")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--stage-times", action="store_true", help="per-stage ms per step for every mode")
    parser.add_argument(
        "--profile-dir", type=Path, help="write one profiled request's operator table per mode"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    result = {
        "schema": "specdeploy.zoo_pair_speed/2",
        "command": " ".join(sys.argv),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
        "torch": torch.__version__,
        "new_tokens": args.new_tokens,
        "pairs": {},
    }
    for name in args.pair.split(","):
        result["pairs"][name] = measure_pair(name, args)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        gc.collect()  # the next pair's graphs and caches get the memory
        if args.device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
