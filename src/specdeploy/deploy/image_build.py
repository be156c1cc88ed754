"""Build the images a plan builds rather than pulls (the DDTree build), once per host: the tag is the content."""

from __future__ import annotations

import subprocess

from specdeploy.errors import SpecdeployError
from specdeploy.plan.image import dockerfile
from specdeploy.plan.launch_plan import EngineSpec

STDERR_FD = 2  # the process's own stderr, whatever sys.stderr has been replaced by


def image_present(tag: str) -> bool:
    """Whether this host's docker already has `tag` (built by an earlier `up` or `image build`)."""
    try:
        result = subprocess.run(
            ["docker", "image", "inspect", "--format", "{{.Id}}", tag],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except FileNotFoundError as exc:
        raise SpecdeployError("docker is not installed: install Docker to build the DDTree image") from exc
    return result.returncode == 0


def build_image(engine: EngineSpec, force: bool = False) -> bool:
    """Build `engine.image` from its Dockerfile unless this host has it; True when a build ran.

    The tag hashes the Dockerfile (base digest, commit, pins), so an existing tag is exactly this build.
    """
    if engine.build is None or engine.image is None:
        raise SpecdeployError(f"{engine.name} {engine.version} is pulled, not built: nothing to build")
    if not force and image_present(engine.image):
        return False
    # The Dockerfile on stdin is the whole context: the build needs no files from this machine.
    result = subprocess.run(
        ["docker", "build", "--tag", engine.image, "-"],
        input=dockerfile(engine.build),
        text=True,
        stdout=STDERR_FD,  # the build log, in the open (it takes minutes), apart from the command's result
    )
    if result.returncode != 0:
        raise SpecdeployError(
            f"`docker build` of {engine.image} failed (its log is above): check the network to the Git host and "
            "the package index, or the base image tag"
        )
    return True
