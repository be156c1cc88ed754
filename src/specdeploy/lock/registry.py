"""A container image tag to its manifest digest: the OCI distribution API, or a local docker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import TYPE_CHECKING

from specdeploy.errors import SpecdeployError

if TYPE_CHECKING:
    import httpx

# A registry (or mirror) to ask instead of the one the image name implies, as HF_ENDPOINT is for the Hub.
REGISTRY_URL_ENV = "SPECDEPLOY_REGISTRY_URL"
DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "https://registry-1.docker.io"
# Multi-architecture images answer with an index; asking for it gives the digest `docker pull` resolves.
MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def split_reference(reference: str) -> tuple[str, str, str]:
    """(registry host, repository, tag) of `repo:tag`, `host/repo:tag` or `user/repo:tag` (Docker Hub)."""
    name, _, tag = reference.rpartition(":")
    if not name or "/" in tag:
        raise SpecdeployError(f"image {reference!r} has no tag: specdeploy pins tagged images only")
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first, rest, tag
    return DOCKER_HUB, name if "/" in name else f"library/{name}", tag


def _bearer_challenge(header: str) -> dict[str, str]:
    """The parameters of `WWW-Authenticate: Bearer realm="...",service="...",scope="..."`."""
    return dict(re.findall(r'(\w+)="([^"]*)"', header))


def registry_digest(
    reference: str, registry_url: str | None = None, client: httpx.Client | None = None
) -> str:
    """HEAD the manifest of `reference`; on 401 fetch an anonymous pull token as the registry's challenge says."""
    # Imported here: httpx and huggingface_hub cost `specdeploy --help` a good part of a second.
    import httpx

    host, repository, tag = split_reference(reference)
    base = (
        registry_url
        or os.environ.get(REGISTRY_URL_ENV)
        or (DOCKER_HUB_API if host == DOCKER_HUB else f"https://{host}")
    )
    url = f"{base.rstrip('/')}/v2/{repository}/manifests/{tag}"
    headers = {"Accept": MANIFEST_TYPES}
    http = client or httpx.Client(timeout=30.0, follow_redirects=True)
    try:
        response = http.head(url, headers=headers)
        if response.status_code == 401 and "bearer" in response.headers.get("www-authenticate", "").lower():
            challenge = _bearer_challenge(response.headers["www-authenticate"])
            params = {k: v for k, v in challenge.items() if k in ("service", "scope")}
            token_response = http.get(challenge["realm"], params=params)
            token_response.raise_for_status()
            body = token_response.json()
            headers["Authorization"] = f"Bearer {body.get('token') or body.get('access_token')}"
            response = http.head(url, headers=headers)
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        raise SpecdeployError(
            f"resolving {reference} through {base}: {exc}; check the network, or use --image-digest-from docker"
        ) from None
    finally:
        if client is None:
            http.close()
    digest = response.headers.get("docker-content-digest", "")
    if response.status_code != 200 or not DIGEST.match(digest):
        raise SpecdeployError(
            f"resolving {reference} through {base}: the registry answered {response.status_code} "
            f"without a digest; check the tag (`docker manifest inspect {reference}`)"
        )
    return digest


def docker_digest(reference: str) -> str:
    """`docker pull`, then the repo digest docker recorded for the tag."""
    try:
        pulled = subprocess.run(["docker", "pull", reference], stdout=sys.stderr)
        inspect = subprocess.run(
            ["docker", "image", "inspect", "--format", "{{index .RepoDigests 0}}", reference],
            capture_output=True,
            text=True,
        )
    except FileNotFoundError:
        raise SpecdeployError("docker is not installed: use --image-digest-from registry") from None
    digest = inspect.stdout.strip().rpartition("@")[2]
    if pulled.returncode != 0 or inspect.returncode != 0 or not DIGEST.match(digest):
        raise SpecdeployError(f"docker could not pull or inspect {reference}: see its output above")
    return digest
