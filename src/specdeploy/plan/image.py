"""The Dockerfile of an image specdeploy builds (the DDTree build), and its content-addressed tag."""

from __future__ import annotations

import hashlib
import shlex

from specdeploy.plan.launch_plan import ImageBuild

CONSTRAINTS_FILE = "constraints.txt"
TAG_HEX = 16  # of the Dockerfile's sha256: the same inputs always give the same tag, other inputs another


def checkout_steps(build: ImageBuild) -> list[str]:
    """Shell lines that put the PR's source at its commit into `build.source_dir`."""
    src = build.source_dir
    return [
        f"git clone --filter=blob:none {build.repo} {src}",
        f"git -C {src} fetch origin pull/{build.pull_request}/head",
        f"git -C {src} checkout --detach {build.commit}",
    ]


def dockerfile(build: ImageBuild) -> str:
    """A Dockerfile that checks the PR out at its commit and installs it under the locked pins."""
    src = build.source_dir
    constraints = f"{src}/{CONSTRAINTS_FILE}"
    steps = checkout_steps(build)
    if build.constraints:
        # The pins are written by the build itself: the Dockerfile is the whole build context.
        steps.append(
            f"printf '%s\\n' {' '.join(shlex.quote(pin) for pin in build.constraints)} > {constraints}"
        )
        steps.append(f"pip install --no-cache-dir --constraint {constraints} {src}/python")
    else:
        steps.append(f"pip install --no-cache-dir {src}/python")
    lines = [
        f"# SGLang PR #{build.pull_request} at {build.commit}, built by specdeploy on {build.base}",
        f"FROM {build.base}",
        'SHELL ["/bin/bash", "-o", "pipefail", "-c"]',
        "RUN " + " \\\n    && ".join(steps),
        f'LABEL org.opencontainers.image.source="{build.repo}" \\',
        f'      org.opencontainers.image.revision="{build.commit}" \\',
        f'      org.opencontainers.image.base.name="{build.base}"',
    ]
    return "\n".join(lines) + "\n"


def image_tag(build: ImageBuild, repository: str) -> str:
    """repository:<hash of the Dockerfile>: a changed pin, base or commit gives a new tag, never a stale hit."""
    digest = hashlib.sha256(dockerfile(build).encode()).hexdigest()
    return f"{repository}:{digest[:TAG_HEX]}"
