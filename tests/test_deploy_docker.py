"""The docker launcher end to end against a fake docker CLI that runs the container's command locally."""

import hashlib
import json
import sys

import pytest
from deploy_helpers import fake_server_plan, free_port
from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.deploy.deployment import (
    GreedyReference,
    deploy_down,
    deploy_up,
    deployment_status,
    load_deployment,
)
from specdeploy.deploy.health import ServerStartError
from specdeploy.errors import SpecdeployError
from specdeploy.plan.engines import sglang_ddtree_build
from specdeploy.plan.image import dockerfile

runner = CliRunner()

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fake docker reads /proc")


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


def ddtree_fake_plan(port: int):
    """The fake server, started from the DDTree build's image (built here, never pulled)."""
    return fake_server_plan(port, "--tau", "5", engine="sglang").model_copy(
        update={"engine": sglang_ddtree_build()}
    )


def test_the_ddtree_image_is_built_once_per_host_and_the_manifest_records_it(fake_docker, tmp_path):
    runs = tmp_path / "runs"
    plan = ddtree_fake_plan(free_port())
    expected_id = "sha256:" + hashlib.sha256(dockerfile(plan.engine.build).encode()).hexdigest()
    for name in ("first", "second"):
        deployment = deploy_up(plan, "docker", runs / name, runs_root=runs, health_timeout_s=30)
        deploy_down(deployment, grace_s=5)
        engine = deployment.manifest.engine
        assert (engine.image, engine.image_id, engine.image_digest) == (plan.engine.image, expected_id, None)
    builds = [c for c in calls(fake_docker) if c[0] == "build"]
    assert builds == [["build", "--tag", plan.engine.image, "-"]]  # the second start reused the image
    assert not any(c[0] == "pull" for c in calls(fake_docker))  # built here: nothing to pull
    runs_of = [c for c in calls(fake_docker) if c[0] == "run"]
    assert len(runs_of) == 2 and all(plan.engine.image in c for c in runs_of)


def test_image_build_command_builds_once_and_names_the_tag(fake_docker, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no lock file here: the unlocked build
    first = runner.invoke(app, ["image", "build", "kimi-k2.6"])
    second = runner.invoke(app, ["image", "build", "kimi-k2.6"])
    tag = sglang_ddtree_build().image
    assert first.exit_code == 0 and f"{tag} built (image id sha256:" in first.output
    assert second.exit_code == 0 and f"{tag} already on this host" in second.output
    built = json.loads((fake_docker / "images.json").read_text())[tag]["dockerfile"]
    assert built == dockerfile(sglang_ddtree_build().build)  # exactly what `plan --format dockerfile` shows
    forced = runner.invoke(app, ["image", "build", "kimi-k2.6", "--force"])
    assert forced.exit_code == 0 and len([c for c in calls(fake_docker) if c[0] == "build"]) == 2


def test_greedy_answers_that_differ_from_ar_stop_the_server(fake_docker, tmp_path):
    runs = tmp_path / "runs"
    ar = deploy_up(
        fake_server_plan(free_port(), engine="sglang"),
        "docker",
        runs / "ar",
        runs_root=runs,
        health_timeout_s=30,
    )
    deploy_down(ar, grace_s=5)
    reference = GreedyReference(smoke=ar.manifest.smoke, source=str(ar.run_dir))
    same = deploy_up(
        ddtree_fake_plan(free_port()), "docker", runs / "same", runs_root=runs, greedy_reference=reference
    )
    deploy_down(same, grace_s=5)
    assert same.manifest.smoke.greedy.passed and same.manifest.smoke.greedy.unit == "characters"
    other = fake_server_plan(free_port(), "--word", "no", engine="sglang")
    with pytest.raises(
        SpecdeployError, match=r"greedy answers differ from the AR server's .*agrees on 1 of its first 48"
    ):
        deploy_up(
            other, "docker", runs / "other", runs_root=runs, health_timeout_s=30, greedy_reference=reference
        )
    assert json.loads((runs / "other" / "deployment.json").read_text())["state"] == "failed"
    assert ["rm", "specdeploy-other"] in calls(fake_docker)  # stopped, not measured
