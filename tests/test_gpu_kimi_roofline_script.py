"""benchmarks/gpu_kimi_roofline.py and gpu_stages.py: the dense check compares only steps of one card, and an
earlier commit's tree runs with its own code."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location(
    "gpu_kimi_roofline", ROOT / "benchmarks" / "gpu_kimi_roofline.py"
)
roofline = importlib.util.module_from_spec(spec)
spec.loader.exec_module(roofline)  # puts benchmarks/ on sys.path, where gpu_stages is
import gpu_stages  # noqa: E402


def result(path: Path, gpu: str, steps: dict[str, float]) -> Path:
    engine = {mode: {"ms_per_step": ms} for mode, ms in steps.items()}
    path.write_text(json.dumps({"machine": {"gpu": gpu}, "engine": engine}))
    return path


def test_a_step_is_compared_only_with_steps_of_its_own_card(tmp_path: Path) -> None:
    h200 = result(tmp_path / "h200.json", "NVIDIA H200", {"ar": 4.9, "dflash": 6.3})
    h100 = result(tmp_path / "h100.json", "NVIDIA H100 80GB HBM3", {"ar": 6.3})
    assert gpu_stages.committed_steps([h200, h100], "NVIDIA H100 80GB HBM3") == {"ar": (6.3, "h100.json")}
    assert gpu_stages.committed_steps([h200, h100]) == {
        "ar": (4.9, "h200.json"),
        "dflash": (6.3, "h200.json"),
    }
    measured = {"machine": {"gpu": "NVIDIA H100 80GB HBM3"}, "engine": {"ar": {"ms_per_step": 5.6}}}
    card = gpu_stages.card_of(measured)
    # 5.6 ms on an H100 is 14% slower than the H200's 4.9 but 11% faster than the H100's own 6.3
    verdict = gpu_stages.compare_steps(measured, gpu_stages.committed_steps([h200, h100], card), 1.03)
    assert verdict["ar"]["committed_file"] == "h100.json" and verdict["ar"]["passed"]
    assert gpu_stages.compare_steps(measured, gpu_stages.committed_steps([h200], card), 1.03) == {}


def test_the_baseline_tree_runs_its_own_code(tmp_path: Path) -> None:
    tree = tmp_path / "base"
    (tree / "src" / "specdeploy").mkdir(parents=True)
    (tree / "src" / "specdeploy" / "__init__.py").write_text("")
    (tree / "benchmarks").mkdir()
    # a stand-in for the earlier commit's side-by-side script: records which specdeploy it imported
    (tree / "benchmarks" / "ddtree_side_by_side.py").write_text(
        "import json, sys, specdeploy\n"
        "out = sys.argv[sys.argv.index('--out') + 1]\n"
        "modes = sys.argv[sys.argv.index('--modes') + 1].split(',')\n"
        "engine = {m: {'ms_per_step': 5.0 + i} for i, m in enumerate(modes)}\n"
        "json.dump({'engine': engine, 'specdeploy': specdeploy.__file__}, open(out, 'w'))\n"
    )
    out = tmp_path / "out"
    out.mkdir()
    before = roofline.dense_baseline(tree, "e1ce3fa", out, limit=60)
    name = "engine_qwen3-8b_e1ce3fa.json"
    assert before == {
        "ar": (5.0, name),
        "dflash": (6.0, name),
        "ddtree-16": (7.0, name),
        "ddtree-64": (8.0, name),
    }
    imported = Path(json.loads((out / name).read_text())["specdeploy"])
    assert imported.is_relative_to(tree / "src")


def test_a_tree_that_measured_nothing_gives_no_baseline(tmp_path: Path) -> None:
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "ddtree_side_by_side.py").write_text("raise SystemExit(3)\n")
    assert roofline.dense_baseline(tmp_path, "x", tmp_path, limit=60) == {}
