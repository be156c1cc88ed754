"""Other benchmark clients, run as they are installed, on one cell against the loopback server.

Each is optional and lives in its own environment (their pinned dependencies clash with specdeploy's and
with each other's): looked up in `CLIENTS_DIR/<package>/bin` first, then on PATH (and, for sglang, in
this interpreter). Each gets the same prompts, concurrency, request count and answer length, and reports
per request what it measured, parsed from its own output files into a `ClientReport`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdeploy.errors import SpecdeployError

DEFAULT_CLIENTS_DIR = Path("~/.cache/specdeploy/clients").expanduser()

# Per package: how to install it where `--clients-dir DIR` finds it (its own venv; never into specdeploy's).
INSTALL = {
    "sglang": (
        "python3.11 -m venv DIR/sglang && DIR/sglang/bin/pip install torch==2.14.1 torchvision==0.29.1 && "
        "DIR/sglang/bin/pip install --no-deps sglang==0.5.23 && DIR/sglang/bin/pip install aiohttp msgspec "
        "numpy orjson requests tqdm transformers==5.19.0 datasets pybase64 psutil pyzmq starlette IPython "
        "apache-tvm-ffi==0.1.11 sentencepiece compressed-tensors gguf"
    ),
    "aiperf": "python3 -m venv DIR/aiperf && DIR/aiperf/bin/pip install aiperf==0.13.0",
    "guidellm": "python3 -m venv DIR/guidellm && DIR/guidellm/bin/pip install guidellm==0.8.1",
}

# What each client calls ITL: per token (a chunk's gap spread over its tokens), per chunk, or one mean per
# request; each is judged against the same quantity in the server's log (a chunk's ITL against tokens).
TOKEN, CHUNK, MEAN = "token", "chunk", "mean"


@dataclass(frozen=True)
class CellSpec:
    """One cell as every client runs it."""

    url: str
    model: str
    concurrency: int
    requests: int
    output_tokens: int
    prompts: tuple[str, ...]  # one per request, repeats allowed
    tokenizer_dir: Path  # the loopback server's byte-level tokenizer, for clients that count tokens
    workdir: Path  # inputs and outputs of this run


@dataclass(frozen=True)
class ClientReport:
    """What a client reported for a cell: per request TTFT and ITL values, in ms."""

    completed: int
    errors: int
    ttft_ms: list[float] = field(default_factory=list)
    itl_ms: list[float] = field(default_factory=list)


class ClientFailed(Exception):
    """The client ran but did not give a report: the message says why, in a line."""


class ExternalClient:
    """One client as a command: where it is, how to run a cell, how to read what it wrote."""

    name: str  # the table's label
    package: str  # what to install
    itl_kind: str

    def command(self, clients_dir: Path) -> list[str] | None:
        """The command that starts it, or None when it is not installed."""
        raise NotImplementedError

    def argv(self, command: list[str], cell: CellSpec) -> list[str]:
        raise NotImplementedError

    def parse(self, cell: CellSpec) -> ClientReport:
        raise NotImplementedError

    def run(self, command: list[str], cell: CellSpec) -> subprocess.Popen[bytes]:
        """Start it on a cell (the caller waits); its output goes to `<name>.log` in the cell's workdir."""
        cell.workdir.mkdir(parents=True, exist_ok=True)
        log = (cell.workdir / f"{self.name}.log").open("wb")
        return subprocess.Popen(
            self.argv(command, cell), cwd=cell.workdir, stdout=log, stderr=subprocess.STDOUT
        )


def _venv_or_path(clients_dir: Path, package: str, executable: str) -> list[str] | None:
    local = clients_dir / package / "bin" / executable
    if local.is_file():
        return [str(local)]
    found = shutil.which(executable)
    return [found] if found else None


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ClientFailed(f"no readable {what} at {path} ({exc})") from None


class SGLangBench(ExternalClient):
    """`python -m sglang.benchmark.serving`, on /generate (backend sglang) or /v1/completions (sglang-oai)."""

    package = "sglang"

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.name = backend
        self.itl_kind = TOKEN if backend == "sglang" else CHUNK  # sglang-oai takes each chunk gap as one ITL

    def command(self, clients_dir: Path) -> list[str] | None:
        for python in (clients_dir / "sglang" / "bin" / "python", Path(sys.executable)):
            if python.is_file() and _imports(python, "sglang.benchmark.serving"):
                return [str(python), "-m", "sglang.benchmark.serving"]
        return None

    def argv(self, command: list[str], cell: CellSpec) -> list[str]:
        dataset = cell.workdir / "sglang-prompts.jsonl"
        rows = [{"conversations": [{"content": p}, {"content": "ok"}]} for p in cell.prompts]
        dataset.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return [
            *command,
            *("--backend", self.backend, "--base-url", cell.url, "--model", cell.model),
            *("--tokenizer", str(cell.tokenizer_dir), "--dataset-name", "custom"),
            *("--dataset-path", str(dataset), "--num-prompts", str(cell.requests)),
            *("--sharegpt-output-len", str(cell.output_tokens), "--max-concurrency", str(cell.concurrency)),
            *("--request-rate", "inf", "--output-file", str(self._output(cell)), "--output-details"),
            "--disable-tqdm",
        ]

    def _output(self, cell: CellSpec) -> Path:
        return cell.workdir / f"{self.name}.jsonl"

    def parse(self, cell: CellSpec) -> ClientReport:
        lines = self._output(cell).read_text().splitlines() if self._output(cell).is_file() else []
        if not lines:
            raise ClientFailed(f"sglang wrote no results to {self._output(cell)}")
        result = json.loads(lines[-1])
        ok = [i for i, error in enumerate(result["errors"]) if not error]
        return ClientReport(
            completed=len(ok),
            errors=len(result["errors"]) - len(ok),
            ttft_ms=[result["ttfts"][i] * 1e3 for i in ok],
            itl_ms=[v * 1e3 for i in ok for v in result["itls"][i]],
        )


