"""The docker launcher end to end against a fake docker CLI that runs the container's command locally."""

import json
import os
import stat
import sys

import pytest
from deploy_helpers import FIXTURES, fake_server_plan, free_port

from specdeploy.deploy.deployment import deploy_down, deploy_up, deployment_status, load_deployment
from specdeploy.deploy.health import ServerStartError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fake docker reads /proc")


@pytest.fixture
def fake_docker(tmp_path, monkeypatch):
    bin_dir, state = tmp_path / "bin", tmp_path / "docker-state"
    bin_dir.mkdir()
    state.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FIXTURES / "fake_docker.py"}" "$@"\n')
    docker.chmod(docker.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DOCKER_STATE", str(state))
    return state


def calls(state):
    return [json.loads(line) for line in (state / "calls.jsonl").read_text().splitlines()]


def test_docker_up_status_down(fake_docker, tmp_path):
    plan = fake_server_plan(free_port(), "--tau", "5", engine="sglang")
    run_dir = tmp_path / "runs" / "docker-run"
    deployment = deploy_up(plan, "docker", run_dir, runs_root=tmp_path / "runs", health_timeout_s=30)
    try:
        handle = deployment.handle
        assert handle.container_name == "specdeploy-docker-run" and len(handle.container_id) == 64
        assert deployment.manifest.engine.image_digest == "lmsysorg/sglang@sha256:" + "ab" * 32
        assert [c.name for c in deployment.manifest.preflight] == ["docker", "port"]
        assert [c[0] for c in calls(fake_docker)][:3] == ["info", "pull", "run"]
        run_call = next(c for c in calls(fake_docker) if c[0] == "run")
        assert run_call[run_call.index("--gpus") + 1] == "all" and run_call[-2:] == ["--host", "0.0.0.0"]
        status = deployment_status(load_deployment(run_dir))
        assert status["alive"] and status["healthy"]
    finally:
        deploy_down(deployment, grace_s=5)
    assert not deployment_status(load_deployment(run_dir))["alive"]
    assert ["rm", "specdeploy-docker-run"] in calls(fake_docker)
    # The container is gone, its log stays with the run.
    assert "fake server: ready" in (run_dir / "server.log").read_text()


def test_docker_container_that_dies_shows_its_log(fake_docker, tmp_path):
    plan = fake_server_plan(free_port(), "--die-after", "0.2", engine="sglang")
    with pytest.raises(ServerStartError, match="CUDA out of memory"):
        deploy_up(plan, "docker", tmp_path / "run", runs_root=tmp_path / "runs", health_timeout_s=30)
    assert ["rm", "specdeploy-run"] in calls(fake_docker)
