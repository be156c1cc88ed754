"""The zoo's training corpus: Python source files of the running interpreter's standard library (or of
folders given instead), plus installed PyPI packages pinned as NAME==VERSION.

Every file is recorded with its sha256 and its split, so a run can say exactly what it learned from.
The held-out split is chosen by a hash of the file's relative path, so it is the same on every machine
and every version that ships the file. A package's files are those its RECORD lists; each is checked
against the sha256 there, so the bytes read are the pinned release's own.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import platform
import re
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from specdeploy.errors import SpecdeployError

HELD_OUT_PERCENT = 5
# Generated tables and data blobs (unicode tables, test vectors) teach nothing about code; skip them.
MAX_FILE_BYTES = 400_000


@dataclass(frozen=True)
class PackagePin:
    name: str  # as given, e.g. "scikit-learn"
    version: str

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class SourceFile:
    path: str  # "<root label>/<path inside that root>", with forward slashes
    sha256: str
    num_bytes: int
    split: str  # "train" or "held_out"


@dataclass(frozen=True)
class CorpusPackage:
    name: str  # canonical distribution name; also the label of its files' paths
    version: str
    root: Path  # the folder its RECORD paths are relative to (site-packages)


@dataclass
class Corpus:
    roots: dict[str, Path]  # label -> folder
    python_version: str
    packages: list[CorpusPackage] = field(default_factory=list)
    files: list[SourceFile] = field(default_factory=list)
    duplicates: int = 0  # files skipped because an earlier file had the same bytes

    def split(self, name: str) -> list[SourceFile]:
        return [f for f in self.files if f.split == name]

    def read(self, source: SourceFile) -> str:
        label, _, inside = source.path.partition("/")
        return (self.roots[label] / inside).read_text(encoding="utf-8")

    def texts(self, split: str) -> list[str]:
        return [self.read(f) for f in self.split(split)]

    def manifest(self) -> dict:
        def totals(files: list[SourceFile]) -> dict:
            return {
                "num_files": {s: sum(f.split == s for f in files) for s in ("train", "held_out")},
                "num_bytes": {
                    s: sum(f.num_bytes for f in files if f.split == s) for s in ("train", "held_out")
                },
            }

        return {
            "python_version": self.python_version,
            "roots": list(self.roots),
            "packages": [
                {
                    "name": p.name,
                    "version": p.version,
                    **totals([f for f in self.files if f.path.startswith(p.name + "/")]),
                }
                for p in self.packages
            ],
            "held_out_rule": f"int(sha256(relative_path)[:8], 16) % 100 < {HELD_OUT_PERCENT}",
            "max_file_bytes": MAX_FILE_BYTES,
            "skipped_duplicates": self.duplicates,
            **totals(self.files),
            "files": [asdict(f) for f in self.files],
        }

    def write_manifest(self, path: Path) -> None:
        """The manifest as JSON with one line per file (it lists thousands of them)."""
        manifest = self.manifest()
        files = manifest.pop("files")
        head = json.dumps(manifest, indent=1)[:-2]  # without the closing newline and brace
        lines = ",\n  ".join(json.dumps(f) for f in files)
        path.write_text(f'{head},\n "files": [\n  {lines}\n ]\n}}\n')


def is_held_out(relative_path: str) -> bool:
    digest = hashlib.sha256(relative_path.encode()).hexdigest()
    return int(digest[:8], 16) % 100 < HELD_OUT_PERCENT


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def parse_pin(text: str) -> PackagePin:
    """`NAME==VERSION` -> PackagePin; anything else is refused with the form to use."""
    name, sep, version = text.partition("==")
    name, version = name.strip(), version.strip()
    if not sep or not name or not version or any(c in name + version for c in "<>=!~;, "):
        bare = re.split(r"[<>=!~;, ]", text.strip(), maxsplit=1)[0]
        try:
            example = f"{bare}=={importlib.metadata.version(bare)}, the version installed here"
        except (importlib.metadata.PackageNotFoundError, ValueError):
            example = "sympy==1.14.0"
        raise SpecdeployError(
            f"corpus package {text!r} is not pinned: write it as NAME==VERSION, e.g. {example}"
        )
    return PackagePin(name, version)


def find_package(pin: PackagePin) -> tuple[importlib.metadata.Distribution, CorpusPackage]:
    """The installed distribution of `pin` in this interpreter; refuses a missing one or another version."""
    install = f"{sys.executable} -m pip install '{pin}'"
    try:
        dist = importlib.metadata.distribution(pin.name)
    except importlib.metadata.PackageNotFoundError:
        raise SpecdeployError(
            f"corpus package {pin.name} is not installed in this Python: run {install}"
        ) from None
    installed = dist.version
    try:
        same = Version(installed) == Version(pin.version)
    except InvalidVersion:
        same = installed == pin.version
    if not same:
        raise SpecdeployError(
            f"corpus package {pin.name} {installed} is installed, {pin.version} was asked for: run {install}, "
            f"or pin --corpus-package {pin.name}=={installed}"
        )
    return dist, CorpusPackage(
        canonicalize_name(dist.metadata["Name"]), installed, Path(dist.locate_file(""))
    )


def package_sources(
    dist: importlib.metadata.Distribution, package: CorpusPackage
) -> Iterator[tuple[str, bytes]]:
    """(path inside site-packages, bytes) of each `.py` file the distribution's RECORD lists, in sorted order.

    A file whose bytes differ from its RECORD hash was changed after installation: refused.
    """
    for entry in sorted(dist.files or [], key=str):
        inside = entry.as_posix()
        if not inside.endswith(".py") or inside.startswith("..") or ".dist-info/" in inside:
            continue  # scripts installed outside site-packages, and metadata
        path = package.root / inside
        if not path.is_file():
            continue
        data = path.read_bytes()
        if entry.hash is not None and entry.hash.mode == "sha256":
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            if digest != entry.hash.value:
                raise SpecdeployError(
                    f"{path} differs from the file {package.name} {package.version} installed: run "
                    f"{sys.executable} -m pip install --force-reinstall '{package.name}=={package.version}'"
                )
        yield inside, data


def folder_sources(root: Path) -> Iterator[tuple[str, bytes]]:
    """(path inside `root`, bytes) of every `.py` file below it, site-packages excluded, in sorted order."""
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if "site-packages" in relative.parts or not path.is_file():
            continue
        yield relative.as_posix(), path.read_bytes()


def collect_corpus(
    roots: list[Path] | None = None, max_files: int | None = None, packages: list[PackagePin] | None = None
) -> Corpus:
    """Every usable `.py` file under each root (default: this interpreter's stdlib), then of each package.

    A root is labelled "stdlib" if it is this interpreter's stdlib, else by its folder name; a package's
    files by its canonical name. Empty, oversized and non-UTF-8 files are skipped, and so is a file whose
    bytes equal an earlier file's (vendored copies would otherwise leak across the split). `max_files`
    keeps the first files of each root and package in sorted path order (for quick runs and tests).
    """
    roots = [stdlib_root()] if not roots else [Path(r) for r in roots]
    corpus = Corpus(roots={}, python_version=platform.python_version())
    sources: list[tuple[str, Iterator[tuple[str, bytes]]]] = []
    for root in roots:
        if not root.is_dir():
            raise SpecdeployError(f"corpus root {root} is not a directory; pass a folder of Python files")
        label = "stdlib" if root.resolve() == stdlib_root().resolve() else root.name
        _add_root(corpus, label, root)
        sources.append((label, folder_sources(root)))
    for pin in packages or []:
        dist, package = find_package(pin)
        _add_root(corpus, package.name, package.root)
        corpus.packages.append(package)
        sources.append((package.name, package_sources(dist, package)))
    seen: set[str] = set()
    for label, files in sources:
        taken = 0
        for inside, data in files:
            if max_files is not None and taken >= max_files:
                break
            if not _usable(data):
                continue
            digest = hashlib.sha256(data).hexdigest()
            if digest in seen:
                corpus.duplicates += 1
                continue
            seen.add(digest)
            relative = f"{label}/{inside}"
            split = "held_out" if is_held_out(relative) else "train"
            corpus.files.append(SourceFile(relative, digest, len(data), split))
            taken += 1
    if not corpus.split("train"):
        raise SpecdeployError(
            "no usable Python files in the corpus roots; point --corpus at folders of .py files"
        )
    return corpus


def _add_root(corpus: Corpus, label: str, root: Path) -> None:
    if label in corpus.roots:
        raise SpecdeployError(
            f"two corpus sources are both called {label!r}; give folders and packages with distinct names"
        )
    corpus.roots[label] = root


def _usable(data: bytes) -> bool:
    if not data.strip() or len(data) > MAX_FILE_BYTES:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False  # a few test files are deliberately in other encodings
    return True
