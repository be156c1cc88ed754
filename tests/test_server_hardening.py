"""Hostile requests sent while another request streams: each gets its 4xx (never a 5xx or a reset), the
connection it came on stays usable where HTTP allows, and the streaming request's output equals its output
alone."""

from __future__ import annotations

import asyncio
import json
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from server_harness import free_port, running_server, sse_events

from specdeploy.engine.sampling import SamplingParams
from specdeploy.errors import SpecdeployError
from specdeploy.server import connection
from specdeploy.server.guard import HttpGuard

# 1536 tokens: the witness must still stream while the hostile requests wait out their 1 s deadlines, also on a
# fast CPU (480 took 0.8 s on one, and the 408 test then failed)
WITNESS = {
    "text": "The witness streams while the others misbehave:",
    "sampling_params": {"temperature": 0, "max_new_tokens": 1536, "ignore_eos": True},
    "stream": True,
}
MAX_BODY = 1 << 20
GUARD = HttpGuard(max_body_bytes=MAX_BODY, header_timeout_s=1.0, body_timeout_s=1.0, linger_s=5.0)
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(random_pair: tuple[Path, Path]) -> Iterator[tuple[str, dict]]:
    with running_server(random_pair, "ddtree", 8, guard=GUARD) as url:
        alone = httpx.post(url + "/generate", json=WITNESS, timeout=120)
        yield url, sse_events(alone)[-1]


@contextmanager
def witness_streaming(url: str, alone: dict, overlap: bool = True) -> Iterator[None]:
    """Run the witness stream in a thread; the body runs once its first event arrived. Afterwards the witness
    must have ended exactly as when it ran alone and, with `overlap`, still been streaming when the body
    ended (else the body did not run beside it)."""
    result: dict = {}
    started = threading.Event()

    def stream() -> None:
        try:
            with httpx.stream("POST", url + "/generate", json=WITNESS, timeout=120) as response:
                result["status"] = response.status_code
                for line in response.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        result["last"] = json.loads(line[len("data: ") :])
                        started.set()
        except Exception as exc:
            result["error"] = exc
        finally:
            result["ended_at"] = time.monotonic()
            started.set()

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        assert started.wait(60)
        yield
        body_done = time.monotonic()
    finally:
        thread.join(120)
    assert "error" not in result, result.get("error")
    assert result["status"] == 200
    assert result["last"]["output_ids"] == alone["output_ids"] and result["last"]["text"] == alone["text"]
    if overlap:
        assert result["ended_at"] > body_done, "the witness ended before the hostile request was answered"


def raw_request(path: str, body: bytes | dict) -> tuple[str, bytes]:
    return path, body if isinstance(body, bytes) else json.dumps(body).encode()


def send_together(url: str, requests: list[tuple[str, bytes]]) -> list[httpx.Response]:
    """POST every (path, raw JSON body) at once; the answers in the same order."""

    async def main() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=len(requests))
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
            headers = {"content-type": "application/json"}
            return await asyncio.gather(*(client.post(p, content=b, headers=headers) for p, b in requests))

    return asyncio.run(main())


def error_message(response: httpx.Response, status: int = 400) -> str:
    assert response.status_code == status, response.text[:300]
    body = response.json()
    assert body["object"] == "error" and body["code"] == status
    return body["message"]


def generate(**sampling: object) -> dict:
    return {"text": "hi", "sampling_params": {"max_new_tokens": 4, **sampling}}


def completion(**fields: object) -> dict:
    return {"prompt": "hi", "max_tokens": 4, **fields}


def chat(**fields: object) -> dict:
    return {"messages": CHAT, "max_tokens": 4, **fields}


# (route, body, words the 400's message must hold)
NUMBER_CASES = [
    ("/generate", generate(temperature=1e39), "largest float32"),
    ("/v1/completions", completion(temperature=1e39, stream=True), "largest float32"),
    ("/v1/chat/completions", chat(temperature=1e39), "largest float32"),
    ("/generate", generate(temperature=10**400), "finite number"),
    ("/v1/chat/completions", chat(top_p=10**400), "finite number"),
    ("/generate", generate(top_p=1e-46), "round to 0"),
    ("/v1/completions", completion(top_p=1e-46), "round to 0"),
]
for _name, _value in [("temperature", "0.5"), ("temperature", True), ("top_p", "0.5"), ("top_p", False)]:
    NUMBER_CASES += [
        ("/generate", generate(**{_name: _value}), f"{_name} must be a number"),
        ("/v1/completions", completion(**{_name: _value}), f"{_name} must be a number"),
        ("/v1/chat/completions", chat(**{_name: _value}), f"{_name} must be a number"),
    ]
