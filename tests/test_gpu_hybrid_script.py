"""benchmarks/gpu_hybrid.py: its verdicts on hand-made results, its committed baselines, and (slow) its smoke run."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_hybrid.py"
spec = importlib.util.spec_from_file_location("gpu_hybrid", SCRIPT)
gpu_hybrid = importlib.util.module_from_spec(spec)
sys.modules["gpu_hybrid"] = gpu_hybrid  # dataclasses look their module up there
spec.loader.exec_module(gpu_hybrid)


def zoo_rows(ar: float, ddtree64_speedup: float) -> dict:
    rows = {"ar": {"tau": 1.0, "tokens_per_s": ar, "speedup_vs_ar": 1.0}}
    rows["ddtree-64"] = {"tau": 3.0, "tokens_per_s": ar * ddtree64_speedup, "speedup_vs_ar": ddtree64_speedup}
    return {"rows": rows}


def test_zoo_bars_compare_the_two_pairs_of_one_run() -> None:
    measured = {"pairs": {"tiny-code": zoo_rows(1000.0, 2.0), "tiny-hybrid": zoo_rows(600.0, 1.5)}}
    verdicts = gpu_hybrid.zoo_verdicts(measured)
    assert verdicts["hybrid_ar_vs_dense_ar"] == {"value": 0.6, "bar": 0.5, "passed": True}
    assert verdicts["hybrid_ddtree64_vs_ar"] == {"value": 1.5, "bar": 1.8, "passed": False}
    cut_short = gpu_hybrid.zoo_verdicts({"pairs": {"tiny-code": zoo_rows(1000.0, 2.0)}})
    assert cut_short["hybrid_ar_vs_dense_ar"]["passed"] is None  # the hybrid pair never ran: no verdict


def engine_row(ms: float, fraction: float) -> dict:
    stages = {"draft": 0.0, "tree": 0.0, "verify": ms, "commit": 0.0, "host": 0.0}
    return {"ms_per_step": ms, "roofline_ms": ms * fraction, "fraction_of_roofline": fraction,
            "breakdown_ms": stages, "eager_stages": {}}  # fmt: skip


def test_hybrid_shape_bars() -> None:
    measured = {"engine": {"ar": engine_row(10.0, 0.7), "ddtree-64": engine_row(16.0, 0.5)}}
    verdicts = gpu_hybrid.hybrid_shape_verdicts(measured)
    assert verdicts["shape_ar_fraction_of_roofline"]["passed"] is True
    assert verdicts["shape_ddtree64_step_vs_ar_step"] == {"value": 1.6, "bar": 1.5, "passed": False}
    assert verdicts["step_vs_ar"] == {"ar": 1.0, "ddtree-64": 1.6}


def test_each_mode_is_compared_with_the_newest_file_that_measured_it(tmp_path: Path) -> None:
    newer, older = tmp_path / "newer.json", tmp_path / "older.json"
    newer.write_text(json.dumps({"engine": {"ar": {"ms_per_step": 5.0}}}))
    older.write_text(json.dumps({"engine": {"ar": {"ms_per_step": 4.0}, "dflash": {"ms_per_step": 6.0}}}))
    measured = {
        "engine": {
            "ar": {"ms_per_step": 5.1},
            "dflash": {"ms_per_step": 6.3},
            "ddtree-40": {"ms_per_step": 1},
        }
    }
    out = gpu_hybrid.regression_verdicts(measured, [newer, tmp_path / "absent.json", older])
    assert (out["ar"]["committed_file"], out["ar"]["passed"]) == ("newer.json", True)  # 1.02x of 5.0
    assert (out["dflash"]["committed_file"], out["dflash"]["passed"]) == ("older.json", False)  # 1.05x of 6.0
    assert "ddtree-40" not in out  # never committed


def test_verdicts_gather_every_bar_and_leave_unmeasured_ones_open() -> None:
    passed = {"passed": True}
    done = {
        "zoo": {"hybrid_ar_vs_dense_ar": passed, "hybrid_ddtree64_vs_ar": {"passed": False}},
        "qwen3-8b": {
            "against_committed": {"ar": passed, "dflash": passed, "ddtree-16": passed}
        },  # no ddtree-64
        "gpu_tests": {"passed": True},
    }
    assert gpu_hybrid.verdicts(done) == {
        "hybrid_ar_vs_dense_ar": True,
        "hybrid_ddtree64_vs_ar": False,
        "shape_ar_fraction_of_roofline": None,
        "shape_ddtree64_step_vs_ar_step": None,
        "qwen3_8b_step_vs_committed": None,
        "gpu_tests": True,
    }


def test_the_baselines_are_committed_and_hold_the_compared_modes() -> None:
    committed = gpu_hybrid.committed_steps(gpu_hybrid.QWEN3_BASELINES)
    assert all(path.exists() for path in gpu_hybrid.QWEN3_BASELINES)
    assert {"ar", "dflash", "ddtree-16", "ddtree-64"} <= set(committed)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_smoke_runs_every_stage_on_the_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path), "PYTHONPATH": str(ROOT / "src")}
    subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--commit", "smoke"], cwd=ROOT, env=env, check=True
    )
    summary = json.loads((tmp_path / "hybrid_summary_smoke.json").read_text())
    assert set(summary["stages"]) == {"zoo", "qwen3.6-27b", "qwen3-8b", "qwen3-8b-sweep", "tiny-code-sweep",
                                      "gpu_tests"}  # fmt: skip
    for name, stage in summary["stages"].items():
        assert stage["returncode"] == 0, name
    assert summary["stages"]["qwen3-8b-sweep"]["rows"].keys() >= {"ar", "ddtree-16", "ddtree-64"}
    assert summary["stages"]["qwen3-8b"]["against_committed"].keys() == {
        "ar",
        "dflash",
        "ddtree-16",
        "ddtree-64",
    }
    assert summary["verdicts"]["gpu_tests"] is False  # every GPU test skipped itself
