"""The loopback server against the reference server: the same event shapes, per-request logs, real prompt counts.

The shapes are taken from what `specdeploy serve` answers on the same requests (a tiny random pair), not
from the loopback server's own code; prompt counts from the byte tokenizer loaded through transformers.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_harness import running_server, sse_events
from transformers import PreTrainedTokenizerFast

from specdeploy.bench.fakeserver import FakeServer, ServerThread, StreamPlan
from specdeploy.zoo.byte_tokenizer import write_byte_tokenizer

TOKENS = 16
PLAN = StreamPlan(ttft_s=0.001, gap_s=0.001, tokens_per_chunk=2, output_tokens=TOKENS)
MODEL = "target"  # what the reference server calls the random pair's target


def shape(value: Any) -> Any:
    """A JSON value's structure: keys and value types, recursively (list items merged)."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return ["list", *sorted({json.dumps(shape(item), sort_keys=True) for item in value})]
    return type(value).__name__


def shapes(events: list[Any]) -> tuple[set[str], str]:
    """The set of shapes before the last event, and the last: the real and the fake stream differ in length."""
    as_text = [json.dumps(shape(e), sort_keys=True) for e in events]
    return set(as_text[:-1]), as_text[-1]


REQUESTS = {
    "native": ("/generate", {"text": "The quick brown fox", "sampling_params": {"max_new_tokens": TOKENS}}),
    "completions": ("/v1/completions", {"prompt": "The quick brown fox", "max_tokens": TOKENS}),
    "chat": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": TOKENS},
    ),
}
STREAMS = {
    "plain": {"stream": True},
    "usage at the end": {"stream": True, "stream_options": {"include_usage": True}},
    "usage per chunk": {
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    },
    "not streamed": {"stream": False},
}


@pytest.fixture(scope="module")
def servers(random_pair: tuple[Path, Path]) -> Iterator[tuple[str, str]]:
    fake = ServerThread(FakeServer(PLAN, model=MODEL)).start()
    try:
        with running_server(random_pair, "dflash") as real:
            yield real, fake.url
    finally:
        fake.stop()


def answer(url: str, route: str, body: dict[str, Any]) -> list[Any]:
    """The events of a streamed answer, or the one body of a whole answer."""
    ignore_eos = {"ignore_eos": True} if route != "/generate" else {}
    if route == "/generate":
        body = {**body, "sampling_params": {**body["sampling_params"], "ignore_eos": True}}
    response = httpx.post(url + route, json={"model": MODEL, **body, **ignore_eos}, timeout=120)
    assert response.status_code == 200, response.text
    return sse_events(response) if body.get("stream") else [response.json()]


@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("route", REQUESTS)
def test_events_have_the_reference_servers_shapes(servers: tuple[str, str], route: str, stream: str) -> None:
    real_url, fake_url = servers
    path, body = REQUESTS[route]
    body = {**body, **STREAMS[stream]}
    real, fake = answer(real_url, path, body), answer(fake_url, path, body)
    for _ in range(10):
        # a stream read while the server was behind folds its steps into fewer events, down to one content
        # event (with usage in every chunk: that one and the usage chunk), which leaves fewer kinds of event
        # before the last than the fake's to compare: ask again
        if not body.get("stream") or (len(real) > 1 and len(shapes(real)[0]) >= len(shapes(fake)[0])):
            break
        real = answer(real_url, path, body)
    assert shapes(fake) == shapes(real)
    for key in ("object", "model"):  # the values every OpenAI event must carry, as the real server sets them
        assert [e.get(key) for e in fake] == [real[0].get(key)] * len(fake)
    if "id" in real[0]:
        prefix = real[0]["id"][: real[0]["id"].index("-") + 1]
        assert all(e["id"].startswith(prefix) and e["id"] == fake[0]["id"] for e in fake)


@pytest.fixture(scope="module")
def fake() -> Iterator[ServerThread]:
    thread = ServerThread(FakeServer(PLAN, model=MODEL)).start()
    yield thread
    thread.stop()


