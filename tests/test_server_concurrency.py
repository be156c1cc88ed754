"""Many clients at once: FIFO service, no request dropped or mixed up, disconnects free the worker, queue limit."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest
from server_harness import running_server, sse_events

PROMPTS = [f"Prompt number {i}: tell me about {topic}" for i, topic in enumerate("abcdefgh")]
MAX_NEW = 6
ROUTES = ("generate", "generate-stream", "completions", "chat")


def request_for(route: str, prompt: str, stream: bool) -> tuple[str, dict]:
    sampling = {"temperature": 0, "ignore_eos": True}
    if route.startswith("generate"):
        body = {"text": prompt, "sampling_params": {**sampling, "max_new_tokens": MAX_NEW}, "stream": stream}
        return "/generate", body
    openai = {**sampling, "max_tokens": MAX_NEW, "stream": stream}
    if route == "completions":
        return "/v1/completions", {"prompt": prompt, **openai}
    return "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}], **openai}


def output_of(route: str, response: httpx.Response, stream: bool) -> str:
    """The completion text a response carries, however it was delivered."""
    assert response.status_code == 200, response.text
    if not stream:
        body = response.json()
        if route.startswith("generate"):
            return body["text"]
        choice = body["choices"][0]
        return choice["text"] if route == "completions" else choice["message"]["content"]
    events = sse_events(response)
    if route.startswith("generate"):
        return events[-1]["text"]
    if route == "completions":
        return "".join(e["choices"][0]["text"] for e in events if e["choices"])
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])


async def fire(url: str, jobs: list[tuple[str, str, bool]]) -> list[str]:
    limits = httpx.Limits(max_connections=len(jobs))
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:

        async def one(route: str, prompt: str, stream: bool) -> str:
            path, body = request_for(route, prompt, stream)
            return output_of(route, await client.post(path, json=body), stream)

        return await asyncio.gather(*(one(*job) for job in jobs))


@pytest.mark.parametrize(("mode", "budget"), [("ar", None), ("ddtree", 8)])
def test_64_concurrent_requests_equal_their_single_outputs(
    random_pair: tuple[Path, Path], mode, budget
) -> None:
    with running_server(random_pair, mode, budget) as url:
        # one at a time first: the reference output of each prompt on the native and the chat route
        singles = {}
        with httpx.Client(base_url=url, timeout=120) as client:
            for prompt in PROMPTS:
                for route in ("generate", "chat"):
                    path, body = request_for(route, prompt, False)
                    singles[route, prompt] = output_of(route, client.post(path, json=body), False)
        jobs = [
            (ROUTES[i % 4], PROMPTS[i % 8], i % 3 == 0 or ROUTES[i % 4] == "generate-stream")
            for i in range(64)
        ]
        outputs = asyncio.run(fire(url, jobs))
    for (route, prompt, stream), output in zip(jobs, outputs, strict=True):
        expected = singles["chat" if route == "chat" else "generate", prompt]
        assert output == expected, (route, prompt, stream)


def server_state(client: httpx.Client) -> dict:
    return client.get("/server_info").json()["internal_states"][0]


def metric(client: httpx.Client, name: str) -> float:
    text = client.get("/metrics").text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


def test_client_disconnect_mid_stream_frees_the_worker(random_pair: tuple[Path, Path]) -> None:
    long = {"text": "hi", "sampling_params": {"temperature": 0, "max_new_tokens": 2000, "ignore_eos": True}}
    with running_server(random_pair, "ar") as url, httpx.Client(base_url=url, timeout=120) as client:
        with client.stream("POST", "/generate", json={**long, "stream": True}) as response:
            lines = response.iter_lines()
            first = json.loads(next(line for line in lines if line.startswith("data: "))[len("data: ") :])
            assert first["meta_info"]["completion_tokens"] < 100  # streaming long before the end
        # the connection is closed now: the worker must stop that generation at its next step
        deadline = time.monotonic() + 30
        while server_state(client)["num_running_reqs"] != 0:
            assert time.monotonic() < deadline, "the disconnected request kept the worker busy"
            time.sleep(0.1)
        assert metric(client, "sglang:num_aborted_requests_total") == 1
        assert metric(client, "sglang:generation_tokens_total") < 2000
        after = client.post(
            "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}}
        )
        assert after.status_code == 200 and after.json()["meta_info"]["completion_tokens"] == 3


def test_non_streaming_disconnect_frees_the_worker(random_pair: tuple[Path, Path]) -> None:
    long = {"text": "hi", "sampling_params": {"temperature": 0, "max_new_tokens": 2000, "ignore_eos": True}}
    with running_server(random_pair, "ar") as url, httpx.Client(base_url=url, timeout=120) as client:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(url + "/generate", json=long, timeout=1.0)  # gives up, closing the connection
        deadline = time.monotonic() + 30
        while server_state(client)["num_running_reqs"] != 0:
            assert time.monotonic() < deadline, "the abandoned request kept the worker busy"
            time.sleep(0.1)
        assert metric(client, "sglang:num_aborted_requests_total") == 1


def test_full_queue_answers_503_and_admitted_requests_complete(random_pair: tuple[Path, Path]) -> None:
    body = {"text": "hi", "sampling_params": {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}}

    async def burst(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            return await asyncio.gather(*(client.post("/generate", json=body) for _ in range(6)))

    with running_server(random_pair, "ar", max_queued_requests=2) as url:
        responses = asyncio.run(burst(url))
        too_big = httpx.post(url + "/generate", json={**body, "text": ["a", "b", "c"]}, timeout=60)
    assert too_big.status_code == 413 and "can never fit" in too_big.json()["message"]
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(503) >= 1 and set(statuses) <= {200, 503}
    for response in responses:
        if response.status_code == 503:
            error = response.json()
            assert error["object"] == "error" and "queue is full" in error["message"]
        else:
            assert response.json()["meta_info"]["completion_tokens"] == 40


def test_an_adaptive_budget_is_reported_per_request_and_in_server_info(
    random_pair: tuple[Path, Path],
) -> None:
    from specdeploy.engine.budget import BudgetPolicy

    policy = BudgetPolicy([0, 2, 4, 8])  # the server's batch engine measures its step cost at start-up
    with running_server(random_pair, "ddtree", 8, budget_policy=policy, max_running_requests=4) as url:

        async def main() -> list[dict]:
            async with httpx.AsyncClient(base_url=url, timeout=300) as client:
                body = {"sampling_params": {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}}
                replies = await asyncio.gather(
                    *(client.post("/generate", json={"text": p, **body}) for p in PROMPTS)
                )
                streamed = await client.post("/generate", json={"text": PROMPTS[0], **body, "stream": True})
                info = (await client.get("/server_info")).json()
                await client.post("/flush_cache")
                flushed = (await client.get("/server_info")).json()
            return [r.json() for r in replies] + [sse_events(streamed)[-1]], info, flushed

        replies, info, flushed = asyncio.run(main())  # the last reply: a stream's last event
    for reply in replies:
        meta = reply["meta_info"]
        assert len(meta["ddtree_budgets"]) == meta["spec_verify_ct"]
        assert set(meta["ddtree_budgets"]) <= {0, 2, 4, 8}
        assert meta["spec_num_proposed_drafts"] == sum(meta["ddtree_budgets"])
        # an AR step predicts exactly the one token it commits; a tree at most 1 + its nodes
        assert 1 <= meta["ddtree_predicted_accept_length"] <= 1 + max(meta["ddtree_budgets"])
        assert meta["ddtree_accept_length"] == pytest.approx(
            (meta["completion_tokens"] - 1) / meta["spec_verify_ct"], abs=1e-4
        )  # the first token comes from the prefill, every other one from a verify step
    assert info["engine"]["budget"] == "auto" and info["max_running_requests"] == 4
    described = info["internal_states"][0]["ddtree_budget_policy"]
    measured = described["step_ms_by_budget_window_and_rows"]
    by_rows = [rows for by_window in measured.values() for rows in by_window.values()]
    assert set(measured) == {"0", "2", "4", "8"} and all(
        len(by_window) >= 2 for by_window in measured.values()
    )
    assert all(set(rows) == {"1", "2", "4"} for rows in by_rows)
    assert all(ms > 0 for rows in by_rows for ms in rows.values())
    assert described["predicted_accept_length_by_budget"]["0"] == 1.0
    assert set(described["tree_predicted_accept_length_by_budget"]) == {"2", "4", "8"}
    assert set(described["realised_accept_length_by_budget"]) <= {"0", "2", "4", "8"}
    assert sum(described["steps_by_budget"].values()) >= max(
        r["meta_info"]["spec_verify_ct"] for r in replies
    )
    # where the iterations went: every prompt token was prefilled, every verify step was a step
    loop = info["internal_states"][0]["engine_loop"]
    assert loop["prefill_tokens"] == sum(r["meta_info"]["prompt_tokens"] for r in replies)
    assert loop["steps"] == sum(described["steps_by_budget"].values()) <= loop["iterations"]
    # each request's verify steps are the steps it ran in: summed over requests, the rows of every step
    rows = sum(r["meta_info"]["spec_verify_ct"] for r in replies)
    assert loop["mean_running_requests"] == pytest.approx(rows / loop["steps"], abs=0.005)
    assert 1 < loop["mean_running_requests"] <= 4  # the burst ran together, at most --max-running-requests
    assert 0 < loop["busy_share"] <= 1
    parts = loop["ms_per_iteration"]
    assert set(parts) == {
        "prefill", "step", "policy", "policy_windows", "policy_overlapped", "rest_of_iteration",
        "server_between_iterations",
    }  # fmt: skip
    assert (
        parts["step"] > 0 and parts["prefill"] > 0 and parts["policy"] > 0 and parts["policy_overlapped"] > 0
    )
    assert 0 < parts["policy_windows"] < parts["policy"]  # a part of the choice's time
    assert flushed["internal_states"][0]["engine_loop"]["iterations"] == 0  # /flush_cache restarts them
    # where a first token's wait went: every request was timed in the server, none since the flush
    latency = info["internal_states"][0]["server_latency"]
    assert latency["requests"] == len(replies)
    assert 0 < latency["ttft_ms_mean"] <= latency["e2e_ms_mean"]
    assert 0 < loop["ms_admitted_to_first_token"] <= latency["ttft_ms_mean"]  # the engine's part of it
    # the handoff to the event loop comes after the engine made the token
    handoff = latency["first_token_handoff_ms_mean"]
    assert 0 <= handoff <= latency["ttft_ms_mean"] - loop["ms_admitted_to_first_token"]
    assert latency["event_loop_lag_ms_max"] >= latency["event_loop_lag_ms_mean"] >= 0
    flushed_latency = flushed["internal_states"][0]["server_latency"]
    assert {
        k: flushed_latency[k]
        for k in ("requests", "ttft_ms_mean", "e2e_ms_mean", "first_token_handoff_ms_mean")
    } == {
        "requests": 0,
        "ttft_ms_mean": None,
        "e2e_ms_mean": None,
        "first_token_handoff_ms_mean": None,
    }


def test_serve_refuses_bad_batching_settings(random_pair: tuple[Path, Path]) -> None:
    from typer.testing import CliRunner

    from specdeploy.cli import app

    target, draft = (str(p) for p in random_pair)
    runner = CliRunner()
    cases = [
        (["--mode", "dflash", "--draft", draft, "--budget", "auto"], "--budget auto picks DDTree budgets"),
        (["--mode", "ddtree", "--draft", draft, "--budget", "many"], "--budget must be a number"),
        (["--max-running-requests", "0"], "--max-running-requests must be at least 1"),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["serve", "--target", target, "--port", "1", *args])
        assert result.exit_code != 0 and message in str(result.exception), (args, result.output)
