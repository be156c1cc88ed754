"""A prefill chunk's gated delta rule on one GPU: the one-launch chain kernel against the chunked matrix form.

    python benchmarks/gdn_prefill_rule.py --out result.json

For each chunk length, both forms run on the same random inputs (bf16 q|k|v, float32 gates and state, the
Gated DeltaNet dims of the named shapes) and are timed by CUDA events (median of repeats, the kernel launch and
the torch form's own launches included), and their outputs and final states are compared. The crossover says up
to which chunk length `GatedDeltaNet` should take the chain kernel.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from specdeploy.engine import triton_gdn  # noqa: E402
from specdeploy.engine.models.gated_delta_rule import chunked_rule, rule_inputs  # noqa: E402

# (key heads, value heads, key dim, value dim): tiny-hybrid's zoo target and the Qwen3.6-27B shape
DIMS = {"tiny-hybrid": (4, 4, 64, 64), "qwen3.6-27b": (16, 48, 128, 128)}


def median_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def measure(dims: tuple[int, int, int, int], tokens: int, repeats: int) -> dict:
    key_heads, heads, key_dim, value_dim = dims
    gen = torch.Generator(device="cuda").manual_seed(tokens)

    def rand(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device="cuda", generator=gen).to(dtype)

    q, k = rand(1, tokens, key_heads, key_dim), rand(1, tokens, key_heads, key_dim)
    v = rand(1, tokens, heads, value_dim)
    decay = -F.softplus(rand(1, tokens, heads, dtype=torch.float32))
    beta = rand(1, tokens, heads, dtype=torch.float32).sigmoid()
    state = rand(1, heads, key_dim, value_dim, dtype=torch.float32) * 0.1
    kernel_state = state.clone()
    kernel_out = triton_gdn.chain_rule(q, k, v, decay, beta, kernel_state)
    torch_out, torch_state = chunked_rule(rule_inputs(q, k, v, decay, beta), state)
    scratch = state.clone()
    return {
        "tokens": tokens,
        "chain_kernel_ms": median_ms(lambda: triton_gdn.chain_rule(q, k, v, decay, beta, scratch), repeats),
        "chunked_torch_ms": median_ms(
            lambda: chunked_rule(rule_inputs(q, k, v, decay, beta), state), repeats
        ),
        "max_abs_diff_out": float((kernel_out - torch_out).abs().max()),
        "max_abs_diff_state": float((kernel_state - torch_state).abs().max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", default="16,32,64,128,256,512,1024,2048")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    result = {
        "schema": "specdeploy.gdn_prefill_rule/1",
        "command": " ".join(sys.argv),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "shapes": {},
    }
    for name, dims in DIMS.items():
        rows = [measure(dims, int(t), args.repeats) for t in args.tokens.split(",")]
        result["shapes"][name] = {
            "dims": dict(zip(("key_heads", "heads", "key_dim", "value_dim"), dims, strict=True)),
            "rows": rows,
        }
        for row in rows:
            print(f"{name} T={row['tokens']:5d} chain {row['chain_kernel_ms']:.3f} ms  chunked "
                  f"{row['chunked_torch_ms']:.3f} ms  max diff {row['max_abs_diff_out']:.2e}", flush=True)  # fmt: skip
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
