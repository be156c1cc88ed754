"""The reference server against hostile input, tried as an attacker would, with its memory watched.

The server runs as its own process so that its peak resident memory (VmHWM) is its own: a body refused
before it is read, or a text refused before it is tokenised, must not move it by more than the body itself.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from server_harness import free_port, running_server

from specdeploy.server.guard import DEFAULT_MAX_BODY_BYTES, HttpGuard

MIB = 1 << 20
# Well above one request body at the limit and its parsed copy; far below what the old paths cost
# (a 50 MB body tokenised grew the server from 0.5 to 2.1 GB).
GROWTH_BOUND_MIB = 64

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/status")


def peak_rss_mib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) // 1024


@pytest.fixture(scope="module")
def server(random_pair: tuple[Path, Path]):
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "specdeploy.cli",
        "serve",
        "--target",
        str(random_pair[0]),
        "--port",
        str(port),
    ]
    process = subprocess.Popen(
        [*argv, "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
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
    warm = httpx.post(
        url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}, timeout=60
    )
    assert warm.status_code == 200
    yield process, url, peak_rss_mib(process.pid)
    process.kill()
    process.communicate()


def error_of(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text[:300]
    body = response.json()
    assert body["object"] == "error" and body["code"] == status
    return body["message"]


@pytest.mark.parametrize("path", ["/generate", "/v1/completions", "/v1/chat/completions"])
def test_deeply_nested_json_is_a_400_not_a_500(server, path: str) -> None:
    _, url, _ = server
    for body in (b"[" * 5000, b'{"text": ' + b"[" * 100 + b"]" * 100 + b"}"):
        response = httpx.post(
            url + path, content=body, headers={"content-type": "application/json"}, timeout=30
        )
        assert "nests deeper than" in error_of(response, 400)


def test_a_body_announced_larger_than_the_limit_is_refused_before_it_is_sent(server) -> None:
    process, url, baseline = server
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        head = f"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {50 * 10**6}\r\n\r\n"
        conn.sendall(head.encode() + b'{"text": "')  # and nothing more: the answer must not wait for 50 MB
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 413")
    message = json.loads(rest.partition(b"\r\n\r\n")[2])["message"]
    assert f"limit of {DEFAULT_MAX_BODY_BYTES} bytes" in message and "--max-request-bytes" in message
    assert peak_rss_mib(process.pid) - baseline < GROWTH_BOUND_MIB


def test_50_mb_bodies_sent_whole_or_chunked_get_413_with_memory_bounded(server) -> None:
    process, url, baseline = server
    whole = httpx.post(url + "/generate", content=b"x" * (50 * 10**6), timeout=120)
    assert f"{DEFAULT_MAX_BODY_BYTES} bytes" in error_of(whole, 413)

    def chunks():  # no Content-Length: the server counts what arrives and stops at the limit
        for _ in range(50):
            yield b"y" * MIB

    chunked = httpx.post(url + "/generate", content=chunks(), timeout=120)
    assert f"{DEFAULT_MAX_BODY_BYTES} bytes" in error_of(chunked, 413)
    assert peak_rss_mib(process.pid) - baseline < GROWTH_BOUND_MIB


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/generate", {"text": "a" * 8_000_000}),
        ("/generate", {"text": ["short", "b" * 8_000_000]}),
        ("/v1/completions", {"prompt": "c" * 8_000_000}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "d" * 8_000_000}]}),
    ],
)
def test_long_texts_are_refused_before_they_are_tokenised(server, path: str, body: dict) -> None:
    process, url, baseline = server
    started = time.monotonic()
    message = error_of(httpx.post(url + path, json=body, timeout=120), 400)
    assert "cannot fit the model's context length of 2048 tokens" in message
    # tokenising 8 M characters costs hundreds of MB and seconds; refusing it costs the body
    assert peak_rss_mib(process.pid) - baseline < GROWTH_BOUND_MIB
    assert time.monotonic() - started < 10


def test_a_batch_larger_than_the_queue_is_refused_before_it_is_tokenised(server) -> None:
    process, url, baseline = server
    texts = ["e" * 20_000] * 600  # each fits the context; together 12 M characters, more than the queue holds
    message = error_of(httpx.post(url + "/generate", json={"text": texts}, timeout=120), 413)
    assert "A batch of 600 prompts can never fit the request queue (256)" in message
    assert peak_rss_mib(process.pid) - baseline < GROWTH_BOUND_MIB


def test_the_server_still_serves_after_all_that(server) -> None:
    _, url, _ = server
    response = httpx.post(
        url + "/generate",
        json={"text": "hello", "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}},
    )
    assert response.status_code == 200 and response.json()["meta_info"]["completion_tokens"] == 2


def test_the_limit_is_configurable(random_pair: tuple[Path, Path]) -> None:
    with running_server(random_pair, "ar", guard=HttpGuard(max_body_bytes=200)) as url:
        small = httpx.post(url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 1}})
        assert small.status_code == 200
        big = httpx.post(url + "/generate", json={"text": "h" * 300})
        assert "limit of 200 bytes" in error_of(big, 413)
