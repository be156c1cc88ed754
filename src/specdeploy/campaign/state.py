"""The campaign's state file: per server configuration, its starts, its deaths and its outcome.

Which cells are finished is not recorded here: each bench run directory's summary.json is the
truth for that (it is written at once after every cell). The state adds what the run directories
cannot know: which deployments were started (so a resume stops any left running), which server died
during which cell, and which cells and configurations failed. A cell gets one restart per execution:
a resume is a fresh decision to try again, so deaths recorded here do not count against it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from specdeploy.errors import SpecdeployError

STATE_SCHEMA = "specdeploy.campaign-state/1"
STATE_FILE = "state.json"

ServerStatus = Literal["pending", "running", "complete", "failed", "blocked", "interrupted"]
StartOutcome = Literal["running", "stopped", "died", "failed"]


class StartRecord(BaseModel):
    deploy_dir: str
    started_unix: float
    outcome: StartOutcome = "running"
    error: str | None = None


class Death(BaseModel):
    """A server that stopped answering during a cell."""

    run: str  # the bench run's name, <server>/<dataset>
    cell: str
    deploy_dir: str
    unix: float
    error: str


class ServerState(BaseModel):
    status: ServerStatus = "pending"
    starts: list[StartRecord] = Field(default_factory=list)
    deaths: list[Death] = Field(default_factory=list)
    complete_runs: list[str] = Field(default_factory=list)  # "<server>/<dataset>", every cell finished
    failed_cells: list[str] = Field(default_factory=list)  # "<run>:<cell id>"
    error: str | None = None


class CampaignState(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    schema_: str = Field(STATE_SCHEMA, alias="schema")
    name: str
    servers: dict[str, ServerState] = Field(default_factory=dict)
    updated_unix: float = 0.0

    def server(self, server_id: str) -> ServerState:
        return self.servers.setdefault(server_id, ServerState())


def read_state(out: Path) -> CampaignState:
    path = out / STATE_FILE
    if not path.is_file():
        raise SpecdeployError(f"{path} is missing: {out} is not a campaign directory")
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("schema") != STATE_SCHEMA:
        raise SpecdeployError(
            f"{path} has schema {data.get('schema')!r}, this specdeploy reads {STATE_SCHEMA!r}"
        )
    return CampaignState.model_validate(data)


def write_state(out: Path, state: CampaignState) -> None:
    """Write via a temp file and rename: a crash mid-write leaves the previous state intact."""
    state.updated_unix = time.time()
    partial = out / f".{STATE_FILE}.partial"
    partial.write_text(state.model_dump_json(by_alias=True, indent=2) + "\n", encoding="utf-8")
    partial.replace(out / STATE_FILE)
