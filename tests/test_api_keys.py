"""API keys end to end: 401s, every client sending the key, and the key in no file a run writes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from deploy_helpers import fake_server_plan, free_port
from server_harness import running_server

from specdeploy.bench.client import HTTP, BenchClient
from specdeploy.bench.load import run_load
from specdeploy.deploy.deployment import deploy_down, deploy_up
from specdeploy.deploy.health import wait_for_health
from specdeploy.deploy.launchers import ProcessLauncher
from specdeploy.plan import make_plan
from specdeploy.plan.render import RENDERERS, render_plan
from specdeploy.server.guard import HttpGuard
from specdeploy.server.launch import is_loopback

KEY = "sk-test-7f3a9c1e55d04b2b"
OK = {"text": "hi", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}


def files_holding(root: Path, secret: str) -> list[Path]:
    """Every file under `root` whose bytes contain `secret`."""
    return [p for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


@pytest.fixture(scope="module")
def keyed_url(random_pair: tuple[Path, Path]):
    with running_server(random_pair, "dflash", guard=HttpGuard(api_key=KEY)) as url:
        yield url


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [("POST", "/generate", OK), ("POST", "/v1/completions", {"prompt": "hi"}), ("GET", "/v1/models", None)]
    + [("GET", "/server_info", None), ("POST", "/flush_cache", None)],
)
def test_protected_routes_answer_401_without_or_with_a_wrong_key(keyed_url, method, path, body) -> None:
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": KEY},
        {"Authorization": f"Basic {KEY}"},
    ):
        response = httpx.request(method, keyed_url + path, json=body, headers=headers, timeout=30)
        assert response.status_code == 401, (headers, response.text)
        error = response.json()
        assert (
            error["object"] == "error"
            and error["code"] == 401
            and "Authorization: Bearer" in error["message"]
        )
        assert response.headers["www-authenticate"] == "Bearer"
    good = httpx.request(
        method, keyed_url + path, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60
    )
    assert good.status_code == 200, good.text


def test_health_readiness_and_metrics_stay_open(keyed_url) -> None:
    for path in ("/health", "/ready", "/metrics"):
        assert httpx.get(keyed_url + path, timeout=30).status_code == 200, path


def test_health_generate_runs_the_engine_so_it_needs_the_key(keyed_url) -> None:
    assert httpx.get(keyed_url + "/health_generate", timeout=30).status_code == 401
    keyed = httpx.get(keyed_url + "/health_generate", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert keyed.status_code == 200


def test_load_and_the_bench_client_send_the_key_from_the_environment(keyed_url, monkeypatch) -> None:
    monkeypatch.delenv("SPECDEPLOY_API_KEY", raising=False)
    refused = asyncio.run(run_load(keyed_url, 2, 2, 2, "hello"))
    assert refused.errors == 2 and refused.first_errors[0].startswith(f"{HTTP}: 401")

    async def server_info() -> object:
        async with BenchClient(keyed_url, "generate") as client:
            return await client.get_json("/server_info")

    assert asyncio.run(server_info()) is None
    monkeypatch.setenv("SPECDEPLOY_API_KEY", KEY)
    served = asyncio.run(run_load(keyed_url, 2, 2, 2, "hello"))
    assert served.errors == 0 and served.requests == 2
    info = asyncio.run(server_info())
    assert isinstance(info, dict) and info["engine"]["name"] == "specdeploy-reference"


def serve_stderr(host: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: serve warns, then fails to bind; nothing is sent.
    command = [sys.executable, "-m", "specdeploy.cli", "serve", "--target", "/nonexistent", "--host", host]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


def test_serve_warns_when_it_listens_beyond_loopback_without_a_key(monkeypatch) -> None:
    import os

    base = {k: v for k, v in os.environ.items() if k != "SPECDEPLOY_API_KEY"}
    unkeyed = serve_stderr("192.0.2.1", base)
    assert unkeyed.returncode == 2 and "warning: serving on 192.0.2.1 without an API key" in unkeyed.stderr
    keyed = serve_stderr("192.0.2.1", {**base, "SPECDEPLOY_API_KEY": KEY})
    assert keyed.returncode == 2 and "warning" not in keyed.stderr
    assert all(is_loopback(host) for host in ("127.0.0.1", "127.3.0.1", "::1", "localhost"))
    assert not any(is_loopback(host) for host in ("0.0.0.0", "::", "10.0.0.5", "example.org"))


@pytest.mark.parametrize("fmt", list(RENDERERS))
def test_plans_name_the_variable_never_the_key(fmt: str, monkeypatch) -> None:
    monkeypatch.setenv("SPECDEPLOY_API_KEY", KEY)
    plan = make_plan("kimi-k2.6", "rtx-pro-6000-x8", "ddtree", budget=32, api_key=True)
    text = render_plan(plan, fmt)
    assert KEY not in text
    if fmt in ("text", "sh", "compose", "k8s"):
        assert "SPECDEPLOY_API_KEY" in text


def test_renderings_pass_the_key_from_the_environment() -> None:
    plan = make_plan("kimi-k2.6", "rtx-pro-6000-x8", "dflash", api_key=True)
    (service,) = yaml.safe_load(render_plan(plan, "compose"))["services"].values()
    # $$ in compose is a literal $: the container's shell expands it, compose does not paste the key in
    assert service["command"][2].endswith('--api-key "$$SPECDEPLOY_API_KEY"')
    assert service["environment"]["SPECDEPLOY_API_KEY"].startswith("${SPECDEPLOY_API_KEY:?")
    lws, _ = yaml.safe_load_all(render_plan(plan, "k8s"))
    (container,) = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"]
    assert {
        "name": "SPECDEPLOY_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "specdeploy-api-key", "key": "key"}},
    } in container["env"]
    script = render_plan(plan, "sh")
    assert ': "${SPECDEPLOY_API_KEY:?' in script and "-e SPECDEPLOY_API_KEY" in script
    assert make_plan("kimi-k2.6", "rtx-pro-6000-x8", "dflash").api_key_env is None


def keyed_sglang_plan(port: int):
    return fake_server_plan(port, "--tau", "4", engine="sglang").model_copy(
        update={"api_key_env": "SPECDEPLOY_API_KEY"}
    )


def test_up_with_docker_sends_the_key_and_writes_it_nowhere(fake_docker, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SPECDEPLOY_API_KEY", KEY)
    runs = tmp_path / "runs"
    deployment = deploy_up(
        keyed_sglang_plan(free_port()), "docker", runs / "keyed", runs_root=runs, health_timeout_s=30
    )
    try:
        # the server enforced the key (the smoke test and /server_info got through only by sending it)
        assert deployment.manifest.smoke.tau == pytest.approx(4.0, rel=0.3)
        assert deployment.manifest.server_info["api_key"] == "***"
        assert any(c.name == "api key" and c.status.value == "ok" for c in deployment.manifest.preflight)
        assert httpx.post(deployment.url + "/generate", json=OK, timeout=10).status_code == 401
    finally:
        deploy_down(deployment, grace_s=5)
    log = (runs / "keyed" / "server.log").read_text()
    assert "'api_key': '***'" in log  # the server logged its key, and the copy kept here is redacted
    assert files_holding(tmp_path / "runs", KEY) == []


def test_up_refuses_a_keyed_plan_without_the_key(fake_docker, tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("SPECDEPLOY_API_KEY", raising=False)
    from specdeploy.errors import SpecdeployError

    with pytest.raises(SpecdeployError, match=r"api key: .*SPECDEPLOY_API_KEY is not set"):
        deploy_up(
            keyed_sglang_plan(free_port()), "docker", tmp_path / "r", runs_root=tmp_path, health_timeout_s=30
        )


def test_the_local_launcher_log_is_redacted_as_it_is_written(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SPECDEPLOY_API_KEY", KEY)
    plan = keyed_sglang_plan(free_port())
    launcher = ProcessLauncher()
    handle = launcher.start(plan, tmp_path)
    try:
        wait_for_health(handle.url, lambda: launcher.is_running(handle), lambda n: [], timeout_s=30)
        deadline = time.monotonic() + 10
        while "server_args" not in Path(handle.log_path).read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        launcher.stop(handle, grace_s=5)
    assert "'api_key': '***'" in Path(handle.log_path).read_text()
    assert not launcher.is_running(handle)
    assert files_holding(tmp_path, KEY) == []


def test_a_keyed_campaign_measures_through_the_key_and_records_no_key(
    random_pair, tmp_path, monkeypatch
) -> None:
    """The reference engine as the server: health waits, smoke tests (with the greedy check), bench."""
    from rich.console import Console

    from specdeploy.campaign.runner import DeployControl, run_campaign
    from specdeploy.campaign.spec import load_campaign

    monkeypatch.setenv("SPECDEPLOY_API_KEY", KEY)
    target, draft = random_pair
    recipe = (Path(__file__).parent / "test_campaign_reference_e2e.py").read_text()
    recipe = recipe.split('RECIPE = """', 1)[1].split('"""', 1)[0].format(target=target, draft=draft)
    (tmp_path / "pair.toml").write_text(recipe)
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"prompt": "Hello there"}) + "\n")
    (tmp_path / "campaign.toml").write_text(
        'name = "keyed"\nrecipe = "pair.toml"\nhardware = "cpu"\nlauncher = "reference"\nmodes = ["ar", "ddtree"]\n'
        f'ddtree_budgets = [4]\nconcurrency = [1]\ndatasets = ["custom"]\ndata_dir = "prompts.jsonl"\n'
        f"max_new_tokens = 4\nport = {free_port()}\nhealth_timeout_s = 180\napi_key = true\n\n[bench]\nwarmup = 0\n"
    )
    spec = load_campaign(tmp_path / "campaign.toml")
    out = tmp_path / "campaign"
    control = DeployControl(
        "reference", spec.health_timeout_s, spec.smoke, out / "servers", Console(stderr=True)
    )
    state = run_campaign(spec, out, control, log=lambda _: None)
    assert [s.status for s in state.servers.values()] == ["complete", "complete"], state
    manifest = json.loads((out / "servers/tp1-ddtree-b4/start-1/manifest.json").read_text())
    assert manifest["plan"]["api_key_env"] == "SPECDEPLOY_API_KEY"
    greedy = manifest["smoke"]["greedy"]
    assert greedy["reference"].endswith("tp1-ar/start-1") and greedy["unit"] == "tokens"
    # the reference engine is lossless: every smoke answer equals AR's in full, far past the required prefix
    assert greedy["required"] == [16, 16, 16] and all(a >= 16 for a in greedy["agreed"])
    summary = json.loads((out / "runs/tp1-ddtree-b4/custom/summary.json").read_text())
    assert all(cell["metrics"]["n_errors"] == 0 for cell in summary["cells"].values())
    assert files_holding(out, KEY) == []
