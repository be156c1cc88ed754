"""Renderings of a plan: JSON schema, a shell script bash accepts, compose and LeaderWorkerSet YAML."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from specdeploy.errors import SpecdeployError
from specdeploy.plan import make_plan
from specdeploy.plan.render import render_plan

JSON_KEYS = {"schema", "recipe", "hardware", "mode", "engine", "argv", "env", "memory", "warnings"}


@pytest.fixture(scope="module")
def kimi():
    return make_plan("kimi-k2.6", "rtx-pro-6000-x8", "dflash")


@pytest.fixture(scope="module")
def kimi_ddtree():
    return make_plan("kimi-k2.6", "rtx-pro-6000-x8", "ddtree", budget=32)


def test_json_has_the_documented_shape(kimi):
    doc = json.loads(render_plan(kimi, "json"))
    assert JSON_KEYS <= doc.keys() and doc["schema"] == 2
    assert {"name", "version", "image", "source"} <= doc["engine"].keys()
    assert doc["argv"][:3] == ["python", "-m", "sglang.launch_server"]
    assert doc["env"] == {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}
    assert doc["models"][0]["revision"] is None  # unpinned is carried as null, not hidden


def test_text_explains_what_why_memory_and_warnings(kimi):
    text = render_plan(kimi, "text")
    for heading in ("What will run", "Models", "Command", "Why these settings", "Memory", "Warnings", "Next"):
        assert f"\n{heading}" in text
    assert "NOT PINNED" in text and "--attention-backend triton: sm_120" in text
    assert "python -m sglang.launch_server" in text and f"{kimi.memory.kv_tokens_fit:,} tokens" in text


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(
    "case",
    [
        ("kimi-k2.6", "rtx-pro-6000-x8", "ddtree", 1),
        ("kimi-k2.6", "b200-x8", "dflash", 2),
        ("tiny-code", "cpu", "ar", 1),
    ],
)
def test_shell_script_is_valid_bash(case):
    recipe, hardware, mode, nnodes = case
    script = render_plan(make_plan(recipe, hardware, mode, nnodes=nnodes), "sh")
    assert script.startswith("#!/usr/bin/env bash\n")
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_shell_script_runs_the_pinned_image_with_the_env(kimi_ddtree):
    script = render_plan(kimi_ddtree, "sh")
    assert "export SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1" in script
    assert kimi_ddtree.engine.image in script and "--ipc=host" in script
    assert "FROM lmsysorg/sglang:v0.5.23-cu130" in script and "--host 0.0.0.0" in script
    # built once per host: the build runs only when the content-addressed tag is missing
    assert f"docker image inspect {kimi_ddtree.engine.image} >/dev/null 2>&1 || docker build" in script
    assert ': "${HF_TOKEN:?' in script


def test_reference_plan_renders_the_plain_command():
    script = render_plan(make_plan("tiny-code", "cpu", "dflash"), "sh")
    assert "docker" not in script and "exec specdeploy serve --target zoo:tiny-code" in script


def test_compose_file(kimi):
    doc = yaml.safe_load(render_plan(kimi, "compose"))
    (service,) = doc["services"].values()
    assert service["image"] == "lmsysorg/sglang:v0.5.23-cu130" and service["ipc"] == "host"
    # no API key: published on the host's loopback only, like `up`
    assert service["shm_size"] and service["ports"] == ["127.0.0.1:30000:30000"]
    assert service["volumes"][0].endswith(":/root/.cache/huggingface")
    assert service["environment"]["HF_TOKEN"].startswith("${HF_TOKEN:?")
    assert "/health" in service["healthcheck"]["test"][1]
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device == {"driver": "nvidia", "count": 8, "capabilities": ["gpu"]}
    assert "--host 0.0.0.0" in service["command"][2]


def test_compose_refuses_multi_node_and_the_reference_engine():
    with pytest.raises(SpecdeployError, match="k8s"):
        render_plan(make_plan("kimi-k2.6", "b200-x8", "dflash", nnodes=2), "compose")
    with pytest.raises(SpecdeployError, match="without a container"):
        render_plan(make_plan("tiny-code", "cpu", "ar"), "compose")


def test_k8s_leader_worker_set_for_two_nodes():
    lws, service = yaml.safe_load_all(
        render_plan(make_plan("kimi-k2.6", "b200-x8", "dflash", nnodes=2), "k8s")
    )
    assert lws["kind"] == "LeaderWorkerSet" and service["kind"] == "Service"
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2
    leader = template["leaderTemplate"]["spec"]["containers"][0]
    worker = template["workerTemplate"]["spec"]["containers"][0]
    for container in (leader, worker):
        command = container["command"][2]
        assert "--nnodes 2" in command and "--node-rank $LWS_WORKER_INDEX" in command
        assert "--dist-init-addr $LWS_LEADER_ADDRESS:20000" in command
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert leader["readinessProbe"]["httpGet"]["path"] == "/health" and "readinessProbe" not in worker
    assert service["spec"]["selector"]["role"] == "leader"
    for pod in (template["leaderTemplate"], template["workerTemplate"]):
        assert pod["spec"]["hostNetwork"] is True
        container = pod["spec"]["containers"][0]
        assert container["resources"]["limits"]["rdma/rdma_shared_device_a"] == 1
        assert "IPC_LOCK" in container["securityContext"]["capabilities"]["add"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["NCCL_SOCKET_IFNAME"] == "eth0" and env["NCCL_IB_HCA"] == "mlx5"


def test_k8s_carries_the_plans_warnings_as_comments():
    plan = make_plan("kimi-k2.6", "b200-x8", "dflash", nnodes=2)
    text = render_plan(plan, "k8s")
    comments = [line for line in text.splitlines() if line.startswith("# warning: ")]
    assert [line.removeprefix("# warning: ") for line in comments] == plan.warnings
    assert any("fits on one b200-x8 node" in line for line in comments)


@pytest.mark.parametrize("nnodes", [1, 2])
def test_shell_opens_no_public_port_without_a_key(nnodes):
    open_script = render_plan(make_plan("kimi-k2.6", "b200-x8", "dflash", nnodes=nnodes), "sh")
    keyed = render_plan(make_plan("kimi-k2.6", "b200-x8", "dflash", nnodes=nnodes, api_key=True), "sh")
    if nnodes == 1:
        assert "-p 127.0.0.1:30000:30000" in open_script and "-p 30000:30000" in keyed
    else:  # host network: the server's own address is what the world sees
        assert "--host 127.0.0.1" in open_script and "--host 0.0.0.0" in keyed
    assert '--api-key "$SPECDEPLOY_API_KEY"' in keyed and "--api-key" not in open_script


def test_k8s_single_node_has_no_rank_flags(kimi):
    lws, _ = yaml.safe_load_all(render_plan(kimi, "k8s"))
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 1 and "leaderTemplate" not in template
    assert "--node-rank" not in template["workerTemplate"]["spec"]["containers"][0]["command"][2]


def test_unknown_format(kimi):
    with pytest.raises(SpecdeployError, match="unknown format 'yaml'"):
        render_plan(kimi, "yaml")
