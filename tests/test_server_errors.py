"""Bad requests get a 4xx with SGLang's OpenAI-style error body, never a 500, and the server keeps serving."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from server_harness import running_server

CONTEXT = 2048  # the random pair's max_position_embeddings
OK_PARAMS = {"temperature": 0, "max_new_tokens": 2}
CHAT = [{"role": "user", "content": "hi"}]

# (method, path, JSON body or raw bytes, expected status)
CASES = [
    ("POST", "/generate", b"{not json", 400),
    ("POST", "/generate", b"", 400),
    ("POST", "/generate", [1, 2], 400),
    ("POST", "/generate", {"sampling_params": OK_PARAMS}, 400),  # neither text nor input_ids
    ("POST", "/generate", {"text": "a", "input_ids": [1], "sampling_params": OK_PARAMS}, 400),
    ("POST", "/generate", {"text": 5}, 400),
    ("POST", "/generate", {"text": ""}, 400),
    ("POST", "/generate", {"text": []}, 400),
    ("POST", "/generate", {"input_ids": []}, 400),
    ("POST", "/generate", {"input_ids": ["a", "b"]}, 400),
    ("POST", "/generate", {"input_ids": [1, 258]}, 400),  # vocabulary is 258 tokens
    ("POST", "/generate", {"input_ids": [-1]}, 400),
    ("POST", "/generate", {"input_ids": [1.5]}, 400),
    ("POST", "/generate", {"input_ids": [1] * CONTEXT}, 400),
    ("POST", "/generate", {"input_ids": [1] * 2000, "sampling_params": {"max_new_tokens": 100}}, 400),
    ("POST", "/generate", {"text": "a", "sampling_params": "hot"}, 400),
    ("POST", "/generate", {"text": "a", "sampling_params": {"max_new_tokens": -1}}, 400),
    ("POST", "/generate", {"text": "a", "sampling_params": {"max_new_tokens": 0}}, 400),
    ("POST", "/generate", {"text": "a", "sampling_params": {"max_new_tokens": "ten"}}, 400),
    ("POST", "/generate", {"text": "a", "sampling_params": {"max_new_tokens": 10**12}}, 400),
    ("POST", "/generate", {"text": "a", "sampling_params": {"temperature": -1}}, 400),
    ("POST", "/generate", {"text": "a", "sampling_params": {"temperature": "hot"}}, 400),
    ("POST", "/generate", {"text": "a", "sampling_params": {"top_p": 0}}, 400),
    ("POST", "/generate", {"text": "a", "sampling_params": {"top_k": 0}}, 400),
    ("POST", "/generate", {"text": "a", "sampling_params": {"stop": [1]}}, 400),
    ("POST", "/generate", {"text": "a", "sampling_params": {"stop_token_ids": [999]}}, 400),
    ("POST", "/generate", {"text": "a", "sampling_params": {"ignore_eos": "yes"}}, 400),
    ("POST", "/generate", {"text": "a", "sampling_params": {"sampling_seed": 2**64}}, 400),
    ("POST", "/generate", {"text": "a", "sampling_params": {"temperature": float("nan")}}, 400),
    ("POST", "/generate", {"text": "a", "sampling_params": {"max_new_tokens": 1e400}}, 400),
    ("POST", "/generate", {"text": "a", "sampling_params": {"frequency_penalty": 1.0}}, 400),
    ("POST", "/generate", {"text": "a", "sampling_params": {"warp_drive": 1}}, 400),
    ("POST", "/generate", {"text": ["a", "b"], "sampling_params": [OK_PARAMS]}, 400),
    ("POST", "/generate", {"text": "a", "stream": "yes"}, 400),
    ("POST", "/generate", {"text": "a", "return_logprob": True}, 400),
    ("POST", "/generate", {"text": ["a", "b"], "rid": "only-one"}, 400),
    ("GET", "/generate", None, 405),
    ("GET", "/no/such/route", None, 404),
    ("POST", "/v1/completions", b"{", 400),
    ("POST", "/v1/completions", {"max_tokens": 2}, 400),  # no prompt
    ("POST", "/v1/completions", {"prompt": ""}, 400),
    ("POST", "/v1/completions", {"prompt": 5}, 400),
    ("POST", "/v1/completions", {"prompt": "a", "model": "gpt-9"}, 404),
    ("POST", "/v1/completions", {"prompt": "a", "max_tokens": -5}, 400),
    ("POST", "/v1/completions", {"prompt": "a", "max_tokens": 10**9}, 400),
    ("POST", "/v1/completions", {"prompt": "a", "max_tokens": "many"}, 400),
    ("POST", "/v1/completions", {"prompt": "a", "temperature": "warm"}, 400),
    ("POST", "/v1/completions", {"prompt": "a", "n": 2}, 400),
    ("POST", "/v1/completions", {"prompt": "a", "seed": -(2**70)}, 400),
    ("POST", "/v1/completions", {"prompt": "a", "logprobs": 3}, 400),
    ("POST", "/v1/completions", {"prompt": "a", "stream_options": {"include_usage": "please"}}, 400),
    ("POST", "/v1/completions", {"prompt": "a" * (CONTEXT + 10)}, 400),
    ("POST", "/v1/completions", {"prompt": [1, 2, 999]}, 400),
    ("POST", "/v1/chat/completions", b"[", 400),
    ("POST", "/v1/chat/completions", {"messages": []}, 400),
    ("POST", "/v1/chat/completions", {"max_tokens": 2}, 400),  # no messages
    ("POST", "/v1/chat/completions", {"messages": "hi"}, 400),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "robot", "content": "hi"}]}, 400),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400),
    ("POST", "/v1/chat/completions", {"messages": [{"content": "hi"}]}, 400),
    ("POST", "/v1/chat/completions", {"messages": CHAT, "model": "gpt-9"}, 404),
    ("POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": -1}, 400),
    ("POST", "/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 10**9}, 400),
    ("POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": "x"}, 400),
    ("POST", "/v1/chat/completions", {"messages": CHAT, "top_p": 2}, 400),
    ("POST", "/v1/chat/completions", {"messages": CHAT, "tools": [{"type": "function"}]}, 400),
    ("POST", "/v1/chat/completions", {"messages": CHAT, "stream": True, "return_token_ids": True}, 400),
    ("POST", "/v1/chat/completions", {"messages": CHAT, "chat_template_kwargs": {"chat_template": "x"}}, 400),
    ("POST", "/v1/chat/completions", {"messages": CHAT, "chat_template_kwargs": "thinking"}, 400),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "a" * (CONTEXT + 10)}]}, 400),
]


@pytest.fixture(scope="module")
def client(random_pair: tuple[Path, Path]):
    with running_server(random_pair, "ar") as url, httpx.Client(base_url=url, timeout=60) as http:
        yield http


@pytest.mark.parametrize(("method", "path", "body", "status"), CASES)
def test_bad_request_gets_a_4xx_error_body(client: httpx.Client, method, path, body, status) -> None:
    # serialised here: NaN and Infinity are what Python's json (the server's parser) accepts, and httpx refuses
    content = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    response = client.request(method, path, content=content, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()
    assert error["object"] == "error" and error["code"] == status
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)


def test_server_still_serves_after_the_bad_requests(client: httpx.Client) -> None:
    response = client.post("/generate", json={"text": "hello", "sampling_params": OK_PARAMS})
    assert response.status_code == 200 and response.json()["meta_info"]["completion_tokens"] == 2
    assert client.get("/health").status_code == 200
