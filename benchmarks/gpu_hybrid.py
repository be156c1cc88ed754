"""One H200, under 9 minutes: hybrid (Gated DeltaNet) targets on the fast path, issue 19's bars, and the dense check.

1. zoo: `zoo_pair_speed.py` on tiny-code and tiny-hybrid in one process (budgets 16, 64, per-stage ms):
   tiny-hybrid AR tok/s / tiny-code AR tok/s (bar >= 0.5) and tiny-hybrid DDTree-64 / its AR (bar >= 1.8).
2. qwen3.6-27b: `ddtree_side_by_side.py --engine-only` on the Qwen3.6-27B shape with random weights (ar,
   ddtree-64, ddtree-16, ddtree-256): AR's share of its copy-bandwidth roofline (bar >= 65%) and the
   DDTree-64 step over the AR step (bar <= 1.5); DDTree-16 and DDTree-256 are stated.
3. qwen3-8b: the dense shape (ar, dflash, ddtree-16, ddtree-64), each mode against the newest committed result
   of the same card that has it (bar: a step at most 3% slower).
4. qwen3-8b-sweep: DDTree budgets 16, 24, 32, 40, 48, 64 on the dense shape, batch 1, with each budget's
   per-stage ms (draft, tree, verify, commit, host).
5. tiny-code-sweep: the same budgets on the trained tiny-code pair (real acceptance), per-stage ms: where H200
   measured budget 32 slower per step than 64 (1.64 against 1.32 ms, campaign-tiny-code-cuda-auto).
6. gpu_tests: `pytest -m gpu` on TESTS, in the time left (at least 135 s; `--stages gpu_tests` runs them alone).

Every stage runs in its own process under a time limit and writes its JSON as it goes, so a stage cut short
keeps what it measured; the summary (bars, verdicts, machine, versions, commit) is rewritten after each stage.
On the device machine, after installing the wheels in `.whl/` (it lacks fastapi, uvicorn, pydantic, ...),
from the repository root:

    PYTHONPATH=src OUT=/some/dir python benchmarks/gpu_hybrid.py [--commit HASH] [--stages zoo,qwen3.6-27b]

`--smoke` runs every stage's command line on this machine's CPU at tiny sizes (the shapes' layer patterns at
tiny widths, one prompt, a few tokens; the GPU tests skip themselves): its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_stages import card_of, commit_of, committed_steps, compare_steps, run  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
# committed batch-1 qwen3-8b step costs (same command, 512/128 tokens), newest first: each mode is compared
# with the newest file that measured it
QWEN3_BASELINES = [
    RESULTS / "h200-2026-12-03" / "engine_qwen3-8b_1720895.json",
    RESULTS / "h200-2026-12-03" / "engine_qwen3-8b_e1ce3fa.json",
    RESULTS / "h200-2026-12-02" / "engine_qwen3-8b_18d0ea0.json",
]
TESTS = ["tests/test_decode_gpu.py", "tests/test_batch_gpu.py"]  # test_batch_gpu.py covers qwen3_next rows
SWEEP = [16, 24, 32, 40, 48, 64]
HYBRID_SHAPE = "qwen3.6-27b"
BARS = {
    "hybrid_ar_vs_dense_ar": 0.5,  # tiny-hybrid AR tok/s over tiny-code AR tok/s, at least
    "hybrid_ddtree64_vs_ar": 1.8,  # tiny-hybrid DDTree-64 tok/s over its AR tok/s, at least
    "shape_ar_fraction_of_roofline": 0.65,  # at least
    "shape_ddtree64_step_vs_ar_step": 1.5,  # at most
    "qwen3_8b_step_vs_committed": 1.03,  # at most, per mode
}
TOTAL_S = 530  # the whole run, under 9 minutes
TESTS_FLOOR_S = 60  # fewer seconds left than this: the tests are skipped, not started
SMOKE_SLOWDOWN = 8  # a smoke run's limits are this many times the GPU run's: a shared CPU is that much slower


def query(command: list[str]) -> str | None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
        return done.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine(commit: str) -> dict:
    """GPU, driver, CPU and package versions, read without importing torch (no CUDA context here)."""
    smi = query(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"])
    return {
        "gpu": smi,
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        **{name: version(name) for name in ("torch", "triton", "transformers")},
        "specdeploy_commit": commit,
    }


def verdict(value: float | None, bar: float, at_least: bool) -> dict:
    if value is None:
        return {"value": None, "bar": bar, "passed": None}
    return {"value": value, "bar": bar, "passed": value >= bar if at_least else value <= bar}


def zoo_verdicts(measured: dict) -> dict:
    """Issue 19's zoo bars from one zoo_pair_speed run holding tiny-code and tiny-hybrid."""
    pairs = measured.get("pairs", {})
    code = pairs.get("tiny-code", {}).get("rows", {})
    hybrid = pairs.get("tiny-hybrid", {}).get("rows", {})
    ar_ratio = None
    if "ar" in code and "ar" in hybrid:
        ar_ratio = hybrid["ar"]["tokens_per_s"] / code["ar"]["tokens_per_s"]
    ddtree = hybrid["ddtree-64"]["speedup_vs_ar"] if "ddtree-64" in hybrid else None
    return {
        "hybrid_ar_vs_dense_ar": verdict(ar_ratio, BARS["hybrid_ar_vs_dense_ar"], at_least=True),
        "hybrid_ddtree64_vs_ar": verdict(ddtree, BARS["hybrid_ddtree64_vs_ar"], at_least=True),
        "rows": {
            pair: {
                key: {k: row[k] for k in ("tau", "tokens_per_s", "speedup_vs_ar")}
                for key, row in rows.items()
            }
            for pair, rows in ((p, data["rows"]) for p, data in pairs.items())
        },
    }


