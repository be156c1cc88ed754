"""The results of one benchmark run on disk: layout, versioned schemas, and read/write helpers.

One directory per run::

    RUN_DIR/
      manifest.json     RunManifest: schema, run id, creation time, specdeploy version, the bench
                        options (urls, dataset, sweep, sampling) and free-form deployment facts
                        (the campaign puts the launch plan here).
      server_info.json  {"target": <GET /server_info>, "baseline": <GET /server_info> | absent},
                        saved verbatim when the run starts (null where the route does not exist).
      server_info_after.json  the same, read again after the run's last cell: what a server learnt while
                        measured (the reference engine's `--budget auto`: its budgets chosen, step costs
                        and acceptance); rewritten by a resumed run.
      server_states.jsonl  {"cell": CellKey.id, "internal_states": ...} per line: the measured server's
                        /server_info internal_states read after each cell (the reference engine's
                        `engine_loop`, where its iterations spent their time since the cell's flush).
      requests.jsonl    One RequestRecord per line (schema "specdeploy.request/1"), appended one
                        whole cell at a time; warmup requests are never written.
      summary.json      RunSummary (schema "specdeploy.summary/1"): one CellSummary per finished
                        cell with its metrics and, where a baseline exists, its paired comparison;
                        `speedups` pools each target load point's repeats (key: CellKey.point_id).
                        Rewritten atomically (temp file + rename) after every cell.
      incomplete.jsonl  Records of cell attempts that did not finish (the server died, the run was
                        interrupted): kept for diagnosis, never counted as results.

Cells. A cell is one measured load point, keyed by CellKey: role ("target" or "baseline"), dataset,
mode label (ar, dflash, ddtree, ...), DDTree budget, concurrency or Poisson request rate, and repeat.
`CellKey.id` is a stable string; every request record carries it in `cell`. A cell is finished
exactly when summary.json lists it. The runner writes a cell as "append its records, then rewrite
summary.json", so after a crash requests.jsonl may hold records of a cell that summary.json does not
list (or a torn last line): `RunDirectory.recover()` drops those, and a resumed run then measures
only the cells missing from summary.json. No record is ever duplicated and no finished cell is lost.

Pairing. A baseline record pairs with a target record of the same dataset, concurrency, request
rate, repeat and prompt (`CellKey.load_point` + `RequestRecord.prompt_id` + `turn`), whether the
baseline ran in the same directory (role "baseline") or in an earlier run directory.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specdeploy.api_key import redact
from specdeploy.bench.telemetry import CellTelemetry
from specdeploy.errors import SpecdeployError
from specdeploy.modes import Budget

REQUEST_SCHEMA = "specdeploy.request/1"
SUMMARY_SCHEMA = "specdeploy.summary/1"
MANIFEST_SCHEMA = "specdeploy.manifest/1"

MANIFEST_FILE = "manifest.json"
SERVER_INFO_FILE = "server_info.json"
SERVER_INFO_AFTER_FILE = "server_info_after.json"
SERVER_STATES_FILE = "server_states.jsonl"
REQUESTS_FILE = "requests.jsonl"
INCOMPLETE_FILE = "incomplete.jsonl"
SUMMARY_FILE = "summary.json"

Role = Literal["target", "baseline"]


class CellKey(BaseModel):
    """Identifies one measured load point inside a run."""

    model_config = ConfigDict(frozen=True)

    role: Role = "target"
    dataset: str
    mode: str = ""
    budget: Budget | None = None
    concurrency: int | None = None
    request_rate: float | None = None
    repeat: int = 0

    @property
    def id(self) -> str:
        load = f"c{self.concurrency}" if self.request_rate is None else f"rate{self.request_rate:g}"
        budget = "" if self.budget is None else f"/b{self.budget}"
        return f"{self.role}/{self.dataset}/{self.mode or '-'}{budget}/{load}/rep{self.repeat}"

    @property
    def point_id(self) -> str:
        """The id without the repeat: what repeats of one load point share."""
        return self.id.rsplit("/", 1)[0]

    @property
    def load_point(self) -> tuple[str, int | None, float | None, int]:
        """What a baseline cell must share with a target cell to be paired with it."""
        return (self.dataset, self.concurrency, self.request_rate, self.repeat)


class Chunk(BaseModel):
    """One streamed event: when it arrived (ns after the request was sent) and the tokens so far."""

    model_config = ConfigDict(frozen=True)

    t_ns: int
    tokens: int


TokenSource = Literal["meta_info", "usage", "ids", "text"]


class RequestRecord(BaseModel):
    """Everything measured about one request; a failed request is a record with `error` set.

    Times are time.monotonic_ns differences: `start_ns` is when the request was sent, counted from
    the start of its cell; chunk `t_ns` and `end_ns` (stream closed) are counted from `start_ns`.
    `token_source` says where the cumulative token counts of `chunks` came from: the native
    `meta_info.completion_tokens`, OpenAI per-chunk `usage`, the returned token ids, or an estimate
    from the text received (OpenAI routes on servers without per-chunk usage).
    """

    schema_: str = Field(REQUEST_SCHEMA, alias="schema")
    cell: str
    index: int  # position in the cell's send order
    prompt_id: str  # the dataset item's id; pairs this request with its baseline
    turn: int = 0  # conversation turn (mt-bench sends turn 1 after the model's own turn 0)
    route: str
    sent_unix: float
    start_ns: int
    chunks: list[Chunk] = []
    end_ns: int | None = None
    token_source: TokenSource = "meta_info"
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    spec_verify_ct: int | None = None
    spec_accept_length: float | None = None
    ddtree_budgets: list[int] | None = None  # an adaptive DDTree budget: each verify step's (0: an AR step)
    ddtree_predicted_accept_length: float | None = None  # what the policy predicted per step, on average
    # SGLang's per-request histogram: entry k counts verify steps that accepted k drafted tokens (bonus aside).
    spec_correct_drafts_histogram: list[int] | None = None
    finish_reason: str | None = None
    output_text: str = ""
    output_ids: list[int] | None = None
    error: str | None = None

    model_config = ConfigDict(populate_by_name=True)

    @property
    def ok(self) -> bool:
        return self.error is None


class Distribution(BaseModel):
    """Summary statistics of one latency-like quantity, in milliseconds unless named otherwise."""

    n: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None


class Interval(BaseModel):
    """A point estimate with a bootstrap confidence interval."""

    estimate: float
    low: float
    high: float
    confidence: float
    n_pairs: int


class CellMetrics(BaseModel):
    n_requests: int
    n_errors: int
    errors: dict[str, int] = {}
    duration_s: float
    requests_per_s: float
    output_tokens: int
    output_tok_s: float
    output_tok_s_per_user: Distribution
    ttft_ms: Distribution
    tpot_ms: Distribution
    itl_ms: Distribution
    chunk_gap_ms: Distribution
    tokens_per_chunk: Distribution
    e2e_ms: Distribution
    tau: Distribution
    tau_histogram: dict[str, int] = {}


class Comparison(BaseModel):
    """A target cell against its paired baseline cell."""

    baseline_cell: str
    speedup: Interval | None = None
    output_match_rate: float | None = None
    n_compared: int = 0


class CellSummary(BaseModel):
    key: CellKey
    metrics: CellMetrics
    comparison: Comparison | None = None
    telemetry: CellTelemetry | None = (
        None  # GPU power, clocks, energy; or why absent (None: recorded before it)
    )
    finished_unix: float


class RunSummary(BaseModel):
    schema_: str = Field(SUMMARY_SCHEMA, alias="schema")
    cells: dict[str, CellSummary] = {}
    speedups: dict[str, Comparison] = {}

    model_config = ConfigDict(populate_by_name=True)


class RunManifest(BaseModel):
    schema_: str = Field(MANIFEST_SCHEMA, alias="schema")
    run_id: str
    created_unix: float
    specdeploy_version: str
    options: dict[str, Any]
    deployment: dict[str, Any] = {}

    model_config = ConfigDict(populate_by_name=True)


def _write_atomic(path: Path, text: str) -> None:
    """Write via a temp file and rename, so readers never see a half-written file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _dump(model: BaseModel) -> str:
    return model.model_dump_json(by_alias=True)


