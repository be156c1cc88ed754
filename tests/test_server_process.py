"""`specdeploy serve` as a real process: the load command against it, then SIGTERM mid-stream exits 0."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from server_harness import free_port
from typer.testing import CliRunner

from specdeploy.bench.load import run_load
from specdeploy.cli import app
from specdeploy.errors import SpecdeployError


@pytest.fixture(scope="module")
def server(random_pair: tuple[Path, Path]):
    target, draft = random_pair
    port = free_port()
    argv = [sys.executable, "-m", "specdeploy.cli", "serve", "--target", str(target), "--draft", str(draft)]
    argv += ["--mode", "dflash", "--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, process.communicate()[1]
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the server did not come up"
        time.sleep(0.2)
    yield process, url
    if process.poll() is None:
        process.kill()
        process.communicate()


def test_load_command_reports_throughput_without_errors(server) -> None:
    _, url = server
    args = ["load", "--url", url, "--concurrency", "4", "--requests", "8", "--max-new-tokens", "4", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["requests"] == 8 and report["errors"] == 0 and report["concurrency"] == 4
    assert report["requests_per_s"] > 0 and report["output_tokens_per_s"] > 0
    assert report["mean_accept_length"] >= 1.0  # dflash reports spec_accept_length per request


def test_the_model_is_named_by_its_target_as_given(server, random_pair: tuple[Path, Path]) -> None:
    _, url = server
    (model,) = httpx.get(url + "/v1/models", timeout=10).json()["data"]
    assert model["id"] == str(random_pair[0])
    assert httpx.get(url + "/server_info", timeout=10).json()["served_model_name"] == str(random_pair[0])


def test_load_refuses_a_url_with_no_server() -> None:
    import asyncio

    with pytest.raises(SpecdeployError, match="no server answers"):
        asyncio.run(run_load(f"http://127.0.0.1:{free_port()}", 1, 1, 1, "hi"))


def test_serve_refuses_a_port_in_use_before_loading(random_pair: tuple[Path, Path]) -> None:
    target, _ = random_pair
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["serve", "--target", str(target), "--port", str(port)])
    assert isinstance(result.exception, SpecdeployError)
    assert f"cannot listen on 127.0.0.1:{port}" in str(result.exception)


def test_sigterm_shuts_down_cleanly_mid_stream(server) -> None:
    process, url = server
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}, "stream": True}
    first_event = threading.Event()
    lines: list[str] = []

    def stream_until_cut() -> None:
        with httpx.stream("POST", url + "/generate", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    lines.append(line)
                    first_event.set()

    client = threading.Thread(target=stream_until_cut, daemon=True)
    client.start()
    assert first_event.wait(60), "the stream never started"
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert time.monotonic() - started < 15
    assert "Traceback" not in stderr
    client.join(10)
    # the stream in flight was ended by the server, with SGLang's abort reason, not cut off
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][len("data: ") :])
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert last["meta_info"]["completion_tokens"] < 2000