def shape_rows(measured: dict) -> dict:
    """Per mode of a side-by-side run: ms per step, roofline ms, share of it, per-stage ms."""
    return {
        key: {
            "ms_per_step": row["ms_per_step"],
            "roofline_ms": row["roofline_ms"],
            "fraction_of_roofline": row["fraction_of_roofline"],
            "stage_ms": row["breakdown_ms"],
            "eager_stages": row["eager_stages"],
        }
        for key, row in measured.get("engine", {}).items()
    }


def hybrid_shape_verdicts(measured: dict) -> dict:
    """The hybrid shape's bars: AR's share of its roofline, DDTree-64's step over AR's; the rest stated."""
    rows = shape_rows(measured)
    ar = rows.get("ar")
    ratio = rows["ddtree-64"]["ms_per_step"] / ar["ms_per_step"] if ar and "ddtree-64" in rows else None
    return {
        "shape_ar_fraction_of_roofline": verdict(
            ar["fraction_of_roofline"] if ar else None, BARS["shape_ar_fraction_of_roofline"], at_least=True
        ),
        "shape_ddtree64_step_vs_ar_step": verdict(
            ratio, BARS["shape_ddtree64_step_vs_ar_step"], at_least=False
        ),
        "step_vs_ar": {k: r["ms_per_step"] / ar["ms_per_step"] for k, r in rows.items()} if ar else {},
        "rows": rows,
    }


def regression_verdicts(measured: dict, baselines: list[Path]) -> dict:
    """Each measured mode against its newest committed step on the same card: ratio, and whether it is within 3%."""
    card = card_of(measured)
    return compare_steps(measured, committed_steps(baselines, card), BARS["qwen3_8b_step_vs_committed"])


def sweep_table(measured: dict) -> dict:
    """The dense shape's budget sweep: ms per step, its ratio to DDTree-64's, and per-stage ms per budget."""
    rows = measured.get("engine", {})
    top = rows.get("ddtree-64", {}).get("ms_per_step")
    return {
        "rows": {
            key: {
                "ms_per_step": row["ms_per_step"],
                "vs_ddtree_64": row["ms_per_step"] / top if top else None,
                "stage_ms": row["breakdown_ms"],
            }
            for key, row in rows.items()
        }
    }


