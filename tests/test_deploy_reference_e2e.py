"""`up` -> /generate -> `down` through the reference launcher, on a tiny random pair (CPU)."""

import httpx
import pytest
from deploy_helpers import GB, free_port, make_plan

from specdeploy.deploy.deployment import deploy_down, deploy_up, deployment_status, load_deployment
from specdeploy.plan.launch_plan import ModelRef

pytestmark = pytest.mark.slow  # writes a checkpoint pair and starts a server: about 30 s on 2 cores


def test_reference_up_generate_down(tmp_path):
    from specdeploy.zoo.random_pair import write_random_pair

    target, draft = write_random_pair(tmp_path / "pair")
    port = free_port()
    argv = ["specdeploy", "serve", "--target", str(target), "--draft", str(draft), "--mode", "dflash"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    models = [
        ModelRef(role="target", path=str(target), revision=None, gated=False, disk_bytes=GB),
        ModelRef(role="drafter", path=str(draft), revision=None, gated=False, disk_bytes=GB),
    ]
    plan = make_plan(profile="cpu", engine="reference", models=models, argv=argv, port=port)

    deployment = deploy_up(
        plan, "reference", tmp_path / "run", runs_root=tmp_path / "runs", health_timeout_s=120
    )
    try:
        assert deployment_status(load_deployment(deployment.run_dir))["healthy"]
        smoke = deployment.manifest.smoke
        assert all(result.completion_tokens > 0 for result in smoke.results)
        # An untrained drafter accepts next to nothing: exactly what the smoke test must flag.
        assert smoke.tau is not None and smoke.tau < 1.3
        assert any("does not match the target" in warning for warning in smoke.warnings)
        payload = {"text": "hello", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
        body = httpx.post(f"{deployment.url}/generate", json=payload, timeout=60).json()
        assert body["meta_info"]["completion_tokens"] == 4
        assert deployment.manifest.weights == {str(target): str(target), str(draft): str(draft)}
    finally:
        deploy_down(deployment, grace_s=10)
    assert not deployment_status(load_deployment(deployment.run_dir))["alive"]
