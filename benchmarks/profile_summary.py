"""Where a served engine's time goes, from a py-spy profile of `specdeploy serve` (engine in its own process).

    py-spy record --subprocesses --threads --format raw -o server.txt -- python -m specdeploy.cli serve ...
    python benchmarks/profile_summary.py server.txt [more.txt ...]

For each profile (py-spy's raw, collapsed-stack format, recorded with --subprocesses and --threads), prints the
seconds sampled in each part of a serving loop, start-up left out: the engine process's loop (stacks under
`run_engine`, less building the engine), and in the server process the event loop (under asyncio's
`Runner.run`), the engine reader thread and the sender thread; then, for the engine loop, the share of its
samples under each of its parts (admission and prefill, the step, releasing finished rows, moving rows, sending
outcomes), and the source lines that were busiest. py-spy samples only threads that are not idle, so a part's
seconds are the time it ran.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

ENGINE_PARTS = (
    "BatchEngine._prefill",
    "StepRunner.prefill",
    "BatchEngine._step",
    "StepRunner.step",
    "BatchEngine._drop_finished",
    "StepRunner._move_row",
    "BudgetPolicy.choose",
    "_ConnectionBase.send",
)
ENGINE_START_UP = ("EngineRecipe.engine_maker", "EngineLoop.__init__")
LOCATION = re.compile(r" \((.*)\)$")


def stacks(path: Path) -> Iterator[tuple[bool, str, list[str], int]]:
    """(in the engine process, thread, frames as 'function (file:line)', samples) per collapsed stack."""
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        child = len(frames) > 1 and "spawn_main" in frames[1]  # multiprocessing's spawned child
        thread = next((f for f in frames if f.startswith("thread ")), "")
        body = [f for f in frames if not f.startswith(("process ", "thread "))]
        yield child, thread, body, int(count)


def part_of(child: bool, thread: str, names: list[str]) -> str | None:
    """The serving loop's part a stack belongs to, or None (start-up, imports)."""
    if child:
        if "run_engine" in names and not any(n in names for n in ENGINE_START_UP):
            return "engine loop"
        return None
    if "specdeploy-engine-reader" in thread:
        return "server: engine reader thread"
    if "specdeploy-engine-sender" in thread:
        return "server: engine sender thread"
    return "server: event loop" if "Runner.run" in names else None


def summarise(path: Path, rate: float, top: int) -> None:
    seconds: Counter[str] = Counter()
    engine: Counter[str] = Counter()
    lines: Counter[str] = Counter()
    for child, thread, frames, count in stacks(path):
        names = [LOCATION.sub("", f) for f in frames]
        part = part_of(child, thread, names)
        if part is None:
            continue
        seconds[part] += count
        if part == "engine loop":
            for name in ENGINE_PARTS:
                engine[name] += count * (name in names)
            lines[frames[-1]] += count
    print(f"== {path}")
    for part, count in sorted(seconds.items()):
        print(f"  {part:32s} {count / rate:6.2f} s")
    total = seconds["engine loop"]
    if not total:
        return
    print("  engine loop, share of its samples under:")
    for name in ENGINE_PARTS:
        print(f"    {name:30s} {100 * engine[name] / total:5.1f}%")
    print("  engine loop, busiest lines:")
    for frame, count in lines.most_common(top):
        print(f"    {100 * count / total:5.1f}%  {frame}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("profiles", nargs="+", type=Path)
    parser.add_argument("--rate", type=float, default=250.0, help="py-spy's --rate (samples per second)")
    parser.add_argument("--top", type=int, default=8, help="busiest source lines to print")
    args = parser.parse_args()
    for path in args.profiles:
        summarise(path, args.rate, args.top)


if __name__ == "__main__":
    main()
