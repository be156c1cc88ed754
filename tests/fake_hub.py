"""A small Hugging Face Hub and container registry on loopback, answering the API calls `specdeploy lock` makes.

FakeHub: GET /api/models/{repo}[/revision/{rev}]?blobs=True with `sha` and `siblings` (size, blobId, lfs).
FakeRegistry: HEAD /v2/{repo}/manifests/{tag}, which answers 401 with a Bearer challenge until the client
brings the token from /token (the Docker Hub flow).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class HubRepo:
    """One model repo: its branches (name -> commit) and each commit's files (path -> (size, LFS or not))."""

    commits: dict[str, dict[str, tuple[int, bool]]]
    branches: dict[str, str]
    gated: bool = False

    def siblings(self, commit: str) -> list[dict[str, Any]]:
        out = []
        for path, (size, lfs) in sorted(self.commits[commit].items()):
            sibling: dict[str, Any] = {"rfilename": path, "size": size, "blobId": sha1(f"{commit}/{path}")}
            if lfs:
                sibling["lfs"] = {"size": size, "sha256": sha256(f"{commit}/{path}"), "pointerSize": 134}
            out.append(sibling)
        return out


@dataclass
class FakeHub:
    repos: dict[str, HubRepo]
    requests: list[str] = field(default_factory=list)

    def handle(self, path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        self.requests.append(path)
        if not path.startswith("/api/models/"):
            return 404, {"error": "Not Found"}
        rest = unquote(path.removeprefix("/api/models/"))
        repo_id, _, revision = rest.partition("/revision/")
        repo = self.repos.get(repo_id)
        if repo is None:
            return 404, {"error": "Repository Not Found"}
        commit = repo.branches.get(revision or "main", revision)
        if commit not in repo.commits:
            return 404, {"error": f"Invalid rev id: {revision}"}
        body: dict[str, Any] = {
            "id": repo_id,
            "sha": commit,
            "private": False,
            "gated": "manual" if repo.gated else False,
        }
        body["siblings"] = (
            repo.siblings(commit)
            if [v.lower() for v in query.get("blobs", [])] == ["true"]
            else [{"rfilename": p} for p in repo.commits[commit]]
        )
        return 200, body


@dataclass
class FakeRegistry:
    manifests: dict[str, str]  # "repo:tag" -> digest
    token: str = "anonymous-pull-token"
    requests: list[str] = field(default_factory=list)
    base_url: str = ""


def _serve(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@contextmanager
def running_hub(hub: FakeHub) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlparse(self.path)
            status, body = hub.handle(url.path, parse_qs(url.query))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server, url = _serve(Handler)
    try:
        yield url
    finally:
        server.shutdown()


@contextmanager
def running_registry(registry: FakeRegistry) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def _reply(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:
            url = urlparse(self.path)
            registry.requests.append(f"GET {url.path}")
            if url.path == "/token":
                self._reply(
                    200, {"Content-Type": "application/json"}, json.dumps({"token": registry.token}).encode()
                )
            else:
                self._reply(404, {})

        def do_HEAD(self) -> None:
            registry.requests.append(f"HEAD {self.path}")
            repo, _, tag = self.path.removeprefix("/v2/").partition("/manifests/")
            if self.headers.get("Authorization") != f"Bearer {registry.token}":
                challenge = (
                    f'Bearer realm="{registry.base_url}/token",service="fake-registry",'
                    f'scope="repository:{repo}:pull"'
                )
                self._reply(401, {"WWW-Authenticate": challenge})
                return
            digest = registry.manifests.get(f"{repo}:{tag}")
            if digest is None or "image.index" not in self.headers.get("Accept", ""):
                self._reply(404, {})
                return
            self._reply(
                200,
                {"Docker-Content-Digest": digest, "Content-Type": "application/vnd.oci.image.index.v1+json"},
            )

        def log_message(self, *args: object) -> None:
            pass

    server, url = _serve(Handler)
    registry.base_url = url
    try:
        yield url
    finally:
        server.shutdown()