NUMBER_CASES += [
    ("/v1/completions", completion(top_k="5"), "top_k must be an integer"),
    ("/v1/chat/completions", chat(top_k=True), "top_k must be an integer"),
    ("/v1/completions", completion(seed="1"), "seed must be an integer"),
    ("/v1/chat/completions", chat(max_tokens="4"), "max_tokens must be an integer"),
    ("/v1/chat/completions", chat(max_completion_tokens=True), "max_completion_tokens must be an integer"),
    ("/v1/completions", completion(n=True), "n=True is not supported"),
    ("/v1/chat/completions", chat(frequency_penalty="0"), "not supported"),
    ("/v1/completions", completion(stop_token_ids=["1"]), "stop_token_ids must be a list of integer"),
]


BIG = b"9" * 5000  # more digits than Python converts to an integer (sys.get_int_max_str_digits)
BIG_INTEGER_CASES = [
    ("/generate", b'{"text": "hi", "sampling_params": {"top_k": ' + BIG + b"}}"),
    ("/generate", b'{"input_ids": [1, ' + BIG + b'], "stream": true}'),
    ("/v1/completions", b'{"prompt": [1, ' + BIG + b'], "stream": true}'),
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": ' + BIG + b"}",
    ),
]
SURROGATE = "\\ud800"  # as JSON writes it: a lone high surrogate
# (route, body with %s where the surrogate goes, the field the 400 names)
SURROGATE_CASES = [
    ("/generate", '{"text": "a%sb"}', "text"),
    ("/generate", '{"text": "a", "rid": "%s", "stream": true}', "rid"),
    ("/generate", '{"text": ["ok", "%s"]}', "text.1"),
    ("/generate", '{"text": "a", "sampling_params": {"stop": "%s"}}', "sampling_params.stop"),
    ("/v1/completions", '{"prompt": "%s", "stream": true}', "prompt"),
    ("/v1/completions", '{"prompt": "a", "model": "%s"}', "model"),
    (
        "/v1/chat/completions",
        '{"messages": [{"role": "user", "content": "%s"}], "stream": true}',
        "messages.0.content",
    ),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "x%s": 1}', "the body"),
]


def test_hostile_request_bodies_get_their_400_while_another_request_streams_unchanged(server) -> None:
    """Every case of the probe at once, beside the witness: wrong kinds and out-of-range numbers on each
    route, 5000-digit integers, lone surrogates in every field (streaming too), NaN, infinity, deep nesting."""
    url, alone = server
    requests = [raw_request(path, body) for path, body, _ in NUMBER_CASES]
    requests += BIG_INTEGER_CASES
    requests += [raw_request(path, (template % SURROGATE).encode()) for path, template, _ in SURROGATE_CASES]
    others = [
        raw_request("/generate", b'{"text": "a", "sampling_params": {"temperature": Infinity}}'),
        raw_request("/v1/completions", b'{"prompt": "a", "temperature": NaN}'),
        raw_request("/v1/chat/completions", b"[" * 5000),
    ]
    with witness_streaming(url, alone):
        answers = send_together(url, requests + others)
    expected = [words for _, _, words in NUMBER_CASES]
    expected += ["more than 4300 digits"] * len(BIG_INTEGER_CASES)
    expected += [f"{where} holds a lone UTF-16 surrogate (\\ud800)" for _, _, where in SURROGATE_CASES]
    expected += ["finite number", "finite number", "nests deeper than 32 levels"]
    wrong = [
        (path, body[:120], answer.status_code, answer.text[:200])
        for (path, body), answer, words in zip(requests + others, answers, expected, strict=True)
        if answer.status_code != 400 or words not in answer.json().get("message", "")
    ]
    assert not wrong, wrong
    assert all(answer.json()["object"] == "error" for answer in answers)


