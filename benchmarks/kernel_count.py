"""Device launches per decoding stage, counted on the CPU along the CUDA code path (Triton interpreted).

    python benchmarks/kernel_count.py --pair zoo:tiny-hybrid --modes ar,ddtree-64 --out counts.json

At the zoo's sizes a GPU step is bound by its launches, not its bytes (tiny-hybrid's DDTree-64 accept and commit
stages: 0.098 ms on an H200 at 8a8314d for 51 launches, 1.9 us each), so a stage's launches are what it costs. This runs one request per mode
with `SPECDEPLOY_TRITON=interpret` (every Triton kernel the GPU would run, through Triton's interpreter, on CPU
tensors), the GPU's fixed shapes and attention windows, and counts per stage call: each Triton kernel launch, and
each torch operation that launches one (not views, allocations, or casts and reshapes that return their input).
cuBLAS may split a matrix product into more than one kernel on a GPU; each counts once here. Slow (the
interpreter): minutes per mode.
"""

from __future__ import annotations

import os

os.environ["SPECDEPLOY_TRITON"] = "interpret"
os.environ["TRITON_INTERPRET"] = "1"  # before anything imports Triton

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from collections import Counter, defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from specdeploy.engine.decode import Decoder, SamplingParams  # noqa: E402
from specdeploy.engine.loading import load_drafter, load_target  # noqa: E402
from specdeploy.perf.profile import random_prompt  # noqa: E402
from specdeploy.zoo.registry import resolve_models  # noqa: E402

# Operations that launch nothing: allocations and metadata (views are told by their schema).
NO_LAUNCH = {
    "aten.empty.memory_format", "aten.empty_like.default", "aten.empty_strided.default", "aten.promote_types.default",
    "aten.detach.default", "aten.detach_.default", "aten.lift_fresh.default", "aten._local_scalar_dense.default",
    "aten.item.default", "aten.is_same_size.default", "aten.sym_size.int", "aten.sym_stride.int",
    "aten.sym_numel.default", "aten.sym_storage_offset.default", "aten.result_type.Tensor",
}  # fmt: skip


def storage(value: object) -> int | None:
    return value.untyped_storage().data_ptr() if isinstance(value, torch.Tensor) else None


class LaunchCounter(TorchDispatchMode):
    """Counts, per stage, the torch operations that launch a kernel and the Triton kernels launched."""

    def __init__(self) -> None:
        super().__init__()
        self.stage: str | None = None
        self.in_kernel = False  # the interpreter's own tensor work inside a Triton launch is not a launch
        self.calls: Counter[str] = Counter()
        self.launches: defaultdict[str, Counter[str]] = defaultdict(Counter)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.stage is None or self.in_kernel:
            return out
        name = str(func)
        first = args[0] if args else None
        result = out[0] if isinstance(out, (tuple, list)) and out else out
        # views, and `to`, `contiguous`, `reshape` that return their input, share its storage: nothing copied
        same = storage(result) is not None and storage(result) == storage(first)
        inplace = name.split(".")[1].endswith("_") or "out" in (kwargs or {})
        if name not in NO_LAUNCH and (inplace or not same):
            self.launches[self.stage][name] += 1
        return out

    def kernel(self, name: str) -> None:
        if self.stage is not None:
            self.launches[self.stage]["triton:" + name] += 1


def install(counter: LaunchCounter, decoder: Decoder) -> None:
    """Route every stage of `decoder`'s runner, and every Triton launch, through `counter`."""
    run = InterpretedFunction.run

    def counted_run(self, *args, **kwargs):
        counter.kernel(self.fn.__name__)
        counter.in_kernel = True
        try:
            return run(self, *args, **kwargs)
        finally:
            counter.in_kernel = False

    InterpretedFunction.run = counted_run
    runner = decoder.runner
    stage_run = runner._run

    def staged(key, stage, eager, protect, neutral):
        name = key[0] if isinstance(key, tuple) else str(key)
        counter.stage, counter.calls[name] = name, counter.calls[name] + 1
        try:
            return stage_run(key, stage, eager, protect, neutral)
        finally:
            counter.stage = None

    runner._run = staged


def count_mode(target, drafter, label: str, prompt: list[int], steps: int) -> dict:
    mode, _, budget = label.partition("-")
    decoder = Decoder(target, drafter if mode != "ar" else None, mode, int(budget) if budget else None,
                      cuda_graphs=False, fixed_shapes=True)  # fmt: skip
    counter = LaunchCounter()
    install(counter, decoder)
    params = SamplingParams(max_new_tokens=steps + 1)  # greedy; a step commits at least one token
    with counter:
        result = decoder.generate(prompt, params)
    stages = {}
    for name, launches in counter.launches.items():
        calls = counter.calls[name]
        stages[name] = {
            "calls": calls,
            "launches_per_call": sum(launches.values()) / calls,
            "by_operation": {op: n / calls for op, n in launches.most_common()},
        }
    per_step = sum(s["launches_per_call"] * s["calls"] for n, s in stages.items() if n != "prefill")
    return {
        "steps": result.num_steps,
        "launches_per_step": per_step / max(result.num_steps, 1),
        "stages": stages,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pair", default="zoo:tiny-hybrid", help="a zoo pair (zoo:NAME) or a target path")
    parser.add_argument("--draft", help="the drafter's path, with a target path")
    parser.add_argument("--modes", default="ar,ddtree-64")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument(
        "--steps", type=int, default=2, help="new tokens past the first (at most this many steps)"
    )
    parser.add_argument("--dtype", default="bfloat16", help="bfloat16 counts the casts a GPU run makes")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    labels = args.modes.split(",")
    budgets = [int(m.partition("-")[2] or 0) for m in labels]
    target_path, draft_path = resolve_models(args.pair, args.draft, "ddtree", max(budgets) or 16)
    target = load_target(target_path, device=torch.device("cpu"), dtype=dtype)
    drafter = load_drafter(draft_path, device=torch.device("cpu"), dtype=dtype)
    prompt = random_prompt(target.config.vocab_size, args.prompt_tokens)
    result = {"pair": args.pair, "dtype": args.dtype, "prompt_tokens": args.prompt_tokens, "modes": {}}
    for label in labels:
        counted = result["modes"][label] = count_mode(target, drafter, label, prompt, args.steps)
        print(f"{label}: {counted['launches_per_step']:.1f} launches per step over {counted['steps']} steps",
              flush=True)  # fmt: skip
        for name, stage in counted["stages"].items():
            top = ", ".join(f"{op} {n:g}" for op, n in list(stage["by_operation"].items())[:6])
            print(f"  {name:8} {stage['launches_per_call']:6.1f} per call x {stage['calls']}  ({top})")
        if args.out:
            args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
