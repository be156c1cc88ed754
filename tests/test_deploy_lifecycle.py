import json
import socket
from pathlib import Path

import pytest
from deploy_helpers import fake_server_plan, free_port

from specdeploy.deploy.deployment import (
    deploy_down,
    deploy_up,
    deployment_status,
    load_deployment,
    preview_up,
)
from specdeploy.deploy.health import ServerStartError
from specdeploy.deploy.manifest import find_run_dir, read_state
from specdeploy.errors import SpecdeployError


def test_up_status_down(tmp_path):
    plan = fake_server_plan(free_port(), "--healthy-after", "0.3", "--tau", "3")
    runs = tmp_path / "runs"
    deployment = deploy_up(plan, "local", runs_root=runs, health_timeout_s=30)
    try:
        assert deployment.run_dir.parent == runs.resolve() and deployment.run_dir.name.endswith(
            "-kimi-k2.6-dflash"
        )
        assert Path(deployment.handle.log_path).is_absolute()
        assert find_run_dir(None, runs) == deployment.run_dir.resolve()
        manifest = json.loads((deployment.run_dir / "manifest.json").read_text())
        assert manifest["schema"] == 1
        assert (
            manifest["plan"]["argv"] == plan.argv
            and manifest["launcher"]["process"]["pid"] == deployment.handle.process.pid
        )
        assert manifest["smoke"]["tau"] == pytest.approx(3.0, rel=0.1)
        assert manifest["server_info"]["version"] == "fake-0.1"
        assert manifest["python"] and manifest["torch"] and manifest["specdeploy_version"]
        assert [check["name"] for check in manifest["preflight"]] == ["port"]

        assert load_deployment(deployment.run_dir).manifest == deployment.manifest
        with pytest.raises(SpecdeployError, match="not stopped"):
            deploy_up(plan, "local", deployment.run_dir, runs_root=runs)
        status = deployment_status(load_deployment(deployment.run_dir))
        assert status["state"] == "running" and status["alive"] and status["healthy"]
    finally:
        stopped = deploy_down(deployment, grace_s=5)
    assert stopped.record.state == "stopped"
    status = deployment_status(load_deployment(deployment.run_dir))
    assert status["state"] == "stopped" and not status["alive"] and not status["healthy"]
    assert "fake server: ready" in (deployment.run_dir / "server.log").read_text()


def test_failed_start_is_recorded_and_cleaned_up(tmp_path):
    plan = fake_server_plan(free_port(), "--die-after", "0.2")
    run_dir = tmp_path / "run"
    with pytest.raises(ServerStartError, match="CUDA out of memory"):
        deploy_up(plan, "local", run_dir, runs_root=tmp_path / "runs", health_timeout_s=30)
    record = read_state(run_dir)
    assert record.state == "failed" and "CUDA out of memory" in record.error
    assert not (run_dir / "manifest.json").exists()


def test_an_interrupt_while_the_manifest_is_written_stops_the_healthy_server(tmp_path, monkeypatch):
    """A signal after the server became healthy (a `kill` while versions are collected) must not leave it
    running: CI once saw a campaign's SIGTERM land exactly there."""
    import specdeploy.deploy.deployment as deployment_module

    def interrupted() -> dict:
        raise KeyboardInterrupt

    monkeypatch.setattr(deployment_module, "runtime_versions", interrupted)
    plan = fake_server_plan(free_port(), "--healthy-after", "0.1")
    run_dir = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        deploy_up(plan, "local", run_dir, runs_root=tmp_path / "runs", health_timeout_s=30)
    record = read_state(run_dir)
    assert record.state == "failed"
    status = deployment_status(load_deployment(run_dir))
    assert not status["alive"] and not status["healthy"]


def test_preflight_failure_launches_nothing(tmp_path):
    port = free_port()
    plan = fake_server_plan(port)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        with pytest.raises(SpecdeployError, match="preflight failed.*port"):
            deploy_up(plan, "local", tmp_path / "run", runs_root=tmp_path / "runs")
    assert not (tmp_path / "run").exists()


def test_preview_lists_checks_downloads_and_command(tmp_path):
    plan = fake_server_plan(free_port())
    preview = preview_up(plan, "local", tmp_path / "run")
    assert preview.command == plan.argv and preview.downloads == []
    assert [check.name for check in preview.preflight.checks] == ["port"]
    assert not (tmp_path / "run").exists()
