"""The engine in a process of its own (`specdeploy serve`'s default): the same outputs as the engine thread,
cancellations reaching the child, and a child that dies or cannot start said so, never waited for."""

from __future__ import annotations

import asyncio
import pickle
import time
from pathlib import Path

import httpx
import pytest
from server_harness import APPS, running_server, sse_events

from specdeploy.engine.request import Step
from specdeploy.errors import SpecdeployError
from specdeploy.server.engine_process import EngineProcess, EngineRecipe, read_outcomes, wire_outcomes

PROMPTS = ["def add(a, b):", "The quick brown fox", "import numpy as np\n", "SELECT name FROM"]


def test_outcomes_cross_the_pipe_as_tuples_and_come_back_whole():
    """Steps (first token, speculative, finishing), a failure and an end, with and without adaptive figures."""
    outcomes = [
        (1, Step([5], 0, None), None),
        (2, Step([7, 8, 9], 17, None), (16, 2.75)),
        (2, Step([10], 17, "stop"), (0, 1.0)),
        (3, "SpecdeployError: the prompt is empty", None),
        (3, None, None),
    ]
    wired = pickle.loads(pickle.dumps(wire_outcomes(outcomes)))
    assert all(not isinstance(step, Step) for _, step, _ in wired)
    assert read_outcomes(wired) == outcomes


BODY = {"sampling_params": {"temperature": 0, "max_new_tokens": 20, "ignore_eos": True}}


async def generate_all(url: str) -> tuple[list[dict], dict, dict]:
    """The prompts at once, one more streamed, then /server_info."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        replies = await asyncio.gather(*(client.post("/generate", json={"text": p, **BODY}) for p in PROMPTS))
        streamed = await client.post("/generate", json={"text": PROMPTS[0], **BODY, "stream": True})
        info = (await client.get("/server_info")).json()
    return [r.json() for r in replies], sse_events(streamed)[-1], info


@pytest.mark.parametrize("mode, budget", [("ar", None), ("ddtree", 6)])
def test_the_engine_process_serves_what_the_engine_thread_serves(random_pair, mode, budget) -> None:
    results = {}
    for engine_process in (False, True):
        with running_server(
            random_pair, mode, budget, engine_process=engine_process, max_running_requests=4
        ) as url:
            results[engine_process] = asyncio.run(generate_all(url))
    (thread, thread_stream, _), (process, process_stream, info) = results[False], results[True]
    assert [r["output_ids"] for r in process] == [r["output_ids"] for r in thread]
    assert [r["text"] for r in process] == [r["text"] for r in thread]
    assert process_stream["text"] == thread_stream["text"] == process[0]["text"]
    loop = info["internal_states"][0]["engine_loop"]  # the child's own loop
    assert loop["steps"] >= max(r["meta_info"].get("spec_verify_ct", 19) for r in process)
    assert (
        loop["prefill_tokens"]
        == sum(r["meta_info"]["prompt_tokens"] for r in process) + process[0]["meta_info"]["prompt_tokens"]
    )


def test_an_adaptive_budget_in_the_engine_process_reports_its_policy(random_pair) -> None:
    with running_server(
        random_pair, "ddtree", 8, engine_process=True, policy_budgets=(0, 2, 8), max_running_requests=4
    ) as url:
        replies, _, info = asyncio.run(generate_all(url))
    assert info["engine"]["budget"] == "auto"
    described = info["internal_states"][0]["ddtree_budget_policy"]
    assert described["budgets"] == [0, 2, 8]
    assert sum(described["steps_by_budget"].values()) == info["internal_states"][0]["engine_loop"]["steps"]
    for reply in replies:
        assert set(reply["meta_info"]["ddtree_budgets"]) <= {0, 2, 8}
        assert len(reply["meta_info"]["ddtree_budgets"]) == reply["meta_info"]["spec_verify_ct"]


def test_a_client_that_leaves_frees_its_row_in_the_engine_process(random_pair) -> None:
    """The stream's cancellation crosses the pipe: the child stops the request, the next one runs whole."""
    long = {"sampling_params": {"temperature": 0, "max_new_tokens": 400, "ignore_eos": True}, "stream": True}
    with running_server(random_pair, "ar", engine_process=True, max_running_requests=1) as url:

        async def main() -> tuple[int, dict]:
            async with httpx.AsyncClient(base_url=url, timeout=120) as client:
                async with client.stream("POST", "/generate", json={"text": PROMPTS[0], **long}) as response:
                    async for _ in response.aiter_lines():
                        break  # one event, then the client goes
                for _ in range(200):
                    info = (await client.get("/server_info")).json()["internal_states"][0]
                    if info["num_running_reqs"] == 0 and info["num_queue_reqs"] == 0:
                        break
                    await asyncio.sleep(0.05)
                after = (await client.post("/generate", json={"text": PROMPTS[1], **BODY})).json()
                return info["engine_loop"]["steps"], after

        steps, after = asyncio.run(main())
    assert steps < 400  # it stopped early
    assert after["meta_info"]["completion_tokens"] == 20


def test_an_engine_process_that_dies_fails_its_requests_and_the_health_check(random_pair) -> None:
    long = {"sampling_params": {"temperature": 0, "max_new_tokens": 2000, "ignore_eos": True}}
    with running_server(random_pair, "ar", engine_process=True, max_running_requests=1) as url:

        async def main() -> tuple[int, str, int, int]:
            async with httpx.AsyncClient(base_url=url, timeout=120) as client:
                pending = asyncio.ensure_future(client.post("/generate", json={"text": PROMPTS[0], **long}))
                await asyncio.sleep(0.5)  # it runs
                service = APPS[url].state.service
                service.worker._process.kill()
                reply = await pending
                health = (await client.get("/health")).status_code
                refused = (await client.post("/generate", json={"text": PROMPTS[1], **BODY})).status_code
                asked = time.monotonic()
                info = await client.get("/server_info")  # its state will not come: it fails, without waiting
                assert info.status_code == 500 and time.monotonic() - asked < 10
                return reply.status_code, reply.text, health, refused

        status, text, health, refused = asyncio.run(main())
    assert status == 500 and "the engine process exited" in text
    assert health == 503 and refused == 503


def test_an_engine_process_that_cannot_start_says_why(tmp_path: Path) -> None:
    recipe = EngineRecipe(tmp_path / "missing", None, "ar", None, "cpu", "auto", None, None, 1)
    started = time.monotonic()
    with pytest.raises(SpecdeployError, match="could not start.*missing.*not a directory"):
        EngineProcess(recipe, max_queued=4)
    assert time.monotonic() - started < 60
