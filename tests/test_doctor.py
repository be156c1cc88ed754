"""`specdeploy doctor`: each cause of low acceptance broken on purpose in a copy of a real pair is named; the
good zoo pairs get no error; the probe reads SGLang's per-request histogram from a server."""

from __future__ import annotations

import json
import math
import shutil
from collections import Counter
from pathlib import Path

import pytest

from specdeploy.bench.fakeserver import FakeServer, ServerThread, StreamPlan
from specdeploy.doctor.acceptance import (
    GroupMeasure,
    depth_rates,
    histogram_from_accept_lengths,
    probe_findings,
)
from specdeploy.doctor.pair import PairFiles, static_findings
from specdeploy.doctor.probe import probe_requests, probe_server
from specdeploy.recipes.loader import load_recipe
from specdeploy.sglang_protocol import spec_metrics
from specdeploy.zoo.registry import MODELS_DIR

ZOO = ("tiny-code", "tiny-mla", "tiny-hybrid")


def copy_pair(tmp_path: Path, name: str = "tiny-code") -> Path:
    """The pair's folder (card.md, target/, draft/) without weights: static checks read no weights."""
    out = tmp_path / name
    shutil.copytree(MODELS_DIR / name, out, ignore=shutil.ignore_patterns("*.safetensors", "train_log.json"))
    return out


def edit_draft(pair_dir: Path, **changes: object) -> None:
    path = pair_dir / "draft" / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if key in ("target_layer_ids", "mask_token_id"):
            config["dflash_config"][key] = value
        else:
            config[key] = value
    path.write_text(json.dumps(config))


def findings_of(pair_dir: Path, draft_dir: Path | None = None, **kwargs: object) -> list:
    return static_findings(PairFiles.read(pair_dir / "target", draft_dir or pair_dir / "draft"), **kwargs)


def checks(findings: list, severity: str = "error") -> set[str]:
    return {f.check for f in findings if f.severity == severity}


@pytest.mark.parametrize("name", ZOO)
def test_good_zoo_pairs_have_no_static_error(tmp_path: Path, name: str) -> None:
    assert checks(findings_of(copy_pair(tmp_path, name))) == set()


def test_wrong_layer_ids_inside_the_target_are_named_against_the_card(tmp_path: Path) -> None:
    pair = copy_pair(tmp_path)
    edit_draft(pair, target_layer_ids=[2, 6])  # both exist in the 8-layer target; the card says [1, 5]
    found = [f for f in findings_of(pair) if f.check == "target-layers"]
    assert [f.severity for f in found] == ["error"] and "[1, 5]" in found[0].evidence


def test_wrong_layer_ids_without_a_card_differ_from_the_default_spread(tmp_path: Path) -> None:
    pair = copy_pair(tmp_path)
    (pair / "card.md").unlink()
    edit_draft(pair, target_layer_ids=[2, 6])
    found = [f for f in findings_of(pair) if f.check == "target-layers"]
    # z-lab's spread for 2 context layers of 8: from layer 1 to layer 8 - 3 = 5
    assert [f.severity for f in found] == ["warning"] and "[1, 5]" in found[0].evidence


def test_layer_ids_outside_the_target(tmp_path: Path) -> None:
    pair = copy_pair(tmp_path)
    edit_draft(pair, target_layer_ids=[1, 8])
    assert any("[8] do not exist" in f.message for f in findings_of(pair) if f.severity == "error")


def test_wrong_rope_theta(tmp_path: Path) -> None:
    pair = copy_pair(tmp_path)
    edit_draft(pair, rope_theta=1_000_000.0)
    found = [f for f in findings_of(pair) if f.check == "rope"]
    assert found[0].severity == "error" and "rope_theta: drafter 1000000.0, target 10000" in found[0].evidence


