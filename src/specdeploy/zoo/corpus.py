"""The zoo's training corpus: Python source files of the running interpreter's standard library, and of
any further folders given (installed packages, say).

Every file is recorded with its sha256 and its split, so a run can say exactly what it learned from.
The held-out split is chosen by a hash of the file's relative path, so it is the same on every machine
and every Python version that ships the file.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sysconfig
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specdeploy.errors import SpecdeployError

HELD_OUT_PERCENT = 5
# Generated tables and data blobs (unicode tables, test vectors) teach nothing about code; skip them.
MAX_FILE_BYTES = 400_000


@dataclass(frozen=True)
class SourceFile:
    path: str  # "<root label>/<path inside that root>", with forward slashes
    sha256: str
    num_bytes: int
    split: str  # "train" or "held_out"


@dataclass
class Corpus:
    roots: dict[str, Path]  # label -> folder
    python_version: str
    files: list[SourceFile] = field(default_factory=list)

    def split(self, name: str) -> list[SourceFile]:
        return [f for f in self.files if f.split == name]

    def read(self, source: SourceFile) -> str:
        label, _, inside = source.path.partition("/")
        return (self.roots[label] / inside).read_text(encoding="utf-8")

    def texts(self, split: str) -> list[str]:
        return [self.read(f) for f in self.split(split)]

    def manifest(self) -> dict:
        return {
            "python_version": self.python_version,
            "roots": list(self.roots),
            "held_out_rule": f"int(sha256(relative_path)[:8], 16) % 100 < {HELD_OUT_PERCENT}",
            "max_file_bytes": MAX_FILE_BYTES,
            "num_files": {s: len(self.split(s)) for s in ("train", "held_out")},
            "num_bytes": {s: sum(f.num_bytes for f in self.split(s)) for s in ("train", "held_out")},
            "files": [asdict(f) for f in self.files],
        }

    def write_manifest(self, path: Path) -> None:
        path.write_text(json.dumps(self.manifest(), indent=1) + "\n")


def is_held_out(relative_path: str) -> bool:
    digest = hashlib.sha256(relative_path.encode()).hexdigest()
    return int(digest[:8], 16) % 100 < HELD_OUT_PERCENT


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def collect_corpus(roots: list[Path] | None = None, max_files: int | None = None) -> Corpus:
    """Every UTF-8 `.py` file under each root (default: this interpreter's stdlib), site-packages excluded.

    A root is labelled "stdlib" if it is this interpreter's stdlib, else by its folder name. `max_files`
    keeps the first files of each root in sorted path order (for quick runs and tests).
    """
    roots = [stdlib_root()] if not roots else [Path(r) for r in roots]
    labels = {}
    for root in roots:
        if not root.is_dir():
            raise SpecdeployError(f"corpus root {root} is not a directory; pass a folder of Python files")
        label = "stdlib" if root.resolve() == stdlib_root().resolve() else root.name
        if label in labels:
            raise SpecdeployError(
                f"two corpus roots are both called {label!r}; give folders with distinct names"
            )
        labels[label] = root
    corpus = Corpus(roots=labels, python_version=platform.python_version())
    for label, root in labels.items():
        taken = 0
        for path in sorted(root.rglob("*.py")):
            if max_files is not None and taken >= max_files:
                break
            if "site-packages" in path.relative_to(root).parts or not path.is_file():
                continue
            data = path.read_bytes()
            if not data.strip() or len(data) > MAX_FILE_BYTES:
                continue
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                continue  # a few test files are deliberately in other encodings
            relative = f"{label}/{path.relative_to(root).as_posix()}"
            split = "held_out" if is_held_out(relative) else "train"
            corpus.files.append(SourceFile(relative, hashlib.sha256(data).hexdigest(), len(data), split))
            taken += 1
    if not corpus.split("train"):
        raise SpecdeployError(
            "no usable Python files in the corpus roots; point --corpus at folders of .py files"
        )
    return corpus
