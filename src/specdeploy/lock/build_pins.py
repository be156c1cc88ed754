"""The SGLang version inside the locked image, and the pip pins of the DDTree build, read by running it."""

from __future__ import annotations

import json
import shlex
import subprocess

from specdeploy.errors import SpecdeployError
from specdeploy.plan.image import checkout_steps
from specdeploy.plan.launch_plan import ImageBuild

REPORT = "/tmp/specdeploy-pip-report.json"
VERSION_PROBE = "import importlib.metadata as m; print(m.version('sglang'))"


def probe_script(build: ImageBuild) -> str:
    """Print the image's SGLang version, then pip's report of what installing the PR would install."""
    quiet = [f"{step} >&2" for step in checkout_steps(build)]
    dry_run = f"pip install --dry-run --quiet --report {REPORT} {build.source_dir}/python >&2"
    return " && ".join(
        ["set -euo pipefail", *quiet, f"python -c {shlex.quote(VERSION_PROBE)}", dry_run, f"cat {REPORT}"]
    )


def constraints_from_report(report: dict) -> list[str]:
    """name==version of every package pip would install, except the PR's own source (installed by path)."""
    pins = {
        f"{item['metadata']['name']}=={item['metadata']['version']}"
        for item in report.get("install", [])
        if not item.get("download_info", {}).get("url", "").startswith("file://")
    }
    return sorted(pins, key=str.lower)


def probe_build(build: ImageBuild) -> tuple[str, list[str]]:
    """(SGLang version of `build.base`, pip pins for the build), from one `docker run` of the base image."""
    command = ["docker", "run", "--rm", "--entrypoint", "bash", build.base, "-c", probe_script(build)]
    try:
        result = subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError:
        raise SpecdeployError(
            "docker is not installed: `specdeploy lock` runs the base image once to read its SGLang version "
            "and to let pip choose the DDTree build's dependencies; lock on a machine with docker"
        ) from None
    version, _, report = result.stdout.partition("\n")
    try:
        if result.returncode != 0:
            raise ValueError(result.stderr.strip()[-500:])
        return version.strip(), constraints_from_report(json.loads(report))
    except (ValueError, KeyError) as exc:
        raise SpecdeployError(f"probing {build.base} for the DDTree build failed: {exc}") from None
