"""The engine in a thread of the server's process against a process of its own: one server at a time, in turn.

    python benchmarks/engine_process_ab.py --mode ddtree --budget 4 --concurrency 1,8 --rounds 2 --out ab.json
    python benchmarks/engine_process_ab.py --device cuda --budget 64 --concurrency 1,16,64 --max-new-tokens 128 ...

Each round starts `specdeploy serve --engine-thread`, then `--engine-process` (the default), over the zoo's
tiny-code pair, and measures each with `specdeploy bench` (closed loop, greedy, the demo's built-in prompts, no
network) at every concurrency. Prints every cell's output tok/s, the means over rounds and the process's ratio to
the thread, and writes them to `--out`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from auto_budget_cpu import free_port, stop, wait_healthy, work_dir

PLACEMENTS = {"thread": "--engine-thread", "process": "--engine-process"}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", default="ddtree", choices=["ar", "dflash", "ddtree"])
    parser.add_argument("--budget", default="4", help="DDTree budget (a number or auto)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--max-running-requests", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per cell")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    concurrency = [int(c) for c in args.concurrency.split(",")]
    work, prompts = work_dir("engine-process-ab-")
    budget = [] if args.mode != "ddtree" else ["--budget", args.budget]
    cells: dict[str, dict[int, list[float]]] = {p: {c: [] for c in concurrency} for p in PLACEMENTS}
    for round_ in range(args.rounds):
        for placement, flag in PLACEMENTS.items():
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            log = work / f"{placement}-{round_}.log"
            command = [sys.executable, "-m", "specdeploy.cli", "serve", "--target", "zoo:tiny-code", "--port",
                       str(port), "--mode", args.mode, *budget, "--device", args.device, "--max-running-requests",
                       str(args.max_running_requests), "--context-length", "1024", "--log-level", "warning", flag]  # fmt: skip
            with log.open("w") as out:
                server = subprocess.Popen(
                    command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            try:
                wait_healthy(url, server, log)
                run = work / f"{placement}-{round_}"
                subprocess.run(
                    [sys.executable, "-m", "specdeploy.cli", "bench", "--url", url, "--dataset", "custom",
                     "--data-dir", str(prompts), "--concurrency", args.concurrency, "--duration",
                     str(args.duration), "--max-new-tokens", str(args.max_new_tokens), "--warmup", "1",
                     "--no-chat-template", "--mode", args.mode, *budget, "--out", str(run), "--json"],
                    check=True, stdout=subprocess.DEVNULL,
                )  # fmt: skip
            finally:
                stop(server)
            summary = json.loads((run / "summary.json").read_text())
            for cell in summary["cells"].values():
                cells[placement][cell["key"]["concurrency"]].append(round(cell["metrics"]["output_tok_s"], 2))
            line = ", ".join(f"c={c} {cells[placement][c][-1]:.1f} tok/s" for c in concurrency)
            print(f"round {round_ + 1} {placement}: {line}", flush=True)
    means = {p: {c: statistics.mean(v) for c, v in by_c.items()} for p, by_c in cells.items()}
    ratios = {c: round(means["process"][c] / means["thread"][c], 3) for c in concurrency}
    for c in concurrency:
        print(f"c={c}: thread {means['thread'][c]:.1f}, process {means['process'][c]:.1f} tok/s; "
              f"process / thread = {ratios[c]:.3f}")  # fmt: skip
    result = {
        "command": " ".join(["python", "benchmarks/engine_process_ab.py", *sys.argv[1:]]),
        "output_tok_s_by_round": cells,
        "mean_output_tok_s": means,
        "process_over_thread": ratios,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
