import pytest
from deploy_helpers import GB

from specdeploy.deploy.weights import fetch_model, model_location, validate_checkpoint_dir
from specdeploy.errors import SpecdeployError
from specdeploy.plan.launch_plan import ModelRef


def ref(path):
    return ModelRef(role="target", path=path, revision=None, gated=False, disk_bytes=GB)


def test_model_location(tmp_path):
    assert model_location("z-lab/Kimi-K2.6-DFlash") == "hub"
    assert model_location("zoo:tiny-qwen3") == "zoo"
    assert model_location("/models/kimi") == "local"
    assert model_location(str(tmp_path)) == "local"


def test_local_checkpoint_is_used_as_is(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model-00001-of-00001.safetensors").write_bytes(b"")
    assert fetch_model(ref(str(tmp_path))) == tmp_path


@pytest.mark.parametrize(
    ("files", "missing"),
    [(["config.json"], "safetensors"), (["model.safetensors"], "config.json"), ([], "config.json and no")],
)
def test_incomplete_local_checkpoint(tmp_path, files, missing):
    for name in files:
        (tmp_path / name).write_text("{}")
    with pytest.raises(SpecdeployError, match=missing):
        validate_checkpoint_dir(tmp_path)


def test_missing_local_directory(tmp_path):
    with pytest.raises(SpecdeployError, match="does not exist"):
        fetch_model(ref(str(tmp_path / "nope")))


def test_unreachable_hub_download_is_explained(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    with pytest.raises(SpecdeployError, match="downloading org/model@main failed"):
        fetch_model(ref("org/model"), cache_dir=tmp_path, endpoint="http://127.0.0.1:9")