def test_yarn_factor_and_legacy_attention_factor(tmp_path: Path) -> None:
    from specdeploy.zoo.random_pair import write_random_pair

    target, draft = write_random_pair(tmp_path / "mla", family="deepseek_v3")  # Kimi's YaRN in miniature
    good = static_findings(PairFiles.read(target, draft))
    assert checks(good) == set()
    legacy = next(f for f in good if f.check == "yarn-attention-factor")
    # factor 4 with mscale = mscale_all_dim = 1: legacy 0.1 * ln 4 + 1, derived 1.0
    assert legacy.severity == "warning" and f"{0.1 * math.log(4) + 1:.4f}" in legacy.message
    assert "1.0000" in legacy.message
    config = json.loads((draft / "config.json").read_text())
    config["rope_scaling"]["factor"] = 8.0
    (draft / "config.json").write_text(json.dumps(config))
    broken = static_findings(PairFiles.read(target, draft))
    assert "factor: drafter 8.0, target 4.0" in next(f for f in broken if f.check == "rope").evidence


def test_vocabulary_and_hidden_size_mismatch(tmp_path: Path) -> None:
    pair = copy_pair(tmp_path)
    edit_draft(pair, vocab_size=4096, hidden_size=128)
    assert {"vocabulary", "hidden-size"} <= checks(findings_of(pair))


def test_mask_token_not_the_tokenizers_or_outside_the_vocabulary(tmp_path: Path) -> None:
    pair = copy_pair(tmp_path)
    tokenizer = json.loads((pair / "target" / "tokenizer.json").read_text())
    mask_id = next(t["id"] for t in tokenizer["added_tokens"] if t["content"] == "<|mask|>")
    edit_draft(pair, mask_token_id=mask_id + 40)
    found = next(f for f in findings_of(pair) if f.check == "mask-token")
    assert found.severity == "error" and f"set dflash_config.mask_token_id to {mask_id}" == found.fix
    edit_draft(pair, mask_token_id=99_999)
    assert (
        "outside the target's vocabulary"
        in next(f for f in findings_of(pair) if f.check == "mask-token").message
    )


def test_block_size_against_the_servers_draft_tokens_and_the_recipe(tmp_path: Path) -> None:
    pair = copy_pair(tmp_path)  # block 16
    assert checks(findings_of(pair, draft_tokens=32)) == {"block-size"}
    assert checks(findings_of(pair, draft_tokens=8), "warning") >= {"block-size"}
    recipe = load_recipe("tiny-code")
    wrong = recipe.model_copy(update={"dflash": recipe.dflash.model_copy(update={"block_size": 8})})
    assert checks(findings_of(pair, recipe=wrong)) == {"block-size"}
    assert checks(findings_of(pair, recipe=recipe)) == set()


def test_drafter_from_another_pair(tmp_path: Path) -> None:
    code, hybrid = copy_pair(tmp_path, "tiny-code"), copy_pair(tmp_path, "tiny-hybrid")
    found = findings_of(code, draft_dir=hybrid / "draft")
    pairing = next(f for f in found if f.check == "pairing")
    assert pairing.severity == "error" and "tiny-hybrid" in pairing.message and "tiny-code" in pairing.message
    assert "target-layers" in checks(found)  # made for 6 target layers, this one has 8


def test_drafter_card_trained_for_another_target(tmp_path: Path) -> None:
    pair = copy_pair(tmp_path)
    target = pair / "target"
    renamed = target.rename(pair / "Kimi-K2.6")
    (pair / "card.md").unlink()
    (pair / "draft" / "README.md").write_text(
        "---\nbase_model: moonshotai/Kimi-K2.5\n---\n# Kimi-K2.5-DFlash\n"
    )
    found = static_findings(PairFiles.read(renamed, pair / "draft"))
    assert any(f.check == "pairing" and "Kimi-K2.5" in f.message for f in found if f.severity == "error")


def test_recipe_pairing_a_drafter_trained_for_another_target() -> None:
    recipe = load_recipe("kimi-k2.6")
    wrong = recipe.model_copy(
        update={"dflash": recipe.dflash.model_copy(update={"trained_for": "moonshotai/Kimi-K2.5"})}
    )
    assert checks(static_findings(PairFiles({}, {}), wrong)) == {"pairing"}
    notes = static_findings(PairFiles({}, {}), recipe)
    assert checks(notes) == set() and "known-issue" in checks(notes, "info")


def test_thinking_switch_in_the_chat_template(tmp_path: Path) -> None:
    pair = copy_pair(tmp_path)
    (pair / "target" / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if enable_thinking %}<think>{% endif %}"
    )
    assert "thinking" in checks(findings_of(pair), "info")
    groups = {r.group for r in probe_requests(16, "enable_thinking")}
    assert "chat/zh thinking" in groups and "chat/zh no-thinking" in groups