def test_a_surrogate_pair_is_a_character_and_is_served(server) -> None:
    url, _ = server
    body = b'{"text": "\\ud83d\\ude00", "sampling_params": {"max_new_tokens": 2}}'
    response = httpx.post(url + "/generate", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text


def test_temperatures_below_the_greedy_floor_decode_greedily(server) -> None:
    """Below 1e-6 (SGLang's _SAMPLING_EPS) a temperature is greedy: the output is temperature 0's, never a
    degenerate repeat from NaN probabilities."""
    url, alone = server
    sampling = {**WITNESS["sampling_params"], "max_new_tokens": 12}
    prompt = WITNESS["text"]
    greedy = httpx.post(
        url + "/generate", json={"text": prompt, "sampling_params": sampling}, timeout=60
    ).json()
    assert len(set(greedy["output_ids"])) > 1  # this prompt's greedy text is no single repeated token
    temperatures = [1e-45, 1e-40, 1e-38, 5e-7]
    bodies = [{"text": prompt, "sampling_params": {**sampling, "temperature": t}} for t in temperatures]
    with witness_streaming(url, alone):
        answers = send_together(url, [raw_request("/generate", body) for body in bodies])
    assert [a.json()["output_ids"] for a in answers] == [greedy["output_ids"]] * len(temperatures)


def test_sampling_params_check_values_as_the_float32_they_become() -> None:
    assert SamplingParams(temperature=3e38).temperature == 3e38  # float32's largest is 3.4028e38
    assert SamplingParams(top_p=1e-40).top_p == 1e-40  # a float32 subnormal, still above 0
    for bad in (
        {"temperature": 3.5e38},
        {"temperature": float("inf")},
        {"top_p": 1e-46},
        {"top_p": 1.0000001},
    ):
        with pytest.raises(SpecdeployError):
            SamplingParams(**bad)
    assert SamplingParams(temperature=9.9e-7).greedy and not SamplingParams(temperature=1e-6).greedy


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def read_until_closed(conn: socket.socket, limit_s: float) -> bytes:
    """Everything the server sends until it closes the connection; a reset fails the test."""
    conn.settimeout(limit_s)
    answer = b""
    while chunk := conn.recv(65536):
        answer += chunk
    return answer


def read_response(conn: socket.socket, limit_s: float) -> bytes:
    """One response: its head and a body of its Content-Length."""
    conn.settimeout(limit_s)
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += conn.recv(65536)
    head, _, body = answer.partition(b"\r\n\r\n")
    length = int(
        next(
            line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
    )
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


def test_flush_cache_timeouts_are_checked_and_the_connection_stays_usable(server) -> None:
    """Each refused on one connection, which then still answers (a 500 used to close it)."""
    url, alone = server
    with witness_streaming(url, alone), socket.create_connection(("127.0.0.1", port_of(url))) as conn:
        for timeout in ["1e10", "inf", "nan", "-1", "soon", "3600.5", "0"]:
            conn.sendall(
                f"POST /flush_cache?timeout={timeout} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode()
            )
            answer = read_response(conn, 30)
            assert answer.startswith(b"HTTP/1.1 400 "), answer
            if timeout == "0":  # a valid wait, too short for the witness to finish
                assert b"requests are running" in answer
            else:
                assert b"timeout must be a number of seconds from 0 to 3600" in answer, timeout
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(conn, 30).startswith(b"HTTP/1.1 200 ")


def test_flush_cache_waits_for_the_running_requests_then_flushes(server) -> None:
    url, alone = server
    with witness_streaming(url, alone, overlap=False):  # the flush answers once the witness is done
        flushed = httpx.post(url + "/flush_cache", params={"timeout": "120"}, timeout=130)
        assert flushed.status_code == 200 and flushed.text.startswith("Cache flushed.")


HALF_OPEN = [
    (b"", b"headers did not arrive within 1 s"),
    (b"POST /generate HTTP/1.1\r\nHost: x\r\n", b"headers did not arrive within 1 s"),
    (
        b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 60\r\n\r\n{",
        b"body stalled for 1 s",
    ),
]


def test_half_open_connections_get_408_and_are_closed(server) -> None:
    """Nothing sent, headers cut off, a body cut off: each answered 408 and closed after its 1 s deadline."""
    url, alone = server
    with witness_streaming(url, alone):
        started = time.monotonic()
        conns = [socket.create_connection(("127.0.0.1", port_of(url))) for _ in HALF_OPEN]
        for conn, (sent, _) in zip(conns, HALF_OPEN, strict=True):
            conn.sendall(sent)
        answers = [read_until_closed(conn, 10) for conn in conns]
        assert time.monotonic() - started < 5
    for conn, answer, (_, words) in zip(conns, answers, HALF_OPEN, strict=True):
        conn.close()
        assert answer.startswith(b"HTTP/1.1 408 ") and words in answer, answer


def test_headers_trickled_byte_by_byte_still_meet_the_deadline(server) -> None:
    """The header deadline runs from when the request became due, not from the latest byte."""
    url, _ = server
    with socket.create_connection(("127.0.0.1", port_of(url))) as conn:
        started = time.monotonic()
        for byte in b"GET /health HTTP/1.1\r\nX-Slow: " + b"a" * 200:
            if select.select([conn], [], [], 0.05)[0]:  # the answer came: stop sending, read it
                break
            conn.sendall(bytes([byte]))
        answer = read_until_closed(conn, 10)
    assert answer.startswith(b"HTTP/1.1 408 ") and time.monotonic() - started < 4


def test_an_oversized_body_written_whole_before_reading_gets_its_413_not_a_reset(server) -> None:
    """Announced (refused from the headers: the connection then lingers, draining the body, and closes) or
    chunked (refused as it passes the limit: the connection stays open). Either way the client writes all of
    it before reading, and reads a 413, not a reset."""
    url, alone = server
    body = b'{"text": "' + b"x" * (4 * MAX_BODY) + b'"}'
    head = "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    announced = f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
    chunked = f"{head}Transfer-Encoding: chunked\r\n\r\n{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    with witness_streaming(url, alone):
        answers = []
        for request, read in ((announced, read_until_closed), (chunked, read_response)):
            with socket.create_connection(("127.0.0.1", port_of(url))) as conn:
                conn.sendall(request)  # all of it, before reading a byte of the answer
                answers.append(read(conn, 30))
    for answer in answers:
        status, _, rest = answer.partition(b"\r\n")
        assert status == b"HTTP/1.1 413 Request Entity Too Large", answer[:200]
        assert f"limit of {MAX_BODY} bytes".encode() in rest


def test_health_generate_takes_a_place_in_the_queue(random_pair: tuple[Path, Path]) -> None:
    """The probe counts against --max-queued-requests: idle, it takes the one place and runs a step; with the
    place held by a stream, it queues nothing and answers from that stream's steps."""
    # DDTree as in the module's server: its witness streams for seconds, an AR one can end within the checks
    with running_server(random_pair, "ddtree", 8, max_queued_requests=1) as url:
        alone = sse_events(httpx.post(url + "/generate", json=WITNESS, timeout=120))[-1]
        assert httpx.get(url + "/health_generate", timeout=60).status_code == 200
        with witness_streaming(url, alone), httpx.Client(base_url=url, timeout=60) as client:
            assert client.get("/health_generate").status_code == 200
            state = client.get("/server_info").json()["internal_states"][0]
            assert state["num_running_reqs"] + state["num_queue_reqs"] == 1  # the witness alone
            assert "queue is full (1 requests" in error_message(
                client.post("/generate", json=generate()), 503
            )


def open_idle(port: int, count: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]


def test_idle_connections_beyond_the_cap_close_the_oldest_idle_ones(
    random_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three times more idle connections than the server may hold: the oldest are closed (with a 408) as new
    ones arrive, and a real request is answered at once, not after the 60 s header deadline."""
    cap = 40
    monkeypatch.setattr(
        connection, "max_connections", lambda: cap
    )  # as if the descriptor limit left room for cap
    with running_server(random_pair, "ar", guard=HttpGuard(header_timeout_s=60)) as url:
        sockets = open_idle(port_of(url), 3 * cap)
        try:
            started = time.monotonic()
            served = httpx.post(url + "/generate", json=generate(), timeout=30)
            assert served.status_code == 200 and time.monotonic() - started < 10
            evicted = 0
            for conn in sockets[: 2 * cap]:
                conn.settimeout(10)
                evicted += conn.recv(200).startswith(b"HTTP/1.1 408")
            assert evicted == 2 * cap
        finally:
            for conn in sockets:
                conn.close()


@pytest.mark.slow
def test_a_1024_descriptor_limit_cannot_starve_the_server(random_pair: tuple[Path, Path]) -> None:
    """`specdeploy serve` under a real limit of 1024 descriptors, sent 1500 idle connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1600), hard))  # the client's own 1500 sockets
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
        [*argv, "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard)),
    )
    url = f"http://127.0.0.1:{port}"
    sockets: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, "the server exited"
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.2)
        sockets = open_idle(port, 1500)
        started = time.monotonic()
        served = httpx.post(url + "/generate", json=generate(), timeout=30)
        assert served.status_code == 200 and time.monotonic() - started < 10  # the header deadline is 20 s
    finally:
        for conn in sockets:
            conn.close()
        process.kill()
        process.wait()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