def _imports(python: Path, module: str) -> bool:
    """Whether that interpreter can import the module (a broken install counts as missing)."""
    check = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}.rsplit('.', 1)[0]) is None)"
    try:
        found = subprocess.run([str(python), "-c", check], capture_output=True, timeout=60).returncode == 0
        if not found:
            return False
        return (
            subprocess.run(
                [str(python), "-c", f"import {module}"], capture_output=True, timeout=300
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


class AIPerf(ExternalClient):
    name = package = "aiperf"
    itl_kind = MEAN

    def command(self, clients_dir: Path) -> list[str] | None:
        return _venv_or_path(clients_dir, "aiperf", "aiperf")

    def argv(self, command: list[str], cell: CellSpec) -> list[str]:
        dataset = cell.workdir / "aiperf-prompts.jsonl"
        dataset.write_text("".join(json.dumps({"text": p}) + "\n" for p in cell.prompts))
        return [
            *command,
            "profile",
            *("--model", cell.model, "--url", cell.url, "--endpoint-type", "completions", "--streaming"),
            *("--concurrency", str(cell.concurrency), "--request-count", str(cell.requests)),
            *("--tokenizer", str(cell.tokenizer_dir), "--input-file", str(dataset)),
            *("--custom-dataset-type", "single_turn", "--extra-inputs", f"max_tokens:{cell.output_tokens}"),
            *("--output-artifact-dir", str(cell.workdir / "aiperf"), "--ui-type", "none"),
            *("--no-server-metrics", "--no-gpu-telemetry"),
        ]

    def parse(self, cell: CellSpec) -> ClientReport:
        path = cell.workdir / "aiperf" / "profile_export.jsonl"
        if not path.is_file():
            raise ClientFailed(f"aiperf wrote no per-request records to {path}")
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        ok = [r["metrics"] for r in records if not r.get("error") and "time_to_first_token" in r["metrics"]]
        return ClientReport(
            completed=len(ok),
            errors=len(records) - len(ok),
            ttft_ms=[m["time_to_first_token"]["value"] for m in ok],
            itl_ms=[m["inter_token_latency"]["value"] for m in ok if "inter_token_latency" in m],
        )


class GuideLLM(ExternalClient):
    name = package = "guidellm"
    itl_kind = MEAN

    def command(self, clients_dir: Path) -> list[str] | None:
        return _venv_or_path(clients_dir, "guidellm", "guidellm")

    def argv(self, command: list[str], cell: CellSpec) -> list[str]:
        dataset = cell.workdir / "guidellm-prompts.jsonl"
        dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in cell.prompts))
        backend = f"kind=openai_http,target={cell.url},model={cell.model},request_format=/v1/completions"
        return [
            *command,
            "run",
            *("--backend", f"{backend},max_tokens={cell.output_tokens}"),
            *("--profile", f"kind=concurrent,streams={cell.concurrency}"),
            *("--constraint", f"kind=max_requests,count={cell.requests}"),
            *(
                "--data",
                f"kind=json_file,path={dataset}",
                "--tokenizer",
                f"kind=hf_auto,model={cell.tokenizer_dir}",
            ),
            *(
                "--output",
                f"kind=json,path={cell.workdir / 'guidellm.json'}",
                "--disable-console-interactive",
            ),
        ]

    def parse(self, cell: CellSpec) -> ClientReport:
        report = _read_json(cell.workdir / "guidellm.json", "guidellm report")
        requests = report["benchmarks"][0]["requests"]
        ok = requests.get("successful") or []
        failed = len(requests.get("errored") or []) + len(requests.get("incomplete") or [])
        return ClientReport(
            completed=len(ok),
            errors=failed,
            ttft_ms=[r["time_to_first_token_ms"] for r in ok if r.get("time_to_first_token_ms") is not None],
            itl_ms=[r["inter_token_latency_ms"] for r in ok if r.get("inter_token_latency_ms") is not None],
        )


def external_clients(names: list[str]) -> list[ExternalClient]:
    """The clients `--compare` names: sglang means both of its backends."""
    known: dict[str, list[ExternalClient]] = {
        "sglang": [SGLangBench("sglang"), SGLangBench("sglang-oai")],
        "aiperf": [AIPerf()],
        "guidellm": [GuideLLM()],
    }
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SpecdeployError(f"--compare takes {', '.join(known)}; unknown: {', '.join(unknown)}")
    return [client for name in dict.fromkeys(names) for client in known[name]]


def install_hint(package: str, clients_dir: Path) -> str:
    return INSTALL[package].replace("DIR", str(clients_dir))
