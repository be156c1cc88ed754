"""Where a decoding step's device time goes, kernel by kernel, on random weights of a named shape.

Runs each mode's stages eagerly (the kernels a CUDA graph replays are the same) under torch.profiler and
prints the kernels by device time per decoding step (a prefill-only generation's kernels subtracted), plus
ceilings measured in the same run: a GEMV and a 65-row GEMM of the shape's largest projection, and the copy
bandwidth. With programmatic dependent launch on (`specdeploy.engine.triton_launch`), a kernel's time can include its
wait for the kernel before it, so per-kernel times can overstate a kernel's own work and their sum can exceed the
step's time; `SPECDEPLOY_PDL=0` profiles without it.

    python benchmarks/kernel_profile.py --shape qwen3-8b --modes ar,ddtree-64 --out profile.json
    python benchmarks/kernel_profile.py --pair zoo:tiny-hybrid --prompt-tokens 64 --modes ar,ddtree-64 --out p.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from specdeploy.engine.decode import Decoder, SamplingParams  # noqa: E402
from specdeploy.engine.loading import load_drafter, load_target  # noqa: E402
from specdeploy.engine.triton_launch import PDL  # noqa: E402
from specdeploy.perf.profile import random_prompt  # noqa: E402
from specdeploy.perf.random_models import random_pair  # noqa: E402
from specdeploy.perf.roofline import copy_bandwidth  # noqa: E402
from specdeploy.perf.shapes import get_shape  # noqa: E402
from specdeploy.zoo.registry import resolve_models  # noqa: E402


def timed(fn, repeats: int = 50) -> float:
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


def ceilings(hidden: int, inter: int) -> dict:
    weight = torch.randn(2 * inter, hidden, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, hidden, device="cuda", dtype=torch.bfloat16)
    gemv_ms = timed(lambda: torch.nn.functional.linear(x, weight))
    x65 = torch.randn(65, hidden, device="cuda", dtype=torch.bfloat16)
    gemm65_ms = timed(lambda: torch.nn.functional.linear(x65, weight))
    bytes_weight = weight.numel() * 2
    return {
        "gemv_ms": gemv_ms,
        "gemv_tb_per_s": bytes_weight / gemv_ms / 1e9,
        "gemm65_ms": gemm65_ms,
        "copy_tb_per_s": copy_bandwidth(torch.device("cuda")) / 1e12,
    }


def profiled(
    decoder: Decoder, prompt: list[int], new_tokens: int
) -> tuple[dict[str, tuple[int, float]], int]:
    """Kernel name -> (launches, device us) of one generation, and its verify steps."""
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    decoder.generate(prompt, params)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        result = decoder.generate(prompt, params)
    torch.cuda.synchronize()
    kernels = {e.key[:90]: (e.count, e.self_device_time_total) for e in prof.key_averages()}
    return kernels, result.num_steps


def kernel_table(decoder: Decoder, prompt: list[int], steps: int) -> list[dict]:
    """Kernels per decoding step: a generation of `steps` steps less one that only prefills, so the
    prefill's kernels drop out."""
    prefill, prefill_steps = profiled(decoder, prompt, 1)
    full, full_steps = profiled(decoder, prompt, steps + 1)
    per_step = max(full_steps - prefill_steps, 1)
    rows = []
    for name, (count, device_us) in full.items():
        count0, device_us0 = prefill.get(name, (0, 0.0))
        if device_us - device_us0 > 0:
            rows.append({"kernel": name, "calls_per_step": (count - count0) / per_step,
                         "us_per_step": (device_us - device_us0) / per_step})  # fmt: skip
    return sorted(rows, key=lambda r: -r["us_per_step"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="qwen3-8b")
    parser.add_argument("--pair", help="a zoo pair (zoo:tiny-hybrid) or target path, instead of --shape's random "
                        "weights; its drafter comes with it")  # fmt: skip
    parser.add_argument("--modes", default="ar,ddtree-64")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.pair:
        budgets = [int(m.partition("-")[2] or 0) for m in args.modes.split(",")]
        target_path, draft_path = resolve_models(args.pair, None, "ddtree", max(budgets) or 16)
        target = load_target(target_path, device=torch.device("cuda"), dtype=torch.bfloat16)
        drafter = load_drafter(draft_path, device=torch.device("cuda"), dtype=torch.bfloat16)
        name, config = args.pair, target.config.raw
    else:
        shape = get_shape(args.shape)
        target, drafter = random_pair(shape, torch.device("cuda"), torch.bfloat16)
        name, config = shape.name, shape.target
    prompt = random_prompt(config["vocab_size"], args.prompt_tokens)
    inter = config.get("intermediate_size")
    result = {
        "shape": name,
        "pdl": PDL.value,
        "ceilings": ceilings(config["hidden_size"], inter),
        "modes": {},
    }
    print(result["ceilings"], flush=True)
    if PDL.value:
        print(
            "PDL on: a kernel's time can include its wait for the one before (SPECDEPLOY_PDL=0 to profile without)"
        )
    for label in args.modes.split(","):
        mode, _, budget = label.partition("-")
        budget = int(budget) if budget else None
        decoder = Decoder(target, drafter if mode != "ar" else None, mode, budget, cuda_graphs=False)
        rows = kernel_table(decoder, prompt, args.steps)
        result["modes"][label] = rows
        total = sum(r["us_per_step"] for r in rows)
        calls = sum(r["calls_per_step"] for r in rows)
        print(f"\n{label}: {total / 1e3:.2f} ms of kernels, {calls:.0f} kernel launches per step")
        for row in rows[:22]:
            print(f"{row['us_per_step']:9.1f} us {row['calls_per_step']:7.1f}x  {row['kernel']}")
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