def zoo_sweep_table(measured: dict) -> dict:
    """tiny-code's budget sweep: tau, tokens/s, ms per step as tau over tokens/s (the campaign README's
    arithmetic, prefill included), and the per-stage ms of one instrumented request."""
    rows = measured.get("pairs", {}).get("tiny-code", {}).get("rows", {})
    steps = {key: 1e3 * row["tau"] / row["tokens_per_s"] for key, row in rows.items()}
    top = steps.get("ddtree-64")
    return {
        "rows": {
            key: {
                "tau": row["tau"],
                "tokens_per_s": row["tokens_per_s"],
                "ms_per_step": steps[key],
                "vs_ddtree_64": steps[key] / top if top else None,
                "stage_ms": row.get("stage_ms"),
            }
            for key, row in rows.items()
        }
    }


def verdicts(stages_done: dict) -> dict[str, bool | None]:
    """Every bar's pass (True), miss (False) or lack of a measurement (None), over the stages run so far."""
    out: dict[str, bool | None] = {}
    for name in ("hybrid_ar_vs_dense_ar", "hybrid_ddtree64_vs_ar"):
        out[name] = stages_done.get("zoo", {}).get(name, {}).get("passed")
    for name in ("shape_ar_fraction_of_roofline", "shape_ddtree64_step_vs_ar_step"):
        out[name] = stages_done.get(HYBRID_SHAPE, {}).get(name, {}).get("passed")
    dense = stages_done.get("qwen3-8b", {}).get("against_committed", {})
    compared = [dense.get(mode, {}).get("passed") for mode in ("ar", "dflash", "ddtree-16", "ddtree-64")]
    out["qwen3_8b_step_vs_committed"] = None if None in compared else all(compared)
    out["gpu_tests"] = stages_done.get("gpu_tests", {}).get("passed")
    return out


@dataclass(frozen=True)
class Stage:
    name: str
    command: list[str]
    result: str  # its JSON's file name under OUT
    cap_s: int  # seconds at most
    keep: Callable[[dict], dict]  # what the summary keeps of the JSON


