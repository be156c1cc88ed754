"""The reference server's routes over real HTTP: SGLang's shapes, streaming equals non-streaming, accept length."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest
from server_harness import running_server, sse_events

from specdeploy.engine.runtime import load_engine
from specdeploy.engine.sampling import SamplingParams

BUDGET = 8
PROMPT = "The quick brown fox"
# The pair's template, plus a switch that only renders when the request passes chat_template_kwargs.
THINKING_SWITCH = "{% if enable_thinking is defined and enable_thinking %}<think>{% endif %}"


@pytest.fixture(scope="module")
def pair(random_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The session pair with a chat template that reads a kwarg, so that passing kwargs through is visible."""
    target = tmp_path_factory.mktemp("thinking") / "target"
    shutil.copytree(random_pair[0], target)
    config_path = target / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] += THINKING_SWITCH
    config_path.write_text(json.dumps(config))
    return target, random_pair[1]


@pytest.fixture(scope="module")
def url(pair: tuple[Path, Path]):
    with running_server(pair, "ddtree", BUDGET) as base:
        yield base


@pytest.fixture(scope="module")
def client(url: str):
    with httpx.Client(base_url=url, timeout=120) as http:
        yield http


def generate(
    client: httpx.Client, max_new_tokens: int = 12, stream: bool = False, **sampling
) -> httpx.Response:
    params = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True, **sampling}
    return client.post("/generate", json={"text": PROMPT, "sampling_params": params, "stream": stream})


def test_health_and_readiness(client: httpx.Client) -> None:
    for path in ("/health", "/ready", "/health_generate"):
        assert client.get(path).status_code == 200, path


def test_models_and_model_info(client: httpx.Client, pair: tuple[Path, Path]) -> None:
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    card = models["data"][0]
    assert card["id"] == pair[0].name and card["max_model_len"] == 2048 and card["object"] == "model"
    assert client.get(f"/v1/models/{card['id']}").json()["id"] == card["id"]
    missing = client.get("/v1/models/nope")
    assert missing.status_code == 404 and missing.json()["object"] == "error"
    for path in ("/model_info", "/get_model_info"):
        info = client.get(path).json()
        assert info["model_path"] == str(pair[0]) and info["is_generation"] is True
        assert info["model_type"] == "qwen3"


def test_server_info_names_the_engine_and_tracks_accept_length(client: httpx.Client, pair) -> None:
    assert client.post("/flush_cache").status_code == 200
    info = client.get("/server_info").json()
    assert info["engine"] == {
        "name": "specdeploy-reference",
        "version": "0.1.0",
        "mode": "ddtree",
        "budget": BUDGET,
        "max_running_requests": 8,
        "block_size": 8,
        "device": "cpu",
    }
    assert info["speculative_algorithm"] == "DDTREE" and info["speculative_num_draft_tokens"] == BUDGET + 1
    assert "avg_spec_accept_length" not in info["internal_states"][0]  # nothing verified since the flush

    meta = generate(client).json()["meta_info"]
    avg = client.get("/server_info").json()["internal_states"][0]["avg_spec_accept_length"]
    # the prefill's token is no verify step: verify steps committed completion_tokens - 1 tokens
    assert avg == pytest.approx((meta["completion_tokens"] - 1) / meta["spec_verify_ct"])
    assert client.get("/get_server_info").json()["engine"]["name"] == "specdeploy-reference"


