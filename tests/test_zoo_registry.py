"""zoo: names, the shipped pairs' folders, `zoo list`, and the mode comparison table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.errors import SpecdeployError
from specdeploy.zoo.registry import get_pair, resolve_model_path, resolve_pair, zoo_pairs
from specdeploy.zoo.table import ModeRow, markdown_table


@pytest.fixture
def models_dir(tmp_path: Path, random_pair: tuple[Path, Path]) -> Path:
    """A zoo folder holding one pair (tiny-code, made of the random test pair) and nothing else."""
    target, draft = random_pair
    shutil.copytree(target, tmp_path / "tiny-code" / "target")
    shutil.copytree(draft, tmp_path / "tiny-code" / "draft")
    (tmp_path / "tiny-code" / "card.md").write_text(
        "# tiny-code\n\nA summary\nover two lines. More.\n\n## More\n"
    )
    return tmp_path


def test_zoo_names_resolve_to_target_and_drafter_folders(models_dir: Path) -> None:
    pair = models_dir / "tiny-code"
    assert resolve_pair("tiny-code", models_dir) == (pair / "target", pair / "draft")
    assert resolve_pair("zoo:tiny-code", models_dir) == (pair / "target", pair / "draft")
    assert resolve_model_path("zoo:tiny-code", models_dir) == pair / "target"
    assert resolve_model_path("zoo:tiny-code/target", models_dir) == pair / "target"
    assert resolve_model_path("zoo:tiny-code-draft", models_dir) == pair / "draft"
    assert resolve_model_path("zoo:tiny-code/draft", models_dir) == pair / "draft"
    assert resolve_model_path(str(pair / "draft"), models_dir) == pair / "draft"  # plain paths pass through
    assert get_pair("tiny-code", models_dir).card_summary() == "A summary over two lines."


def test_bad_zoo_names_say_what_exists(models_dir: Path) -> None:
    with pytest.raises(SpecdeployError, match="no zoo pair 'tiny-gpt'.*tiny-code, tiny-mla, tiny-hybrid"):
        resolve_model_path("zoo:tiny-gpt", models_dir)
    with pytest.raises(SpecdeployError, match="'tiny-mla' has no weights.*zoo train"):
        resolve_model_path("zoo:tiny-mla", models_dir)
    with pytest.raises(SpecdeployError, match="does not exist"):
        resolve_model_path(str(models_dir / "nowhere"), models_dir)


def test_the_shipped_zoo_has_all_three_pairs_with_cards() -> None:
    pairs = {pair.name: pair for pair in zoo_pairs()}
    assert list(pairs) == ["tiny-code", "tiny-mla", "tiny-hybrid"]
    for pair in pairs.values():
        assert pair.shipped, f"{pair.name} weights are missing"
        assert pair.card_path.is_file() and pair.card_summary()
        assert json.loads((pair.draft_dir / "config.json").read_text())["block_size"] == pair.spec.block_size
    total = sum(pair.size_bytes() for pair in pairs.values())
    assert total < 64e6


def test_zoo_list_json_describes_every_pair() -> None:
    result = CliRunner().invoke(app, ["zoo", "list", "--json"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert [(r["name"], r["family"], r["block_size"]) for r in rows] == [
        ("tiny-code", "qwen3", 16),
        ("tiny-mla", "deepseek_v3", 8),
        ("tiny-hybrid", "qwen3_next", 16),
    ]
    assert all(r["target_parameters"] > 1e6 and r["draft_parameters"] > 1e5 for r in rows)


def test_markdown_table_marks_the_baseline_and_match_counts() -> None:
    rows = [
        ModeRow("ar", 1.0, 50.0, 1.0, None, 4),
        ModeRow("dflash", 3.5, 120.0, 2.4, 4, 4),
    ]
    table = markdown_table(rows).splitlines()
    assert table[2] == "| ar | 1.00 | 50.0 | 1.00x | baseline |"
    assert table[3] == "| dflash | 3.50 | 120.0 | 2.40x | 4/4 |"
