"""One H200 or H100, under 10 minutes: the MoE/MLA kernels' CUDA tests, then each shape's step cost against its
roofline.

1. `pytest -m gpu` on the MoE, MLA and one-row kernels' tests and the GPU decoding tests of the MLA + MoE families
   (deepseek_v3 and kimi fp32 greedy equality with CUDA graphs): log and a JSON verdict.
2. `ddtree_side_by_side.py --engine-only` for mla-moe-16b and the Kimi shape the card holds (kimi-like, 4 layers,
   from 120 GB of GPU memory; else kimi-like-h100, 2 layers) (ar, dflash, ddtree 16/64/256): ms per step, % of
   each mode's own roofline, measured expert union next to 1-(1-k/E)^n.
3. The same for the dense qwen3-8b shape (ar, dflash, ddtree 16/64), each mode against the committed results of
   the same card (a regression is a step more than 3% slower). With `--baseline-tree DIR` (an earlier commit's
   `src/` and `benchmarks/`), the same command also runs in DIR, and each mode is compared with that run too: a
   comparison of one card in one call, also on a card with no committed results.

Every stage runs in its own process under a time limit carved from the total, and writes its JSON as it
goes, so a stage cut short keeps what it measured. Run from the repository root:

    PYTHONPATH=src OUT=/some/dir python benchmarks/gpu_kimi_roofline.py [--commit HASH] [--shapes mla-moe-16b,kimi]

On one H100 on 2026-12-07 its stages took 185, 113, 64 and 43 + 35 s (the dense shape here and in the baseline tree),
440 s in all. Their caps add up to more than TOTAL_S: on a slower card the last stages are cut first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_stages import card_of, commit_of, committed_steps, compare_steps, run  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
# committed batch-1 qwen3-8b step costs (same command, same 512/128 tokens): newest first
QWEN3_BASELINES = [
    RESULTS / "h200-2026-12-03" / "engine_qwen3-8b_e1ce3fa.json",
    RESULTS / "h200-2026-12-02" / "engine_qwen3-8b_18d0ea0.json",
]
TESTS = ["tests/test_gpu_fastpath.py", "tests/test_decode_gpu.py"]
# the MoE, MLA and one-row kernels' tests and the two MLA + MoE families' decoding: both files whole took more than
# the stage's time on a cold H100 (14 tests in 130 s; Kimi's float32 decoding alone 43 s,
# `results/gpu-2026-12-06-walk-fusions/`)
TESTS_SELECTED = (
    "moe or routing or mla or one_row or norm_linear or swiglu or (fp32 and (deepseek_v3 or kimi))"
)
TESTS_S = 200  # the whole selection: 76 tests in 176 s on an H100 (`results/gpu-2026-12-07-h100-verdict/`)
# (shape, modes, seconds at most); "kimi": the Kimi shape the card holds (`kimi_shape`). A cold H100 ran four of
# mla-moe-16b's five modes in 110 s (`results/gpu-2026-12-07-head/`)
STAGES = [
    ("mla-moe-16b", "ar,dflash,ddtree-16,ddtree-64,ddtree-256", 150),
    ("kimi", "ar,dflash,ddtree-16,ddtree-64,ddtree-256", 150),
    ("qwen3-8b", "ar,dflash,ddtree-16,ddtree-64", 110),
]
KIMI_4_LAYERS_GB = (
    120  # GPU memory kimi-like's 115 GB of weights need, with the caches and a step's activations
)


def kimi_shape() -> str:
    """kimi-like (4 layers) on a card of 120 GB or more (an H200), else kimi-like-h100 (2 layers, 47 GB)."""
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    return "kimi-like" if total >= KIMI_4_LAYERS_GB * 1e9 else "kimi-like-h100"


TOTAL_S = 560  # the whole run, under 10 minutes
REGRESSION_BAR = 1.03  # a dense step at most 3% slower than before


def dense_baseline(tree: Path, label: str, out: Path, limit: float) -> dict:
    """The qwen3-8b stage's command run in an earlier commit's tree (`tree`, its own `src/` first on the path):
    {mode: (ms per step, file)}, empty if it measured nothing."""
    result = out / f"engine_qwen3-8b_{label}.json"
    modes = next(m for shape, m, _ in STAGES if shape == "qwen3-8b")
    command = [sys.executable, "benchmarks/ddtree_side_by_side.py", "--engine-only", "--shape", "qwen3-8b",
               "--modes", modes, "--commit", label, "--out", str(result)]  # fmt: skip
    path = os.pathsep.join([str(tree / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    code, seconds = run(
        command, out / f"engine_qwen3-8b_{label}.log", limit, cwd=tree, env={**os.environ, "PYTHONPATH": path}
    )
    print(f"qwen3-8b at {label}: rc {code} in {seconds:.0f} s", flush=True)
    return committed_steps([result])  # nothing where it measured nothing


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--commit", help="the specdeploy commit measured (default: git rev-parse --short HEAD)"
    )
    parser.add_argument("--skip-tests", action="store_true", help="measure only")
    shapes = [shape for shape, _, _ in STAGES]
    parser.add_argument("--shapes", default=",".join(shapes), help=f"some of {', '.join(shapes)}")
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        help="an earlier commit's tree (src/ and benchmarks/): qwen3-8b also runs there and is compared with it",
    )
    parser.add_argument(
        "--baseline-commit", default="baseline", help="the commit of --baseline-tree, for its files"
    )
    args = parser.parse_args()
    chosen = args.shapes.split(",")
    if unknown := set(chosen) - set(shapes):
        parser.error(f"unknown shapes {sorted(unknown)}: choose from {', '.join(shapes)}")
    if args.baseline_tree and not (args.baseline_tree / "benchmarks" / "ddtree_side_by_side.py").exists():
        parser.error(f"--baseline-tree {args.baseline_tree} has no benchmarks/ddtree_side_by_side.py")
    if "OUT" not in os.environ:
        parser.error("set OUT to the directory for the results")
    out = Path(os.environ["OUT"]).resolve()  # absolute: the baseline runs in its own tree
    out.mkdir(parents=True, exist_ok=True)
    commit = commit_of(args.commit)
    deadline = time.monotonic() + TOTAL_S
    summary: dict = {"schema": "specdeploy.gpu_kimi_roofline/1", "commit": commit, "stages": {}}
    summary_path = out / f"kimi_roofline_summary_{commit}.json"

    def save() -> None:
        summary_path.write_text(json.dumps(summary, indent=1) + "\n")

    if not args.skip_tests:
        log = out / f"gpu_tests_{commit}.log"
        pytest = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", *TESTS,
                  "-k", TESTS_SELECTED]  # fmt: skip
        code, seconds = run(pytest, log, min(TESTS_S, deadline - time.monotonic()))
        last = [line for line in log.read_text().splitlines() if line.strip()][-1:]
        summary["stages"]["gpu_tests"] = {
            "returncode": code,
            "seconds": seconds,
            "result": last,
            "log": log.name,
        }
        print(f"gpu tests: rc {code} in {seconds:.0f} s: {last}", flush=True)
        save()
    for shape, modes, cap in STAGES:
        if shape not in chosen:
            continue
        shape = kimi_shape() if shape == "kimi" else shape
        left = deadline - time.monotonic()
        if left < 30:
            summary["stages"][shape] = {"skipped": f"{left:.0f} s left of the run's {TOTAL_S} s"}
            save()
            continue
        result = out / f"engine_{shape}_{commit}.json"
        command = [sys.executable, "benchmarks/ddtree_side_by_side.py", "--engine-only", "--shape", shape,
                   "--modes", modes, "--commit", commit, "--out", str(result)]  # fmt: skip
        code, seconds = run(command, out / f"engine_{shape}_{commit}.log", min(cap, left))
        stage = {"returncode": code, "seconds": seconds, "json": result.name}
        if result.exists():
            measured = json.loads(result.read_text())
            stage["rows"] = measured.get("summary", {}).get("rows") or {
                key: {
                    k: row.get(k)
                    for k in ("ms_per_step", "roofline_ms", "fraction_of_roofline", "expert_union")
                }
                for key, row in measured.get("engine", {}).items()
            }
            if shape == "qwen3-8b":
                card = card_of(measured)
                stage["against_committed"] = compare_steps(
                    measured, committed_steps(QWEN3_BASELINES, card), REGRESSION_BAR
                )
                if not stage["against_committed"]:
                    stage["not_compared"] = f"no committed qwen3-8b result was measured on {card}"
                if args.baseline_tree:
                    left = min(cap, deadline - time.monotonic())
                    before = dense_baseline(args.baseline_tree.resolve(), args.baseline_commit, out, left)
                    stage[f"against_{args.baseline_commit}"] = compare_steps(measured, before, REGRESSION_BAR)
        summary["stages"][shape] = stage
        print(f"{shape}: rc {code} in {seconds:.0f} s", flush=True)
        print((out / f"engine_{shape}_{commit}.log").read_text()[-3000:], flush=True)
        save()
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
