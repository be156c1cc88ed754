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


def run(
    command: list[str], log: Path, limit: float, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> tuple[int, float]:
    """Run `command` in `cwd` with output to `log`, killed after `limit` seconds: (return code, seconds)."""
    started = time.monotonic()
    with log.open("w") as out:
        try:
            code = subprocess.run(
                command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=limit
            ).returncode
        except subprocess.TimeoutExpired:
            out.write(f"\n[killed after {limit:.0f} s]\n")
            code = 124
    return code, time.monotonic() - started


def card_of(result: dict) -> str | None:
    """The GPU a side-by-side result was measured on, as its JSON names it (None where it names none)."""
    return result.get("machine", {}).get("gpu")


def committed_steps(baselines: list[Path], card: str | None = None) -> dict[str, tuple[float, str]]:
    """{mode: (ms per step, file)} from the newest of `baselines` (newest first) that measured the mode, among
    those measured on `card` (all of them where `card` is None): one card's step says nothing of another's."""
    committed: dict[str, tuple[float, str]] = {}
    for path in baselines:
        if path.exists():
            result = json.loads(path.read_text())
            if card is None or card_of(result) == card:
                for key, row in result["engine"].items():
                    committed.setdefault(key, (row["ms_per_step"], path.name))
    return committed


def compare_steps(measured: dict, before: dict[str, tuple[float, str]], at_most: float) -> dict:
    """Each measured mode that `before` has: its step, the earlier step and its file, their ratio, and whether
    the ratio is at most `at_most`."""
    out = {}
    for key, row in measured.get("engine", {}).items():
        if key in before:
            ms, source = before[key]
            ratio = row["ms_per_step"] / ms
            out[key] = {
                "ms": row["ms_per_step"],
                "committed_ms": ms,
                "committed_file": source,
                "ratio": ratio,
                "bar": at_most,
                "passed": ratio <= at_most,
            }
    return out
