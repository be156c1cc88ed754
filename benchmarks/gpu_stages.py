"""What the one-call GPU scripts (gpu_kimi_roofline.py, gpu_hybrid.py) share: the commit measured, each stage
run in its own process under a time limit with its output in a log, and the committed steps a run compares with."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commit_of(given: str | None) -> str:
    """`given`, else the checkout's short HEAD (a device copy's git may name another commit: pass --commit)."""
    if given:
        return given
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        return done.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def run(command: list[str], log: Path, limit: float) -> tuple[int, float]:
    """Run `command` with output to `log`, killed after `limit` seconds: (return code, seconds)."""
    started = time.monotonic()
    with log.open("w") as out:
        try:
            code = subprocess.run(
                command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=limit
            ).returncode
        except subprocess.TimeoutExpired:
            out.write(f"\n[killed after {limit:.0f} s]\n")
            code = 124
    return code, time.monotonic() - started


def committed_steps(baselines: list[Path]) -> dict[str, tuple[float, str]]:
    """{mode: (ms per step, file)} from the newest of `baselines` (newest first) that measured the mode."""
    committed: dict[str, tuple[float, str]] = {}
    for path in baselines:
        if path.exists():
            for key, row in json.loads(path.read_text())["engine"].items():
                committed.setdefault(key, (row["ms_per_step"], path.name))
    return committed