def test_requests_are_logged_one_by_one_even_with_the_same_prompt(fake: ServerThread) -> None:
    body = {"text": "same prompt", "sampling_params": {"max_new_tokens": TOKENS}, "stream": True}
    before = set(fake.server.truth)
    answers: list[list[Any]] = []

    def send() -> None:
        answers.append(sse_events(httpx.post(fake.url + "/generate", json=body, timeout=30)))

    threads = [threading.Thread(target=send) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    send()  # and once more after them, on a fresh connection
    logged = {rid: fake.server.truth[rid] for rid in set(fake.server.truth) - before}
    assert len(logged) == 4
    assert {events[-1]["meta_info"]["id"] for events in answers} == set(logged)
    for events in answers:
        truth = logged[events[-1]["meta_info"]["id"]]
        assert truth.tokens == [e["meta_info"]["completion_tokens"] for e in events]
        assert len(truth.writes_ns) == len(events) and truth.writes_ns == sorted(truth.writes_ns)


def test_a_request_id_is_used_once(fake: ServerThread) -> None:
    body = {"prompt": "x", "max_tokens": 2, "stream": True, "rid": "only-once"}
    first = httpx.post(fake.url + "/v1/completions", json=body, timeout=30)
    again = httpx.post(fake.url + "/v1/completions", json=body, timeout=30)
    assert first.status_code == 200 and sse_events(first)[0]["id"] == "cmpl-only-once"
    assert again.status_code == 400 and "was already used" in again.json()["message"]


@pytest.fixture(scope="module")
def byte_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> PreTrainedTokenizerFast:
    directory = tmp_path_factory.mktemp("byte-tokenizer")
    write_byte_tokenizer(directory)
    return PreTrainedTokenizerFast.from_pretrained(str(directory))


TEXTS = ["What is 2 + 2?", "héllo wörld ✓", "line one\nline two"]


@pytest.mark.parametrize("text", TEXTS)
def test_prompt_token_counts_are_the_byte_tokenizers(
    fake: ServerThread, byte_tokenizer: PreTrainedTokenizerFast, text: str
) -> None:
    expected = len(byte_tokenizer.encode(text, add_special_tokens=False))
    native = httpx.post(fake.url + "/generate", json={"text": text, "sampling_params": {"max_new_tokens": 2}})
    assert native.json()["meta_info"]["prompt_tokens"] == expected
    ids = byte_tokenizer.encode(text, add_special_tokens=False)
    by_ids = httpx.post(fake.url + "/v1/completions", json={"prompt": ids, "max_tokens": 2})
    assert by_ids.json()["usage"]["prompt_tokens"] == expected
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    rendered = byte_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    chat = httpx.post(fake.url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
    assert chat.json()["usage"]["prompt_tokens"] == len(
        byte_tokenizer.encode(rendered, add_special_tokens=False)
    )


def test_output_text_is_one_byte_token_per_token(
    fake: ServerThread, byte_tokenizer: PreTrainedTokenizerFast
) -> None:
    body = {"text": "x", "sampling_params": {"max_new_tokens": TOKENS}}
    out = httpx.post(fake.url + "/generate", json=body).json()
    assert byte_tokenizer.encode(out["text"], add_special_tokens=False) == out["output_ids"]
    assert len(out["output_ids"]) == out["meta_info"]["completion_tokens"] == TOKENS


@pytest.mark.parametrize(
    ("route", "body", "message"),
    [
        ("/generate", {"sampling_params": {}}, "exactly one of text or input_ids"),
        ("/generate", {"text": ["a", "b"]}, "batches are not served"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens must be a positive integer"),
        ("/v1/chat/completions", {"messages": []}, "messages must be a non-empty list"),
    ],
)
def test_bad_requests_get_sglangs_error_body(
    fake: ServerThread, route: str, body: dict, message: str
) -> None:
    response = httpx.post(fake.url + route, json=body)
    assert response.status_code == 400
    error = response.json()
    assert error["object"] == "error" and error["code"] == 400 and message in error["message"]
