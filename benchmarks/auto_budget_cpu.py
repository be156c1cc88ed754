"""`--budget auto` against AR and fixed DDTree budgets on the CPU: the zoo's tiny-code pair, one server at a time.

    python benchmarks/auto_budget_cpu.py --rounds 4 --duration 20 --out result.json

Each round starts every server in turn, the order reversed every other round (AR, DDTree 4, DDTree 16, auto, then
auto, DDTree 16, DDTree 4, AR, ...), so that a load change on a shared machine hits all alike and a steady drift
favours none (in the same order each round, auto always ran last, furthest from AR), and measures each with
`specdeploy bench` at concurrency 1 and 8 (closed loop, `--duration` seconds per cell, greedy, 64 new tokens) on
the demo's built-in prompts (no network). Prints, and writes to `--out`, every cell's output tokens/s, the mean
over rounds per server and concurrency, auto's ratio to the best of the others (of the means, each round's, and
their median), and auto's chosen budgets and its predicted against realised acceptance (from its /server_info and
the responses' meta_info).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from specdeploy.zoo.prompts import DEMO_PROMPTS

SERVERS = {"ar": ["--mode", "ar"], "ddtree-4": ["--mode", "ddtree", "--budget", "4"],
           "ddtree-16": ["--mode", "ddtree", "--budget", "16"],
           "auto": ["--mode", "ddtree", "--budget", "auto", "--max-budget", "16"]}  # fmt: skip
CONCURRENCY = (1, 8)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def round_order(names: list[str], round_: int) -> list[str]:
    """The servers in the order round `round_` starts them: as given, reversed every other round, so that over an
    even number of rounds every server runs as often early as late."""
    return names if round_ % 2 == 0 else names[::-1]


def serve(name: str, port: int, log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "specdeploy.cli", "serve", "--target", "zoo:tiny-code", "--port", str(port),
               "--max-running-requests", "8", "--context-length", "512", *SERVERS[name]]  # fmt: skip
    with log.open("w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def work_dir(prefix: str) -> tuple[Path, Path]:
    """A new folder for the servers' logs and the benches' results (its path printed), and the demo's prompts
    written in it as a custom dataset."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    print(f"servers' logs and each bench's results: {work}", flush=True)
    prompts = work / "demo_prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": f"demo/{i}", "prompt": p}) + "\n" for i, p in enumerate(DEMO_PROMPTS))
    )
    return work, prompts


def wait_healthy(url: str, server: subprocess.Popen, log: Path, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server at {url} exited with {server.returncode}: see {log}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"the server at {url} was not healthy within {timeout:.0f} s: see {log}")


def stop(server: subprocess.Popen) -> None:
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def bench(url: str, name: str, prompts: Path, duration: float, out: Path) -> dict:
    mode = "ar" if name == "ar" else "ddtree"
    budget = [] if name == "ar" else ["--budget", name.removeprefix("ddtree-")]
    command = [sys.executable, "-m", "specdeploy.cli", "bench", "--url", url, "--dataset", "custom",
               "--data-dir", str(prompts), "--concurrency", ",".join(map(str, CONCURRENCY)),
               "--duration", str(duration), "--max-new-tokens", "64", "--warmup", "1", "--no-chat-template",
               "--mode", mode, *budget, "--out", str(out), "--json"]  # fmt: skip
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "summary.json").read_text())


