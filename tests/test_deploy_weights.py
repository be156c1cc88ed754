import hashlib
import json
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from deploy_helpers import GB

from specdeploy.deploy.weights import fetch_model, model_location, validate_checkpoint_dir
from specdeploy.errors import SpecdeployError
from specdeploy.plan.launch_plan import ModelRef


def ref(path, revision=None):
    return ModelRef(role="target", path=path, revision=revision, gated=False, disk_bytes=GB)


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


COMMIT = "c0ffee" + "0" * 34
WEIGHTS = bytes(range(256)) * 40
REPO_FILES = {"config.json": b'{"model_type": "qwen3"}', "model.safetensors": WEIGHTS}


class FakeHubFiles(BaseHTTPRequestHandler):
    """Just enough of the Hub for snapshot_download: revision info, file tree, resolve with Range support."""

    requests: list[tuple[str, str, str | None]] = []

    def do_HEAD(self):
        self._answer(send_body=False)

    def do_GET(self):
        self._answer(send_body=True)

    def _answer(self, send_body):
        self.requests.append((self.command, self.path, self.headers.get("Range")))
        status, headers, body = 200, {"Content-Type": "application/json"}, b""
        if "/tree/" in self.path:
            body = json.dumps(
                [
                    {"type": "file", "path": name, "size": len(data), "oid": _etag(data)}
                    for name, data in REPO_FILES.items()
                ]
            ).encode()
        elif self.path.startswith("/api/models/org/model/revision/"):
            body = json.dumps({"id": "org/model", "sha": COMMIT}).encode()
        else:
            body = REPO_FILES[self.path.rsplit("/", 1)[1]]
            headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{_etag(body)}"'}
            if self.headers.get("Range"):
                start = int(self.headers["Range"].removeprefix("bytes=").split("-")[0])
                status, body = 206, body[start:]
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, *args):
        pass


def _etag(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


@pytest.fixture
def fake_hub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHubFiles)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    FakeHubFiles.requests = []
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_download_at_pinned_revision_then_nothing_twice(fake_hub, tmp_path):
    directory = fetch_model(ref("org/model", revision="v1.0"), cache_dir=tmp_path, endpoint=fake_hub)

    assert directory == tmp_path / "models--org--model" / "snapshots" / COMMIT
    assert (directory / "model.safetensors").read_bytes() == WEIGHTS
    assert ("GET", "/api/models/org/model/revision/v1.0", None) in FakeHubFiles.requests
    assert ("GET", f"/org/model/resolve/{COMMIT}/model.safetensors", None) in FakeHubFiles.requests

    # A second `up` (say, after a crash) finds the finished files in the cache and fetches none again.
    FakeHubFiles.requests = []
    assert fetch_model(ref("org/model", revision="v1.0"), cache_dir=tmp_path, endpoint=fake_hub) == directory
    assert not [request for request in FakeHubFiles.requests if "/resolve/" in request[1]]


def test_zoo_names_resolve_through_the_zoo_registry(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    asked = []

    def resolve_model_path(name):
        asked.append(name)
        return tmp_path

    monkeypatch.setitem(
        sys.modules, "specdeploy.zoo.registry", types.SimpleNamespace(resolve_model_path=resolve_model_path)
    )
    assert fetch_model(ref("zoo:tiny-qwen3")) == tmp_path and asked == ["zoo:tiny-qwen3"]