def test_generate_matches_the_decoder_and_reports_sglang_meta_info(client: httpx.Client, pair) -> None:
    body = generate(client, max_new_tokens=12).json()
    engine = load_engine(str(pair[0]), str(pair[1]), "ddtree", BUDGET)
    prompt_ids = engine.tokenizer.encode(PROMPT)
    expected = engine.decoder().generate(prompt_ids, SamplingParams(max_new_tokens=12, ignore_eos=True))
    assert body["output_ids"] == expected.token_ids
    assert body["text"] == engine.tokenizer.decode(expected.token_ids, skip_special_tokens=True)
    meta = body["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    assert meta["prompt_tokens"] == len(prompt_ids) and meta["completion_tokens"] == 12
    assert meta["cached_tokens"] == 0 and meta["e2e_latency"] > 0 and meta["id"]
    assert meta["spec_verify_ct"] == expected.num_steps
    assert meta["spec_accept_length"] == pytest.approx(12 / expected.num_steps)
    correct = sum(expected.accept_lengths) - expected.num_steps
    assert meta["spec_accept_rate"] == pytest.approx(correct / (expected.num_steps * BUDGET))


def test_generate_streams_cumulative_events_at_most_one_per_engine_step(client: httpx.Client) -> None:
    whole = generate(client, max_new_tokens=16).json()
    events = sse_events(generate(client, max_new_tokens=16, stream=True))
    # the prefill, then each verify step; steps queued while the server was behind share one event
    assert 2 <= len(events) <= 1 + whole["meta_info"]["spec_verify_ct"]
    for before, after in zip(events, events[1:], strict=False):
        assert after["output_ids"][: len(before["output_ids"])] == before["output_ids"]
        assert len(after["output_ids"]) > len(before["output_ids"])
        assert after["text"].startswith(before["text"])
    for event in events:
        assert event["meta_info"]["completion_tokens"] == len(event["output_ids"])
        assert event["meta_info"]["finish_reason"] is None or event is events[-1]
    last = events[-1]
    assert last["output_ids"] == whole["output_ids"] and last["text"] == whole["text"]
    assert last["meta_info"]["finish_reason"] == whole["meta_info"]["finish_reason"]
    assert last["meta_info"]["spec_verify_ct"] == whole["meta_info"]["spec_verify_ct"]


def test_generate_batches_text_and_input_ids(client: httpx.Client) -> None:
    single = generate(client, max_new_tokens=6).json()
    params = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
    body = {"text": [PROMPT, PROMPT + "!"], "sampling_params": params, "rid": ["first", "second"]}
    batch = client.post("/generate", json=body).json()
    assert [item["index"] for item in batch] == [0, 1]
    assert [item["meta_info"]["id"] for item in batch] == ["first", "second"]
    assert batch[0]["output_ids"] == single["output_ids"]
    by_ids = client.post(
        "/generate", json={"input_ids": list(PROMPT.encode()), "sampling_params": params}
    ).json()
    assert by_ids["output_ids"] == single["output_ids"]


def test_stop_string_ends_the_output_like_sglang(client: httpx.Client) -> None:
    ids = generate(client, max_new_tokens=24).json()["output_ids"]
    cut = next((k for k in range(1, len(ids)) if 33 <= ids[k] < 127 and ids[k] not in ids[:k]), None)
    if cut is None:
        pytest.skip("the greedy output has no fresh printable byte to stop on")
    stop = chr(ids[cut])
    for stream in (False, True):
        response = generate(client, max_new_tokens=24, stream=stream, stop=stop)
        body = sse_events(response)[-1] if stream else response.json()
        assert body["output_ids"] == ids[: cut + 1]
        assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
        assert stop not in body["text"]


def test_completions_stream_equals_non_stream(client: httpx.Client, pair) -> None:
    request = {
        "prompt": PROMPT,
        "max_tokens": 10,
        "temperature": 0,
        "ignore_eos": True,
        "model": str(pair[0]),
    }
    whole = client.post("/v1/completions", json=request).json()
    assert whole["object"] == "text_completion" and whole["model"] == str(pair[0])  # echoed, as SGLang does
    assert whole["usage"]["completion_tokens"] == 10
    assert whole["usage"]["total_tokens"] == whole["usage"]["prompt_tokens"] + 10
    assert whole["choices"][0]["finish_reason"] == "length"
    native = generate(client, max_new_tokens=10).json()
    assert whole["choices"][0]["text"] == native["text"]

    options = {"include_usage": True, "continuous_usage_stats": True}
    events = sse_events(
        client.post("/v1/completions", json={**request, "stream": True, "stream_options": options})
    )
    *chunks, usage = events
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 10
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"

    # return_token_ids: each chunk carries the tokens its engine steps committed (one step unless the server
    # fell behind)
    events = sse_events(
        client.post("/v1/completions", json={**request, "stream": True, "return_token_ids": True})
    )
    assert 2 <= len(events) <= 1 + native["meta_info"]["spec_verify_ct"]
    assert all(e["choices"][0]["token_ids"] for e in events)
    assert [t for e in events for t in e["choices"][0]["token_ids"]] == native["output_ids"]


def test_chat_stream_equals_non_stream_and_passes_template_kwargs(client: httpx.Client) -> None:
    request = {
        "model": "target",
        "messages": [{"role": "user", "content": "Hello there"}],
        "max_tokens": 10,
        "temperature": 0,
        "ignore_eos": True,
    }
    whole = client.post("/v1/chat/completions", json=request).json()
    assert whole["object"] == "chat.completion"
    message = whole["choices"][0]["message"]
    assert message["role"] == "assistant" and whole["usage"]["completion_tokens"] == 10

    events = sse_events(
        client.post(
            "/v1/chat/completions",
            json={**request, "stream": True, "stream_options": {"include_usage": True}},
        )
    )
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    finish = events[-2]["choices"][0]  # SGLang closes with a chunk of its own: empty delta, finish reason
    assert finish["delta"] == {} and finish["finish_reason"] == "length"
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-2])
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert text == message["content"]
    assert events[-1]["usage"] == whole["usage"]

    thinking = client.post(
        "/v1/chat/completions", json={**request, "chat_template_kwargs": {"enable_thinking": True}}
    )
    assert thinking.json()["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"] + len("<think>")


def test_metrics_count_requests_and_tokens(client: httpx.Client) -> None:
    def sample(text: str, name: str) -> float:
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))

    before = client.get("/metrics").text
    generate(client, max_new_tokens=5)
    after = client.get("/metrics").text
    assert sample(after, "sglang:num_requests_total") == sample(before, "sglang:num_requests_total") + 1
    assert (
        sample(after, "sglang:generation_tokens_total")
        == sample(before, "sglang:generation_tokens_total") + 5
    )
    assert sample(after, "sglang:num_queue_reqs") == 0
    assert "specdeploy:step_accept_length_bucket" in after and "sglang:spec_accept_length" in after


def test_seeded_sampling_is_reproducible_streamed_or_not(client: httpx.Client) -> None:
    sampled = {"temperature": 0.9, "top_p": 0.95, "top_k": 50, "sampling_seed": 1234}
    first = generate(client, max_new_tokens=12, **sampled).json()["output_ids"]
    again = generate(client, max_new_tokens=12, **sampled).json()["output_ids"]
    streamed = sse_events(generate(client, max_new_tokens=12, stream=True, **sampled))[-1]["output_ids"]
    assert first == again == streamed
    other_seeds = [
        generate(client, max_new_tokens=12, **{**sampled, "sampling_seed": s}).json() for s in (1, 2)
    ]
    assert any(o["output_ids"] != first for o in other_seeds)  # the seed reaches the sampler
