import os
import sys
import time

import pytest
from deploy_helpers import GB, free_port, make_plan

from specdeploy.deploy.launchers import (
    DockerLauncher,
    ProcessLauncher,
    ReferenceLauncher,
    get_launcher,
    with_flag,
)
from specdeploy.errors import SpecdeployError
from specdeploy.plan.launch_plan import ModelRef


def test_with_flag_replaces_both_spellings_and_appends():
    assert with_flag(["a", "--port", "1", "b"], "--port", "2") == ["a", "b", "--port", "2"]
    assert with_flag(["a", "--port=1"], "--port", "2") == ["a", "--port", "2"]
    assert with_flag(["a"], "--port", "2") == ["a", "--port", "2"]


def test_docker_command(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", "/srv/hf/hub")
    monkeypatch.setattr("specdeploy.deploy.launchers.hub_cache_dir", lambda: tmp_path / "hub")
    local = ModelRef(
        role="drafter", path=str(tmp_path / "drafter"), revision=None, gated=False, disk_bytes=GB
    )
    plan = make_plan(models=[make_plan().models[0], local])
    command = DockerLauncher().command(plan, tmp_path / "20261202T130000Z-kimi-k2.6-dflash")
    image_at = command.index("lmsysorg/sglang:v0.5.23-cu130")
    options, server = command[:image_at], command[image_at + 1 :]
    assert options[:3] == ["docker", "run", "--detach"]
    assert options[options.index("--name") + 1] == "specdeploy-20261202T130000Z-kimi-k2.6-dflash"
    assert options[options.index("--gpus") + 1] == "all"
    assert options[options.index("--ipc") + 1] == "host"
    assert options[options.index("--publish") + 1] == "127.0.0.1:30000:30000"
    assert f"{tmp_path / 'hub'}:/root/.cache/huggingface/hub" in options
    assert f"{tmp_path / 'drafter'}:{tmp_path / 'drafter'}:ro" in options
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1" in options
    # The token is passed by name: its value never appears in a command line or a manifest.
    assert options[options.index("HF_TOKEN") - 1] == "--env"
    assert server[:3] == ["python", "-m", "sglang.launch_server"]
    assert server[server.index("--host") + 1] == "0.0.0.0"


def test_api_key_reaches_sglang_from_the_environment_only(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEPLOY_API_KEY", "k-very-secret")
    plan = make_plan().model_copy(update={"api_key_env": "SPECDEPLOY_API_KEY"})
    for command in (DockerLauncher().command(plan, tmp_path), ProcessLauncher().command(plan, tmp_path)):
        assert "k-very-secret" not in " ".join(command)
        at = command.index("bash")
        assert command[at + 1 : at + 3] == ["-c", 'exec "$@" --api-key "$SPECDEPLOY_API_KEY"']
        assert command[at + 4 : at + 7] == ["python", "-m", "sglang.launch_server"]
    docker = DockerLauncher().command(plan, tmp_path)
    assert docker[docker.index("SPECDEPLOY_API_KEY") - 1] == "--env"  # handed over by name


def test_docker_needs_an_image(tmp_path):
    plan = make_plan(profile="cpu", engine="reference")
    with pytest.raises(SpecdeployError, match="no container image"):
        DockerLauncher().command(plan, tmp_path)


def test_local_command_is_the_plan_argv(tmp_path):
    plan = make_plan()
    assert ProcessLauncher().command(plan, tmp_path) == plan.argv


def test_reference_command_runs_this_install(tmp_path):
    argv = [
        "specdeploy",
        "serve",
        "--target",
        "zoo:tiny",
        "--draft",
        "zoo:tiny-dflash",
        "--mode",
        "dflash",
        "--port",
        "8000",
    ]
    plan = make_plan(profile="cpu", engine="reference", models=[], argv=argv)
    assert ReferenceLauncher().command(plan, tmp_path) == [sys.executable, "-m", "specdeploy.cli", *argv[1:]]


def test_reference_launcher_refuses_sglang_plans(tmp_path):
    with pytest.raises(SpecdeployError, match="--launcher docker"):
        ReferenceLauncher().command(make_plan(), tmp_path)


def test_unknown_launcher():
    with pytest.raises(SpecdeployError, match="docker, local, reference"):
        get_launcher("k8s")


def test_missing_executable_is_explained(tmp_path):
    plan = make_plan(profile="cpu", models=[], argv=["no-such-engine-binary", "--port", "1"])
    with pytest.raises(SpecdeployError, match="not found on PATH"):
        ProcessLauncher().start(plan, tmp_path)


def test_stop_escalates_to_sigkill_and_covers_the_process_group(tmp_path):
    # A shell that ignores SIGTERM and has a child: stop() must not hang and must take both down.
    script = "trap '' TERM; sleep 60 & echo started; wait"
    plan = make_plan(profile="cpu", models=[], argv=["bash", "-c", script], port=free_port())
    launcher = ProcessLauncher()
    handle = launcher.start(plan, tmp_path)
    deadline = time.monotonic() + 10
    while launcher.tail(handle, 5) != ["started"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert launcher.is_running(handle)
    launcher.stop(handle, grace_s=0.5)
    assert not launcher.is_running(handle)
    # The killed `sleep` child lingers as a zombie until its new parent reaps it: allow a busy machine time.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(handle.process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    with pytest.raises(ProcessLookupError):
        os.killpg(handle.process.pid, 0)  # the `sleep` child is gone too
