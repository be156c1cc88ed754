"""Acceptance of a zoo pair on each code path of the engine, against the CPU float32 reference.

    python benchmarks/tau_parity.py --pair tiny-hybrid --variants cpu-fp32,cuda-bf16,cuda-bf16-eager --out r.json

A trained pair's tau is a property of the pair; a code path (dtype, CUDA graphs, Triton kernels) should move it by
rounding noise only. Each variant runs in its own process (the Triton switch is read once per process) and gives,
per mode, tau and the greedy outputs; the report compares each variant's AR outputs with the first variant's (how
many prompts are equal, and where the first difference is), so a path that computes the target differently shows
as AR divergence, and one that feeds the drafter differently as a tau drop with AR outputs intact.

Variants: DEVICE-DTYPE[-eager][-torch][-no-gdn-kernels], e.g. cuda-bf16-eager-no-gdn-kernels. `eager`: no CUDA
graphs; `torch`: SPECDEPLOY_TRITON=0 (every op in torch); `no-gdn-kernels`: the Gated DeltaNet layers in torch,
the other Triton kernels kept.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


FLAGS = ("eager", "torch", "no-gdn-kernels")


def parse_variant(name: str) -> dict:
    """DEVICE-DTYPE[-FLAG...] as a dict: device, dtype, and each of FLAGS true or false."""
    device, _, rest = name.partition("-")
    dtype, _, rest = rest.partition("-")
    chosen = {flag for flag in FLAGS if f"-{flag}-" in f"-{rest}-"}
    spelled = "-".join(flag for flag in FLAGS if flag in chosen)
    if device not in ("cpu", "cuda") or dtype not in ("fp32", "bf16") or spelled != rest:
        raise SystemExit(
            f"unknown variant {name!r}: DEVICE-DTYPE[-eager][-torch][-no-gdn-kernels], in that order"
        )
    return {"device": device, "dtype": dtype, **{flag: flag in chosen for flag in FLAGS}}


def worker(args: argparse.Namespace) -> dict:
    """One variant's run in this process: the prompts' files, and tau and outputs per mode."""
    import torch

    variant = parse_variant(args.worker)
    from specdeploy.engine import ops
    from specdeploy.engine.decode import Decoder, SamplingParams
    from specdeploy.engine.loading import load_drafter, load_target
    from specdeploy.engine.runtime import load_tokenizer
    from specdeploy.zoo.prompts import held_out_prompts
    from specdeploy.zoo.registry import get_pair

    if variant["no-gdn-kernels"]:
        ops.gdn_kernels_for = lambda x: None  # the torch rule, the other kernels unchanged
    pair = get_pair(args.pair)
    tokenizer = load_tokenizer(pair.target_dir)
    trained = {f["sha256"] for f in pair.corpus()["files"] if f["split"] == "train"}
    texts, sources = held_out_prompts(tokenizer.encode, args.prompts, trained)
    prompts = [tokenizer.encode(text) for text in texts]
    dtype = torch.bfloat16 if variant["dtype"] == "bf16" else torch.float32
    target = load_target(pair.target_dir, variant["device"], dtype)
    drafter = load_drafter(pair.draft_dir, variant["device"], dtype)
    graphs = variant["device"] == "cuda" and not variant["eager"]
    modes = [("ar", None), ("dflash", None), *(("ddtree", int(b)) for b in args.budgets.split(",") if b)]
    rows = {}
    for mode, budget in modes:
        key = mode if budget is None else f"{mode}-{budget}"
        decoder = Decoder(target, drafter if mode != "ar" else None, mode, budget, cuda_graphs=graphs)
        params = SamplingParams(max_new_tokens=args.new_tokens)
        accepted = steps = 0
        outputs = []
        for prompt in prompts:
            result = decoder.generate(prompt, params)
            accepted += sum(result.accept_lengths)
            steps += result.num_steps
            outputs.append(result.token_ids)
        rows[key] = {"tau": accepted / max(steps, 1), "outputs": outputs}
    return {"prompt_files": sources, "modes": rows}


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pair", default="tiny-hybrid")
    parser.add_argument("--variants", default="cpu-fp32,cuda-bf16")
    parser.add_argument("--budgets", default="16")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per variant")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    names = [v for v in args.variants.split(",") if v]
    for name in names:
        parse_variant(name)  # a typo fails before any run
    report: dict = {"pair": args.pair, "prompts": args.prompts, "new_tokens": args.new_tokens,
                    "python": platform.python_version(), "variants": {}}  # fmt: skip
    reference = None
    for name in names:
        env = dict(os.environ)
        if parse_variant(name)["torch"]:
            env["SPECDEPLOY_TRITON"] = "0"
        command = [sys.executable, __file__, "--worker", name, "--pair", args.pair, "--budgets", args.budgets,
                   "--prompts", str(args.prompts), "--new-tokens", str(args.new_tokens)]  # fmt: skip
        started = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            report["variants"][name] = {"error": f"timed out after {args.timeout:.0f} s"}
            print(f"{name}: timed out", flush=True)
            continue
        if done.returncode != 0:
            report["variants"][name] = {"error": done.stderr[-3000:]}
            print(f"{name}: failed\n{done.stderr[-3000:]}", flush=True)
            continue
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        rows = measured["modes"]
        # the prompts come from this Python's stdlib: another machine's taus are of other files
        report["prompt_files"] = measured["prompt_files"]
        reference = reference or rows
        summary = {"seconds": round(time.perf_counter() - started, 1)}
        for key, row in rows.items():
            diffs = [
                first_difference(a, b)
                for a, b in zip(row["outputs"], reference["ar"]["outputs"], strict=True)
            ]
            summary[key] = {
                "tau": round(row["tau"], 3),
                "equal_to_reference_ar": sum(d is None for d in diffs),
                "first_differences": diffs,
            }
        report["variants"][name] = {**summary, "outputs": {k: r["outputs"] for k, r in rows.items()}}
        taus = "  ".join(f"{k} tau {v['tau']:.3f} ({v['equal_to_reference_ar']}/{args.prompts} = ref AR)"
                         for k, v in summary.items() if k != "seconds")  # fmt: skip
        print(f"{name:<32} {taus}", flush=True)
        if args.out:
            args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