def test_histogram_and_depth_rates_by_hand() -> None:
    # accept lengths (bonus included) 1, 2, 2, 4: accepted drafts 0, 1, 1, 3
    assert histogram_from_accept_lengths([1, 2, 2, 4]) == [1, 2, 0, 1]
    assert spec_metrics(9, 4, 5, 12, [0, 1, 1, 3])["spec_correct_drafts_histogram"] == [1, 2, 0, 1]
    # depth 1: 3 of 4 steps; depth 2: 1 of those 3; depth 3: 1 of 1
    assert depth_rates([1, 2, 0, 1]) == [(1, 0.75, 4), (2, 1 / 3, 3), (3, 1.0, 1)]
    group = GroupMeasure("g")
    group.add(9, 4, [1, 2, 0, 1])
    assert group.tau == pytest.approx(1 + 5 / 4)


def measure(group: str, accept_lengths: list[int]) -> GroupMeasure:
    g = GroupMeasure(group)
    g.add(sum(accept_lengths), len(accept_lengths), histogram_from_accept_lengths(accept_lengths))
    return g


def test_fingerprints_of_the_depth_curve_and_the_groups() -> None:
    missing = probe_findings([measure("code/en", [1] * 18 + [2] * 2)], None)
    assert "wrong inputs" in next(f for f in missing if f.check == "depth-curve").message
    # depth 1 always accepted, depth 2 in 2 of 20 steps: it collapses
    collapsing = probe_findings([measure("code/en", [2] * 18 + [5] * 2)], None)
    assert "collapse by depth 2" in next(f for f in collapsing if f.check == "depth-curve").message
    spread = probe_findings([measure("code/en", [5] * 20), measure("chat/zh", [2] * 20)], (4.0, "card"))
    assert checks(spread, "warning") == {"domain"} and checks(spread, "info") >= {"expected-tau"}
    thinking = probe_findings(
        [measure("chat/en thinking", [2] * 20), measure("chat/en no-thinking", [3] * 20)], None
    )
    assert "thinking" in checks(thinking, "warning")


def test_probe_reads_the_fake_sglang_servers_histogram() -> None:
    # Every chunk is a verify step of 4 tokens: 3 drafts accepted and the bonus; 16 tokens = 4 steps.
    server = ServerThread(
        FakeServer(StreamPlan(ttft_s=0.0, gap_s=0.0, tokens_per_chunk=4, output_tokens=16))
    ).start()
    try:
        groups = probe_server(server.url, list(probe_requests(16, None, chat_template=False)), None)
    finally:
        server.stop()
    assert len(groups) == 8 and all(g.prompts == 2 and g.histogram == [0, 0, 0, 8] for g in groups)
    assert all(g.tau == 4.0 and [r for _, r, _ in g.rates()] == [1.0, 1.0, 1.0] for g in groups)


def test_reference_server_reports_the_histogram_of_its_steps() -> None:
    from fastapi.testclient import TestClient

    from specdeploy.engine.runtime import load_engine
    from specdeploy.engine.sampling import SamplingParams
    from specdeploy.server.app import create_app
    from specdeploy.server.service import ServerConfig

    target, draft = MODELS_DIR / "tiny-code" / "target", MODELS_DIR / "tiny-code" / "draft"
    engine = load_engine(target, draft, "dflash")
    ids = engine.tokenizer.encode("def parse(line):\n", add_special_tokens=False)
    expected = engine.decoder().generate(ids, SamplingParams(max_new_tokens=24, ignore_eos=True))
    with TestClient(create_app(load_engine(target, draft, "dflash"), ServerConfig())) as client:
        body = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True},
        }
        meta = client.post("/generate", json=body).json()["meta_info"]
    counts = Counter(n - 1 for n in expected.accept_lengths)
    assert meta["spec_correct_drafts_histogram"] == [counts[k] for k in range(max(counts) + 1)]


