import json

import pytest
from deploy_helpers import fake_server_plan, free_port, recorded_nvidia_smi
from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.deploy import commands as commands_module
from specdeploy.deploy import deployment as deployment_module
from specdeploy.deploy.deployment import deploy_up
from specdeploy.deploy.hardware import detect_with_nvidia_smi
from specdeploy.deploy.sglang_check import SglangVerdict
from specdeploy.errors import SpecdeployError

runner = CliRunner()


def test_dry_run_of_a_zoo_pair_launches_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    port = free_port()
    result = runner.invoke(app, ["up", "tiny-code", "--hardware", "cpu", "--dry-run", "--port", str(port)])
    assert result.exit_code == 0, result.output
    assert f"127.0.0.1:{port} is free" in result.output
    assert "-m specdeploy.cli serve --target zoo:tiny-code" in result.output
    assert f"--port {port}" in result.output and "nothing was downloaded or launched" in result.output
    assert not (tmp_path / "runs").exists()


class OfflineHub:
    def model_info(self, repo, revision=None):
        raise OSError("offline")


def sglang_says(accepted: bool, message: str):
    """`up`'s start-up check, answered without SGLang (test_plan_sglang_check.py runs the real one)."""
    return lambda recipe, profile: lambda plan: SglangVerdict(accepted=accepted, message=message)


def test_dry_run_on_the_wrong_machine_fails_with_the_table(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(commands_module, "startup_check", sglang_says(True, "max_running_requests 153"))
    monkeypatch.setattr(
        deployment_module, "detect_hardware", lambda: detect_with_nvidia_smi(recorded_nvidia_smi("h200-x1"))
    )
    monkeypatch.setattr("huggingface_hub.HfApi", OfflineHub)  # preflight imports it when it runs
    result = runner.invoke(
        app,
        ["up", "kimi-k2.6", "--hardware", "b200-x8", "--mode", "dflash", "--dry-run", "--launcher", "local"],
    )
    assert isinstance(result.exception, SpecdeployError)
    assert "check(s) failed (gpu count, architecture" in str(result.exception)
    assert "the plan (profile b200-x8) needs 8 GPUs, this machine has 1" in " ".join(result.output.split())
    assert "python -m sglang.launch_server" in result.output


def test_dry_run_stops_at_sglangs_refusal(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        deployment_module, "detect_hardware", lambda: detect_with_nvidia_smi(recorded_nvidia_smi("b200-x8"))
    )
    monkeypatch.setattr("huggingface_hub.HfApi", OfflineHub)
    refusal = "ValueError: DFLASH speculative decoding only supports pp_size == 1."
    monkeypatch.setattr(commands_module, "startup_check", sglang_says(False, refusal))
    result = runner.invoke(
        app,
        ["up", "kimi-k2.6", "--hardware", "b200-x8", "--mode", "dflash", "--dry-run", "--launcher", "local"],
    )
    assert isinstance(result.exception, SpecdeployError)
    assert "check(s) failed (sglang start-up," in str(result.exception)
    assert refusal in " ".join(result.output.split())


def test_a_refused_plan_launches_nothing(tmp_path):
    """deploy_up runs the start-up check in its preflight: a refusal stops it before weights or launch."""
    port = free_port()
    refusal = "ValueError: DFLASH with dp attention requires --enable-dp-lm-head"
    with pytest.raises(SpecdeployError, match="sglang start-up: .*requires --enable-dp-lm-head"):
        deploy_up(
            fake_server_plan(port, engine="sglang"),
            "local",
            tmp_path / "run",
            runs_root=tmp_path / "runs",
            startup_check=lambda plan: SglangVerdict(accepted=False, message=refusal),
        )
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()


def test_status_logs_down(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    deployment = deploy_up(fake_server_plan(free_port()), "local", health_timeout_s=30)
    try:
        status = runner.invoke(app, ["status", "--json"])
        assert status.exit_code == 0, status.output
        report = json.loads(status.output)
        assert (
            report["state"] == "running"
            and report["healthy"]
            and report["launcher"]["process"]["pid"] == deployment.handle.process.pid
        )

        logs = runner.invoke(app, ["logs", "-n", "3"])
        assert logs.exit_code == 0 and len(logs.output.splitlines()) == 3 and "POST /generate" in logs.output
    finally:
        down = runner.invoke(app, ["down", str(deployment.run_dir)])
    assert down.exit_code == 0 and "stopped" in down.output
    assert "already stopped" in runner.invoke(app, ["down"]).output
    assert "not running" in runner.invoke(app, ["status"]).output


def test_commands_without_a_deployment_say_what_to_do(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["status"])
    assert isinstance(result.exception, SpecdeployError) and "specdeploy up" in str(result.exception)
    with pytest.raises(SpecdeployError, match="holds no deployment"):
        raise runner.invoke(app, ["logs", str(tmp_path)]).exception
