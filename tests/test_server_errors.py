"""Bad requests get a 4xx with SGLang's OpenAI-style error body, never a 500, and the server keeps serving."""

from __future__ import annotations

import json
import random
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
    # without speculation, SGLang reports no speculative figures at all
    assert "spec_verify_ct" not in response.json()["meta_info"]
    info = client.get("/server_info").json()
    assert (
        info["speculative_algorithm"] is None and "avg_spec_accept_length" not in info["internal_states"][0]
    )


ODD_VALUES = [
    None,
    True,
    0,
    -1,
    2**70,
    1.5,
    float("nan"),
    float("inf"),
    "",
    "x",
    [],
    [1],
    [[1]],
    {},
    {"a": 1},
    ["a", 1],
]
FIELDS = {
    "/generate": ["text", "input_ids", "sampling_params", "stream", "rid"],
    "/v1/completions": [
        "model",
        "prompt",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "stream",
    ],
    "/v1/chat/completions": [
        "messages",
        "model",
        "max_tokens",
        "chat_template_kwargs",
        "stream",
        "seed",
        "stop",
    ],
}
SAMPLING_FIELDS = [
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "stop_token_ids",
    "sampling_seed",
]
VALID = {
    "/generate": {"text": "hi", "sampling_params": {"max_new_tokens": 2}},
    "/v1/completions": {"prompt": "hi", "max_tokens": 2},
    "/v1/chat/completions": {"messages": CHAT, "max_tokens": 2},
}


def test_randomly_corrupted_requests_never_get_a_5xx(client: httpx.Client) -> None:
    """A valid request with one to three fields set to odd values: either served (200) or refused (4xx)."""
    rng = random.Random(0)
    for _ in range(150):
        for path, fields in FIELDS.items():
            body = json.loads(json.dumps(VALID[path]))
            for field in rng.sample(fields, rng.randint(1, 3)):
                body[field] = rng.choice(ODD_VALUES)
            if path == "/generate" and isinstance(body.get("sampling_params"), dict):
                for field in rng.sample(SAMPLING_FIELDS, rng.randint(0, 2)):
                    body["sampling_params"][field] = rng.choice(ODD_VALUES)
            content = json.dumps(body).encode()
            response = client.post(path, content=content, headers={"content-type": "application/json"})
            assert response.status_code < 500, (path, body, response.text)
            if response.status_code != 200:
                assert response.json()["object"] == "error", response.text
    assert client.get("/health").status_code == 200