def _append(path: Path, records: list[RequestRecord]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.writelines(_dump(r) + "\n" for r in records)
        f.flush()
        os.fsync(f.fileno())


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


class RunDirectory:
    """Reads and writes one run directory; every write keeps the directory consistent."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    @property
    def requests_path(self) -> Path:
        return self.path / REQUESTS_FILE

    @property
    def summary_path(self) -> Path:
        return self.path / SUMMARY_FILE

    def exists(self) -> bool:
        return (self.path / MANIFEST_FILE).is_file()

    def create(self, manifest: RunManifest, server_info: dict[str, Any]) -> None:
        """Start a fresh run; refuses a directory that already holds one (use resume instead)."""
        if self.exists():
            raise SpecdeployError(
                f"{self.path} already holds a run: pass --resume to continue it or choose another --out"
            )
        self.path.mkdir(parents=True, exist_ok=True)
        # SGLang's /server_info lists its --api-key; the deployment facts may carry it too.
        document = redact(manifest.model_dump(by_alias=True))
        _write_atomic(self.path / MANIFEST_FILE, json.dumps(document, indent=2))
        _write_atomic(self.path / SERVER_INFO_FILE, json.dumps(redact(server_info), indent=2))
        self.requests_path.touch()
        _write_atomic(self.summary_path, _dump(RunSummary()))

    def write_server_info_after(self, server_info: dict[str, Any]) -> None:
        _write_atomic(self.path / SERVER_INFO_AFTER_FILE, json.dumps(redact(server_info), indent=2))

    def append_server_state(self, cell: str, server_info: dict[str, Any] | None) -> None:
        """Keep what the server reported of itself after `cell` (nothing when it has no /server_info)."""
        states = (server_info or {}).get("internal_states")
        if states is None:
            return
        with open(self.path / SERVER_STATES_FILE, "a") as f:
            f.write(json.dumps({"cell": cell, "internal_states": redact(states)}) + "\n")

    def read_manifest(self) -> RunManifest:
        return RunManifest.model_validate(self._read_json(self.path / MANIFEST_FILE, MANIFEST_SCHEMA))

    def read_server_info(self) -> dict[str, Any]:
        return json.loads((self.path / SERVER_INFO_FILE).read_text(encoding="utf-8"))

    def read_summary(self) -> RunSummary:
        return RunSummary.model_validate(self._read_json(self.summary_path, SUMMARY_SCHEMA))

    def finished_cells(self) -> set[str]:
        return set(self.read_summary().cells)

    def read_records(self, cell: str | None = None) -> list[RequestRecord]:
        """Records of finished cells (all of them, or one cell's), in file order."""
        finished = self.finished_cells()
        records = [r for r in self._parse_records() if r.cell in finished]
        return [r for r in records if cell is None or r.cell == cell]

    def write_cell(
        self,
        summary: CellSummary,
        records: list[RequestRecord],
        speedups: dict[str, Comparison] | None = None,
    ) -> None:
        """Persist one finished cell: append its records, then list it in summary.json."""
        key = summary.key.id
        run = self.read_summary()
        if key in run.cells:
            raise SpecdeployError(f"cell {key} is already finished in {self.path}; refusing to duplicate it")
        _append(self.requests_path, records)
        run.cells[key] = summary
        run.speedups.update(speedups or {})
        _write_atomic(self.summary_path, _dump(run))

    def write_incomplete(self, records: list[RequestRecord]) -> None:
        """Keep the records of a cell attempt that did not finish, apart from the results."""
        _append(self.path / INCOMPLETE_FILE, records)

    def recover(self) -> int:
        """Drop records of cells summary.json does not list (a crash mid-write); returns how many."""
        finished = self.finished_cells()
        lines = self.requests_path.read_text(encoding="utf-8").splitlines()
        kept = []
        for line in lines:
            try:
                record = RequestRecord.model_validate_json(line)
            except ValidationError:
                continue  # a line torn by a crash mid-append
            if record.cell in finished:
                kept.append(line)
        if len(kept) != len(lines):
            _write_atomic(self.requests_path, "".join(line + "\n" for line in kept))
        return len(lines) - len(kept)

    def _parse_records(self) -> list[RequestRecord]:
        if not self.requests_path.is_file():
            raise SpecdeployError(f"{self.requests_path} is missing: {self.path} is not a run directory")
        records = []
        for line in self.requests_path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(RequestRecord.model_validate_json(line))
            except ValidationError:
                continue  # a line torn by a crash mid-append; recover() removes it
        return records

    def _read_json(self, path: Path, schema: str) -> dict[str, Any]:
        if not path.is_file():
            raise SpecdeployError(f"{path} is missing: {self.path} is not a specdeploy run directory")
        data = json.loads(path.read_text(encoding="utf-8"))
        found = data.get("schema")
        if found != schema:
            raise SpecdeployError(f"{path} has schema {found!r}, this specdeploy reads {schema!r}")
        return data
