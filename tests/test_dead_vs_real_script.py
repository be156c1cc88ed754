"""benchmarks/dead_vs_real_step.py: every real step is paired with a dead step of its own shape, stage by stage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_each_dead_step_takes_its_real_step_s_rows_budget_and_window(tmp_path: Path) -> None:
    out = tmp_path / "dead_vs_real.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "dead_vs_real_step.py"), "--device", "cpu", "--dtype",
               "float32", "--rows", "2", "--budgets", "2,8", "--steps", "3", "--max-context", "512", "--out", str(out)]  # fmt: skip
    env = os.environ | {"PYTHONPATH": str(ROOT / "src")}
    printed = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    result = json.loads(out.read_text())
    real, dead = result["real"], result["dead"]
    assert len(real) == len(dead) == 6  # three rounds of the two budgets
    assert [r["budget"] for r in real] == [2, 8] * 3
    for r, d in zip(real, dead, strict=True):
        assert (r["budget"], r["rows"], r["window"]) == (d["budget"], d["rows"], d["window"])
        # both ran every stage of a drafting step (the real one's context: its pending features)
        assert {"draft", "tree", "verify", "accept", "commit"} <= set(r["stages"]) & set(d["stages"])
        assert all(ms > 0 for ms in r["stages"].values()) and r["ms"] >= sum(r["stages"].values()) * 0.9
    assert sorted(result["summary"]) == ["2", "8"] and "budget   8, 2 rows" in printed