def auto_meta(run_dir: Path) -> dict[int, dict]:
    """Per concurrency: the chosen budgets over every verify step, and mean predicted vs realised tokens."""
    by_c: dict[int, dict] = {}
    summary = json.loads((run_dir / "summary.json").read_text())
    cells = {cell_id: cell["key"]["concurrency"] for cell_id, cell in summary["cells"].items()}
    for line in (run_dir / "requests.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("cell") not in cells or not record.get("ddtree_budgets"):
            continue
        seen = by_c.setdefault(cells[record["cell"]], {"budgets": [], "predicted": [], "realised": []})
        seen["budgets"] += record["ddtree_budgets"]
        seen["predicted"].append(record["ddtree_predicted_accept_length"])
        seen["realised"].append(record["spec_accept_length"])
    return {
        c: {
            "budget_mean": round(statistics.mean(s["budgets"]), 2),
            "budget_counts": {b: s["budgets"].count(b) for b in sorted(set(s["budgets"]))},
            "ar_step_share": round(s["budgets"].count(0) / len(s["budgets"]), 3),
            "predicted_accept_length": round(statistics.mean(s["predicted"]), 3),
            "realised_accept_length": round(statistics.mean(s["realised"]), 3),
        }
        for c, s in sorted(by_c.items())
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rounds", type=int, default=4, help="an even count puts every server as often early as late"
    )
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per cell")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    work, prompts = work_dir("auto-budget-")
    cells: dict[str, dict[int, list[float]]] = {name: {c: [] for c in CONCURRENCY} for name in SERVERS}
    taus: dict[str, dict[int, list[float]]] = {name: {c: [] for c in CONCURRENCY} for name in SERVERS}
    auto_rounds = []
    for round_ in range(args.rounds):
        for name in round_order(list(SERVERS), round_):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            log = work / f"{name}-{round_}.log"
            server = serve(name, port, log)
            try:
                wait_healthy(url, server, log)
                summary = bench(url, name, prompts, args.duration, work / f"{name}-{round_}")
                info = httpx.get(url + "/server_info", timeout=30).json() if name == "auto" else None
            finally:
                stop(server)
            for cell in summary["cells"].values():
                c, metrics = cell["key"]["concurrency"], cell["metrics"]
                cells[name][c].append(round(metrics["output_tok_s"], 2))
                taus[name][c].append(metrics["tau"]["mean"])
            line = ", ".join(f"c={c} {cells[name][c][-1]:.1f} tok/s" for c in CONCURRENCY)
            print(f"round {round_ + 1} {name}: {line}", flush=True)
            if info is not None:
                policy = info["internal_states"][0]["ddtree_budget_policy"]
                auto_rounds.append(
                    {"server_info_policy": policy, "by_concurrency": auto_meta(work / f"{name}-{round_}")}
                )
    means = {name: {c: statistics.mean(v) for c, v in by_c.items()} for name, by_c in cells.items()}
    ratios = {}
    for c in CONCURRENCY:
        best = max((n for n in SERVERS if n != "auto"), key=lambda n: means[n][c])
        # each round's servers ran one after another: its own ratio shows how far the rounds spread
        by_round = [round(a / b, 3) for a, b in zip(cells["auto"][c], cells[best][c], strict=True)]
        ratios[c] = {"best_fixed": best, "auto_over_best": round(means["auto"][c] / means[best][c], 3),
                     "auto_over_best_by_round": by_round,
                     "auto_over_best_median_of_rounds": round(statistics.median(by_round), 3)}  # fmt: skip
        print(f"c={c}: " + ", ".join(f"{n} {means[n][c]:.1f}" for n in SERVERS)
              + f"; auto / {best} = {ratios[c]['auto_over_best']:.3f} (rounds: {by_round}; median "
              f"{ratios[c]['auto_over_best_median_of_rounds']:.3f})")  # fmt: skip
    for i, one in enumerate(auto_rounds):
        for c, seen in one["by_concurrency"].items():
            print(f"auto round {i + 1} c={c}: {seen}")
    result = {
        "command": " ".join(["python", "benchmarks/auto_budget_cpu.py", *sys.argv[1:]]),
        "workload": {
            "pair": "zoo:tiny-code",
            "prompts": "DEMO_PROMPTS (built in)",
            "max_new_tokens": 64,
            "greedy": True,
            "duration_s": args.duration,
            "max_running_requests": 8,
        },  # fmt: skip
        "output_tok_s_by_round": cells,
        "tau_by_round": taus,
        "mean_output_tok_s": means,
        "auto_over_best_fixed": ratios,
        "auto": auto_rounds,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
