"""The grouped MoE kernels (`triton_moe._gate_up_kernel`, `_down_kernel`) compiled for sm_90 at this tree and at a
git revision, on a machine without a GPU: are their instructions the same? For refactors of a kernel's source that
must not change what runs.

    python benchmarks/results/cpu-2026-12-07-moe-expert-weights/same_ptx.py --base 7d910c1

Each line: kernel, IEEE or not, then `same` or the number of PTX lines that differ. Debug sections, `.loc`/`.file`
lines and the `$L__tmp` labels that only debug info refers to (inlining a helper adds some) are left out.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
os.environ["SPECDEPLOY_PDL"] = "1"  # the wait of programmatic dependent launch compiled in, as on the GPU

COMMON = {"sorted_ptr": "*i32", "block_expert_ptr": "*i32", "pairs": "i32", "routed_pairs": "i32", "hidden": "i32",
          "inter": "i32", "shared_inter": "i32", "num_experts": "i32", "total_experts": "i32", "stride_we": "i32"}  # fmt: skip
SIGNATURES = {
    "_gate_up_kernel": COMMON | {"x_ptr": "*bf16", "w13_ptr": "*bf16", "shared13_ptr": "*bf16",
                                 "out_ptr": "*bf16", "top_k": "i32", "stride_out": "i32"},
    "_down_kernel": COMMON | {"act_ptr": "*bf16", "w2_ptr": "*bf16", "shared2_ptr": "*bf16",
                              "weight_ptr": "*fp32", "out_ptr": "*fp32", "stride_act": "i32"},
}  # fmt: skip

COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specdeploy.engine import triton_moe
out = {}
for name, signature in json.loads(sys.argv[1]).items():
    kernel = getattr(triton_moe, name)
    for ieee in (False, True):
        constants = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "IEEE": ieee}
        full = {p.name: signature.get(p.name, "constexpr") for p in kernel.params}
        binary = triton.compile(ASTSource(kernel, full, constants), target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": 4, "num_stages": 3})
        out[f"{name} ieee={ieee}"] = binary.asm["ptx"]
print(json.dumps(out))
"""


def instructions(ptx: str) -> list[str]:
    ptx = re.sub(r"\.section\s+\.debug.*", "", ptx, flags=re.S)
    return [line for line in ptx.splitlines() if "L__tmp" not in line and not line.strip().startswith((".loc", ".file", "//"))]  # fmt: skip


def compiled(src: Path) -> dict[str, list[str]]:
    """Each kernel's PTX, compiled in a process of its own (with its own Triton cache) from `src`."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "PYTHONPATH": str(src), "TRITON_CACHE_DIR": cache}
        run = subprocess.run([sys.executable, "-c", COMPILE, json.dumps(SIGNATURES)], env=env, capture_output=True,
                             text=True, check=True)  # fmt: skip
    return {name: instructions(ptx) for name, ptx in json.loads(run.stdout.splitlines()[-1]).items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", required=True, help="git revision to compare this tree's kernels with")
    base = parser.parse_args().base
    with tempfile.TemporaryDirectory() as copy:
        archive = subprocess.run(
            ["git", "archive", base, "src"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "x", "-C", copy], input=archive, check=True)
        before = compiled(Path(copy) / "src")
    after = compiled(ROOT / "src")
    for name, lines in after.items():
        changed = [d for d in difflib.unified_diff(before[name], lines, n=0) if d[:1] in "+-" and d[:3] not in ("+++", "---")]  # fmt: skip
        print(f"{name}: {'same' if not changed else f'{len(changed)} lines differ'} ({len(lines)} lines)")


if __name__ == "__main__":
    main()
