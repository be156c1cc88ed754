"""What an iteration's outcomes cost to cross the engine process's pipe: pickled as Step objects or as plain tuples.

    python benchmarks/pipe_outcomes.py --requests 1,16,64

For each running count, one iteration's outcomes (every request a step of 4 tokens with an adaptive budget's
figures, as `EngineLoop.iterate` makes them) are pickled as `Connection.send` pickles them (ForkingPickler) and
unpickled as `recv` does, both ways in turn: the Step objects themselves, and `wire_outcomes` on the engine side
then `read_outcomes` on the server side. Prints microseconds per iteration on each side (median of --rounds).
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import time
from multiprocessing.reduction import ForkingPickler

from specdeploy.engine.request import Step
from specdeploy.server.engine_process import read_outcomes, wire_outcomes


def timed(fn, repeats: int) -> float:
    """Microseconds per call."""
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - started) / repeats * 1e6


def measure(count: int, repeats: int, rounds: int) -> dict[str, float]:
    """Median microseconds per iteration on each side, for `count` running requests."""
    outcomes = [(rid, Step([1000 + rid, 2, 3, 4], 17, None), (16, 3.2)) for rid in range(count)]
    steps_bytes = bytes(ForkingPickler.dumps(("outcomes", outcomes, count)))
    wire_bytes = bytes(ForkingPickler.dumps(("outcomes", wire_outcomes(outcomes), count)))
    assert read_outcomes(pickle.loads(wire_bytes)[1]) == outcomes
    sides = {
        "steps_engine": lambda: ForkingPickler.dumps(("outcomes", outcomes, count)),
        "steps_server": lambda: pickle.loads(steps_bytes),
        "wire_engine": lambda: ForkingPickler.dumps(("outcomes", wire_outcomes(outcomes), count)),
        "wire_server": lambda: read_outcomes(pickle.loads(wire_bytes)[1]),
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):  # every form in turn, so that a load change hits all
        for name, side in sides.items():
            times[name].append(timed(side, repeats))
    return {name: round(statistics.median(values), 2) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", default="1,16,64")
    parser.add_argument("--repeats", type=int, default=2000, help="iterations timed per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", help="JSON file")
    args = parser.parse_args()
    rows = []
    for count in [int(c) for c in args.requests.split(",")]:
        row = {"requests": count, **measure(count, args.repeats, args.rounds)}
        rows.append(row)
        print(
            f"{count:>3} requests  engine side: Steps {row['steps_engine']:6.1f} us, tuples {row['wire_engine']:6.1f} us"
            f"   server side: Steps {row['steps_server']:6.1f} us, tuples {row['wire_server']:6.1f} us"
        )
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(
                {"command": "benchmarks/pipe_outcomes.py", "args": vars(args), "rows": rows}, handle, indent=1
            )


if __name__ == "__main__":
    main()
