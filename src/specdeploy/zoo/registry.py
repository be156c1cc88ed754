"""The shipped zoo: trained tiny pairs under `zoo/models/<name>/{target,draft}`, the corpus record they
share (`zoo/models/corpus.json`), and `zoo:` model names.

Names: `zoo:NAME` (or `zoo:NAME/target`) is a pair's target, `zoo:NAME-draft` (or `zoo:NAME/draft`) its
DFlash drafter. Anything else is taken as a local path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specdeploy.errors import SpecdeployError
from specdeploy.zoo.specs import PAIRS, PairSpec

if TYPE_CHECKING:
    from specdeploy.zoo.table import MeasuredTau

ZOO_PREFIX = "zoo:"
MODELS_DIR = Path(__file__).parent / "models"


@dataclass(frozen=True)
class ZooPair:
    spec: PairSpec
    directory: Path

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def target_dir(self) -> Path:
        return self.directory / "target"

    @property
    def draft_dir(self) -> Path:
        return self.directory / "draft"

    @property
    def card_path(self) -> Path:
        return self.directory / "card.md"

    @property
    def corpus_path(self) -> Path:
        """The record of the corpus every pair of the folder was trained on (one file for all of them)."""
        return self.directory.parent / "corpus.json"

    def corpus(self) -> dict:
        return json.loads(self.corpus_path.read_text()) if self.corpus_path.is_file() else {}

    @property
    def shipped(self) -> bool:
        return (self.target_dir / "config.json").is_file() and (self.draft_dir / "config.json").is_file()

    def size_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.directory.rglob("*") if f.is_file())

    def train_log(self) -> dict:
        path = self.directory / "train_log.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def measured_tau(self) -> MeasuredTau:
        """DFlash and DDTree tau from the card's acceptance table (`zoo eval --write-card`); None without."""
        from specdeploy.zoo.table import MeasuredTau, measured_tau

        if not self.card_path.is_file():
            return MeasuredTau(None, None, None)
        return measured_tau(self.card_path.read_text())

    def card_summary(self) -> str:
        """The first sentence of the card's first paragraph after its title, on one line."""
        if not self.card_path.is_file():
            return ""
        paragraphs = self.card_path.read_text().split("\n\n")
        body = [p for p in paragraphs if p.strip() and not p.lstrip().startswith("#")]
        return " ".join(body[0].split()).split(". ")[0].rstrip(".") + "." if body else ""


def zoo_pairs(models_dir: Path = MODELS_DIR) -> list[ZooPair]:
    """Every pair the zoo defines, shipped or not, in definition order."""
    return [ZooPair(spec, models_dir / name) for name, spec in PAIRS.items()]


def get_pair(name: str, models_dir: Path = MODELS_DIR) -> ZooPair:
    if name not in PAIRS:
        raise SpecdeployError(f"no zoo pair {name!r}; `specdeploy zoo list` shows them: {', '.join(PAIRS)}")
    pair = ZooPair(PAIRS[name], models_dir / name)
    if not pair.shipped:
        raise SpecdeployError(
            f"zoo pair {name!r} has no weights in {pair.directory}; train it with `specdeploy zoo train`"
        )
    return pair


def resolve_pair(name: str, models_dir: Path = MODELS_DIR) -> tuple[Path, Path]:
    """A pair name (with or without `zoo:`) -> (target directory, drafter directory)."""
    pair = get_pair(name.removeprefix(ZOO_PREFIX), models_dir)
    return pair.target_dir, pair.draft_dir


def resolve_model_path(name_or_path: str, models_dir: Path = MODELS_DIR) -> Path:
    """`zoo:NAME[/target]` -> target dir, `zoo:NAME-draft` or `zoo:NAME/draft` -> drafter dir; else a path."""
    if not name_or_path.startswith(ZOO_PREFIX):
        path = Path(name_or_path).expanduser()
        if not path.exists():
            raise SpecdeployError(
                f"model path {name_or_path} does not exist: give a checkpoint directory or zoo:NAME"
            )
        return path
    name = name_or_path.removeprefix(ZOO_PREFIX)
    role = "target"
    if name.endswith("/target") or name.endswith("/draft"):
        name, _, role = name.rpartition("/")
    elif name.endswith("-draft") and name.removesuffix("-draft") in PAIRS:
        name, role = name.removesuffix("-draft"), "draft"
    target_dir, draft_dir = resolve_pair(name, models_dir)
    return target_dir if role == "target" else draft_dir


def resolve_models(
    target: str, draft: str | None, mode: str, budget: int | None = None
) -> tuple[Path, Path | None]:
    """Command-line model names -> directories, after checking the mode and budget: `zoo:NAME` (a zoo
    target brings its own drafter when the mode needs one) or checkpoint paths."""
    from specdeploy.engine.request import check_mode

    if mode != "ar" and draft is None and target.startswith(ZOO_PREFIX):
        draft = f"{target.removesuffix('/target')}/draft"
    check_mode(mode, draft is not None, budget)
    return resolve_model_path(target), None if draft is None else resolve_model_path(draft)
