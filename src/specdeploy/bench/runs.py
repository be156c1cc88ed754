"""Finds the run directories under the paths given to `report` or `project` and groups them into series.

A series is what one line of a plot and one column of the side-by-side table stands for: the runs
of one recipe on one machine (from the manifest's deployment facts, which the campaign records),
or, for a plain `specdeploy bench` run that has none, the directory given on the command line.
Such a run still names its engine and hardware: from the target's /server_info, which bench records.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdeploy.bench.results import (
    MANIFEST_FILE,
    SERVER_INFO_FILE,
    SUMMARY_FILE,
    RequestRecord,
    RunDirectory,
    RunManifest,
    RunSummary,
)
from specdeploy.errors import SpecdeployError


@dataclass(frozen=True)
class LoadedRun:
    path: Path
    root: Path  # the path given on the command line that this run was found under
    manifest: RunManifest
    summary: RunSummary
    records: list[RequestRecord]
    server_info: dict[str, Any] | None = None  # the target's /server_info as bench recorded it

    @property
    def facts(self) -> dict[str, Any]:
        """The deployment facts, with engine and hardware from /server_info where no deployment was recorded."""
        recorded = {k: v for k, v in self.manifest.deployment.items() if v is not None}
        return {**server_facts(self.server_info), **recorded}


def server_facts(info: Any) -> dict[str, str]:
    """`engine` and `hardware` as a server's /server_info states them: the reference server names itself in
    `engine` ({name, version, device}); SGLang lists its server arguments (device, tp_size, nnodes) and its
    `version`. No GPU model is in either, so hardware is the device and the parallelism."""
    if not isinstance(info, dict):
        return {}
    facts: dict[str, str] = {}
    engine = info.get("engine")
    if isinstance(engine, dict) and engine.get("name"):
        facts["engine"] = f"{engine['name']} {engine.get('version') or ''}".strip()
    elif isinstance(engine, str) and engine:
        facts["engine"] = engine
    elif info.get("version"):
        facts["engine"] = f"sglang {info['version']}"
    device = info.get("device") or (engine.get("device") if isinstance(engine, dict) else None)
    if device:
        tp, nodes = info.get("tp_size"), info.get("nnodes")
        facts["hardware"] = (
            str(device)
            + (f", TP {tp}" if isinstance(tp, int) and tp > 1 else "")
            + (f", {nodes} nodes" if isinstance(nodes, int) and nodes > 1 else "")
        )
    return facts


@dataclass(frozen=True)
class Series:
    label: str
    runs: tuple[LoadedRun, ...]

    def fact(self, name: str) -> str:
        """One deployment fact over the series' runs ("-" when unrecorded, joined when they differ)."""
        values = dict.fromkeys(str(r.facts[name]) for r in self.runs if r.facts.get(name) is not None)
        return ", ".join(values) or "-"

    @property
    def gpu(self) -> str:
        for run in self.runs:
            hardware = (run.facts.get("deploy_manifest") or {}).get("hardware") or {}
            gpus = hardware.get("gpus") or []
            if gpus:
                return f"{len(gpus)}x {gpus[0].get('name', '?')}"
        return "-"


def find_run_dirs(root: Path) -> list[Path]:
    """`root` itself when it is a bench run directory, else every bench run directory below it."""
    if not root.exists():
        raise SpecdeployError(f"{root} does not exist: give a bench run directory or a campaign directory")
    if (root / SUMMARY_FILE).is_file():
        return [root]
    found = sorted(
        summary.parent for summary in root.rglob(SUMMARY_FILE) if (summary.parent / MANIFEST_FILE).is_file()
    )
    if not found:
        raise SpecdeployError(
            f"{root} holds no benchmark run (no {SUMMARY_FILE} with a {MANIFEST_FILE}): give a directory "
            "written by `specdeploy bench` or `specdeploy campaign`"
        )
    return found


def load_run(path: Path, root: Path) -> LoadedRun:
    run = RunDirectory(path)
    info = run.read_server_info().get("target") if (path / SERVER_INFO_FILE).is_file() else None
    return LoadedRun(path, root, run.read_manifest(), run.read_summary(), run.read_records(), info)


def _label(run: LoadedRun) -> str:
    recipe, hardware = run.facts.get("recipe"), run.facts.get("hardware")
    if recipe and hardware:
        return f"{recipe} on {hardware}"
    return run.root.resolve().name


def load_series(roots: list[Path]) -> list[Series]:
    """Every run under `roots`, grouped into series in the order the roots were given."""
    if not roots:
        raise SpecdeployError("give at least one run directory (or campaign directory) to report on")
    runs = [load_run(path, root) for root in roots for path in find_run_dirs(root)]
    groups: dict[str, list[LoadedRun]] = defaultdict(list)
    for run in runs:
        groups[_label(run)].append(run)
    series = []
    for label, members in groups.items():
        roots_of_label = list(dict.fromkeys(run.root for run in members))
        if len(roots_of_label) == 1:
            series.append(Series(label, tuple(members)))
            continue
        # The same recipe and machine in two given directories (two campaigns): keep them apart.
        for root in roots_of_label:
            series.append(
                Series(f"{label} ({root.resolve().name})", tuple(r for r in members if r.root == root))
            )
    return series