def test_doctor_command_against_the_fake_sglang_server_prints_json() -> None:
    from typer.testing import CliRunner

    from specdeploy.cli import app

    server = ServerThread(
        FakeServer(StreamPlan(ttft_s=0.0, gap_s=0.0, tokens_per_chunk=3, output_tokens=12))
    ).start()
    try:
        result = CliRunner().invoke(app, ["doctor", "--url", server.url, "--max-new-tokens", "12", "--json"])
    finally:
        server.stop()
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["tau"] == 3.0  # every step: 2 drafts accepted and the bonus
    assert {g["group"] for g in report["groups"]} == {p.group for p in probe_requests(12, None)}
    assert all(g["acceptance_by_depth"] == [1.0, 1.0] for g in report["groups"])
    assert {f["check"] for f in report["findings"]} >= {"files", "depth-curve"}
    assert set(report["findings"][0]) == {"severity", "check", "message", "evidence", "fix"}


def test_doctor_refuses_a_mode_without_a_drafter() -> None:
    from typer.testing import CliRunner

    from specdeploy.cli import app

    result = CliRunner().invoke(app, ["doctor", "--target", "zoo:tiny-code", "--mode", "ar"])
    assert result.exit_code != 0 and "use dflash or ddtree" in str(result.exception)


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
def test_good_zoo_pairs_in_process_have_no_error(name: str) -> None:
    from specdeploy.doctor.diagnose import diagnose, local_subject

    diagnosis = diagnose(local_subject(f"zoo:{name}", None, None, "dflash", None), "dflash", None, 48, True)
    assert [f for f in diagnosis.findings if f.severity == "error"] == []
    assert diagnosis.tau is not None and diagnosis.tau > 1.2 and len(diagnosis.groups) == 8


@pytest.mark.slow
def test_doctor_over_http_against_the_reference_server() -> None:
    from server_harness import running_server

    from specdeploy.doctor.diagnose import diagnose, server_subject

    pair = (MODELS_DIR / "tiny-code" / "target", MODELS_DIR / "tiny-code" / "draft")
    with running_server(pair, "dflash") as url:
        subject = server_subject(url, None, None, None)
        diagnosis = diagnose(subject, "dflash", None, 32, True)
    # /server_info names the local model directories: the static checks ran, and found the pair sound
    assert subject.target_dir == pair[0] and subject.draft_dir == pair[1] and subject.draft_tokens == 16
    assert [f for f in diagnosis.findings if f.severity == "error"] == []
    assert all(g.histogram for g in diagnosis.groups) and diagnosis.tau is not None and diagnosis.tau > 1.2


def test_depth_one_is_judged_when_no_draft_was_ever_accepted() -> None:
    assert depth_rates([12]) == [(1, 0.0, 12)]
    # with 15 drafted tokens per step (a block of 16), depth 2 was drafted by the 4 steps that passed depth 1
    assert depth_rates([8, 4], drafted=15) == [(1, 4 / 12, 12), (2, 0.0, 4)]


def copy_pair_with_weights(tmp_path: Path, name: str = "tiny-code") -> Path:
    out = tmp_path / name
    shutil.copytree(MODELS_DIR / name, out, ignore=shutil.ignore_patterns("train_log.json"))
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("change", "cause", "shape"),
    [
        # a blank the drafter never learned: it misses from the first drafted token
        ({"mask_token_id": 0}, "mask-token", "misses from the first drafted token"),
        # positions rotated another way: the first draft, next to the committed context, survives; then nothing
        ({"rope_theta": 1000.0}, "rope", "collapse by depth 2"),
    ],
)
def test_broken_pairs_in_process_show_the_curve_of_their_cause(
    tmp_path: Path, change: dict, cause: str, shape: str
) -> None:
    from specdeploy.doctor.diagnose import diagnose, local_subject

    pair = copy_pair_with_weights(tmp_path)
    edit_draft(pair, **change)
    subject = local_subject(str(pair / "target"), str(pair / "draft"), None, "dflash", None)
    diagnosis = diagnose(subject, "dflash", None, 48, True)
    assert diagnosis.findings[0].severity == "error" and diagnosis.findings[0].check == cause
    assert shape in next(f for f in diagnosis.findings if f.check == "depth-curve").message


def test_a_request_without_verify_steps_adds_nothing() -> None:
    group = GroupMeasure("g")
    group.add(0, 0, histogram_from_accept_lengths([]))
    assert group.tau is None and group.steps == 0 and group.rates() == []
