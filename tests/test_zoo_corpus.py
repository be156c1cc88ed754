"""The zoo's corpus: folders and pinned installed packages, each file's sha256 and a stable held-out split."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from zoo_helpers import CODE, install_fake_package

from specdeploy.errors import SpecdeployError
from specdeploy.zoo.corpus import MAX_FILE_BYTES, collect_corpus, is_held_out, parse_pin


def write_corpus(root: Path, files: int) -> Path:
    for i in range(files):
        (root / f"pkg{i % 3}").mkdir(parents=True, exist_ok=True)
        (root / f"pkg{i % 3}" / f"mod{i}.py").write_text(f"# module {i}\n" + CODE * 20)
    return root


@pytest.fixture
def fake_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    modules = {f"zoofake/mod{i}.py": f"# zoofake module {i}\n{CODE * 3}".encode() for i in range(60)}
    modules["zoofake/vendored/mod0.py"] = modules["zoofake/mod0.py"]  # a vendored copy: skipped
    modules["zoofake/tables.py"] = b"x = 1\n" * (MAX_FILE_BYTES // 6 + 1)  # generated data: skipped
    modules["zoofake/data.txt"] = b"not python"
    return install_fake_package(tmp_path / "site", modules, monkeypatch)


def test_corpus_records_files_hashes_and_a_stable_held_out_split(tmp_path: Path) -> None:
    root = write_corpus(tmp_path / "src", 40)
    (root / "latin1.py").write_bytes("x = 'caf\xe9'\n".encode("latin-1"))  # not UTF-8: skipped
    (root / "site-packages").mkdir()
    (root / "site-packages" / "dep.py").write_text(CODE)  # installed packages are not the stdlib: skipped
    corpus = collect_corpus([root])
    paths = [f.path for f in corpus.files]
    assert len(paths) == 40 and all(p.startswith("src/pkg") for p in paths)
    first = corpus.files[0]
    assert first.sha256 == hashlib.sha256((root / first.path.removeprefix("src/")).read_bytes()).hexdigest()
    assert all((f.split == "held_out") == is_held_out(f.path) for f in corpus.files)
    assert 0 < len(corpus.split("held_out")) < 10  # about 5% of 40 files, by the path hash
    manifest = corpus.manifest()
    assert manifest["num_files"] == {
        "train": 40 - len(corpus.split("held_out")),
        "held_out": len(corpus.split("held_out")),
    }
    assert collect_corpus([root]).manifest() == manifest
    corpus.write_manifest(tmp_path / "corpus.json")
    assert json.loads((tmp_path / "corpus.json").read_text()) == manifest


def test_corpus_rejects_a_folder_without_python(tmp_path: Path) -> None:
    with pytest.raises(SpecdeployError, match="no usable Python files"):
        collect_corpus([tmp_path])
    with pytest.raises(SpecdeployError, match="not a directory"):
        collect_corpus([tmp_path / "missing"])


def test_a_pinned_package_joins_with_every_file_hashed_and_split(tmp_path: Path, fake_site: Path) -> None:
    folder = write_corpus(tmp_path / "src", 6)
    corpus = collect_corpus([folder], packages=[parse_pin("zoofake==1.2.0")])
    package_files = [f for f in corpus.files if f.path.startswith("zoofake/")]
    assert sorted(f.path for f in package_files) == sorted(f"zoofake/zoofake/mod{i}.py" for i in range(60))
    for source in package_files:
        data = (fake_site / source.path.removeprefix("zoofake/")).read_bytes()
        assert source.sha256 == hashlib.sha256(data).hexdigest() and source.num_bytes == len(data)
        assert source.split == ("held_out" if is_held_out(source.path) else "train")
    assert corpus.duplicates == 1  # vendored/mod0.py, after mod0.py in path order
    assert corpus.read(package_files[0]).startswith("# zoofake module")
    (entry,) = corpus.manifest()["packages"]
    held_out = sum(f.split == "held_out" for f in package_files)
    assert entry == {
        "name": "zoofake",
        "version": "1.2.0",
        "num_files": {"train": 60 - held_out, "held_out": held_out},
        "num_bytes": {
            "train": sum(f.num_bytes for f in package_files if f.split == "train"),
            "held_out": sum(f.num_bytes for f in package_files if f.split == "held_out"),
        },
    }


def test_pins_are_checked_against_what_is_installed(fake_site: Path) -> None:
    with pytest.raises(
        SpecdeployError,
        match=r"zoofake 1\.2\.0 is installed, 1\.3 was asked for: run .*pip install 'zoofake==1\.3'",
    ):
        collect_corpus(packages=[parse_pin("zoofake==1.3")])
    with pytest.raises(
        SpecdeployError, match=r"not installed in this Python: run .*pip install 'zoofake-missing==1\.0'"
    ):
        collect_corpus(packages=[parse_pin("zoofake-missing==1.0")])
    for unpinned in ("zoofake", "zoofake>=1.0", "zoofake=="):
        with pytest.raises(
            SpecdeployError, match=r"not pinned: write it as NAME==VERSION, e\.g\. zoofake==1\.2\.0"
        ):
            parse_pin(unpinned)
    assert str(parse_pin(" zoofake == 1.2 ")) == "zoofake==1.2"
    collect_corpus(packages=[parse_pin("zoofake==1.2")])  # the same version, written shorter


def test_a_package_file_changed_after_installation_is_refused(fake_site: Path) -> None:
    (fake_site / "zoofake" / "mod3.py").write_text("# edited by hand\n")
    with pytest.raises(SpecdeployError, match=r"mod3\.py differs from the file zoofake 1\.2\.0 installed"):
        collect_corpus(packages=[parse_pin("zoofake==1.2.0")])