def stages(commit: str, smoke: bool, out: Path) -> list[Stage]:
    python = sys.executable
    # a smoke run: CPU, tiny widths, one prompt, a few tokens
    zoo_size = ["--device", "cpu", "--prompts", "1", "--new-tokens", "8"] if smoke else []
    shape_size = ["--tiny", "--device", "cpu", "--prompt-tokens", "8", "--new-tokens", "3"] if smoke else []

    def side(shape: str, modes: str, result: str) -> list[str]:
        return [python, "benchmarks/ddtree_side_by_side.py", "--engine-only", "--shape", shape, "--modes", modes,
                "--commit", commit, "--out", str(out / result), *shape_size]  # fmt: skip

    def zoo(pairs: str, budgets: str, prompts: list[str], result: str) -> list[str]:
        return [python, "benchmarks/zoo_pair_speed.py", "--pair", pairs, "--budgets", budgets,
                "--stage-times", *prompts, "--out", str(out / result), *zoo_size]  # fmt: skip

    sweep = ",".join(str(b) for b in SWEEP)
    shape_json = f"engine_{HYBRID_SHAPE}_{commit}.json"
    return [
        Stage(
            "zoo",
            zoo("tiny-code,tiny-hybrid", "16,64", [], f"zoo_pairs_{commit}.json"),
            f"zoo_pairs_{commit}.json",
            100,
            zoo_verdicts,
        ),
        Stage(
            HYBRID_SHAPE,
            side(HYBRID_SHAPE, "ar,ddtree-64,ddtree-16,ddtree-256", shape_json),
            shape_json,
            140,
            hybrid_shape_verdicts,
        ),
        Stage(
            "qwen3-8b",
            side("qwen3-8b", "ar,dflash,ddtree-16,ddtree-64", f"engine_qwen3-8b_{commit}.json"),
            f"engine_qwen3-8b_{commit}.json",
            50,
            lambda measured: {"against_committed": regression_verdicts(measured, QWEN3_BASELINES)},
        ),
        Stage(
            "qwen3-8b-sweep",
            side(
                "qwen3-8b",
                "ar," + ",".join(f"ddtree-{b}" for b in SWEEP),
                f"engine_qwen3-8b_sweep_{commit}.json",
            ),
            f"engine_qwen3-8b_sweep_{commit}.json",
            60,
            sweep_table,
        ),
        Stage(
            "tiny-code-sweep",
            zoo("tiny-code", sweep, ["--prompts", "2"], f"zoo_tiny-code_sweep_{commit}.json"),
            f"zoo_tiny-code_sweep_{commit}.json",
            45,
            zoo_sweep_table,
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--commit", help="the specdeploy commit measured (default: git rev-parse --short HEAD)"
    )
    names = ["zoo", HYBRID_SHAPE, "qwen3-8b", "qwen3-8b-sweep", "tiny-code-sweep", "gpu_tests"]
    parser.add_argument("--stages", default=",".join(names), help=f"some of {', '.join(names)}")
    parser.add_argument("--smoke", action="store_true", help="every stage on the CPU at tiny sizes")
    args = parser.parse_args()
    chosen = args.stages.split(",")
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        parser.error(f"unknown stages {', '.join(unknown)}: choose among {', '.join(names)}")
    if "OUT" not in os.environ:
        parser.error("set OUT to the directory for the results")
    out = Path(os.environ["OUT"])
    out.mkdir(parents=True, exist_ok=True)
    commit = commit_of(args.commit)
    scale = SMOKE_SLOWDOWN if args.smoke else 1
    total = TOTAL_S * scale
    deadline = time.monotonic() + total
    summary: dict = {
        "schema": "specdeploy.gpu_hybrid/1",
        "commit": commit,
        "smoke": args.smoke,
        "machine": machine(commit),
        "bars": BARS,
        "stages": {},
    }
    summary_path = out / f"hybrid_summary_{commit}.json"

    def save() -> None:
        summary_path.write_text(json.dumps(summary, indent=1) + "\n")

    save()
    for planned in stages(commit, args.smoke, out):
        name = planned.name
        if name not in chosen:
            continue
        left = deadline - time.monotonic()
        if left < 30:
            summary["stages"][name] = {"skipped": f"{left:.0f} s left of the run's {total} s"}
            save()
            continue
        result, log = out / planned.result, out / f"{Path(planned.result).stem}.log"
        result.unlink(missing_ok=True)  # an earlier run's file must not pass for this one's
        code, seconds = run(planned.command, log, min(planned.cap_s * scale, left))
        stage: dict = {"command": " ".join(planned.command[1:]), "returncode": code, "seconds": seconds,
                       "json": result.name, "log": log.name}  # fmt: skip
        if result.exists():
            stage.update(planned.keep(json.loads(result.read_text())))
        summary["stages"][name] = stage
        summary["verdicts"] = verdicts(summary["stages"])
        print(f"{name}: rc {code} in {seconds:.0f} s", flush=True)
        print(log.read_text()[-2000:], flush=True)
        save()
    if "gpu_tests" in chosen:
        left = deadline - time.monotonic()
        if left < TESTS_FLOOR_S:
            summary["stages"]["gpu_tests"] = {"skipped": f"{left:.0f} s left of the run's {total} s"}
        else:
            log = out / f"gpu_tests_{commit}.log"
            pytest = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", *TESTS]
            code, seconds = run(pytest, log, left)
            last = [line for line in log.read_text().splitlines() if line.strip()][-1:]
            summary["stages"]["gpu_tests"] = {
                "tests": TESTS,
                "returncode": code,
                "seconds": seconds,
                "result": last,
                "passed": code == 0 and "passed" in " ".join(last),  # all skipped (no CUDA) is no pass
                "log": log.name,
            }
            print(f"gpu tests: rc {code} in {seconds:.0f} s: {last}", flush=True)
        summary["verdicts"] = verdicts(summary["stages"])
        save()
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
