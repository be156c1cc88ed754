"""Prompts for the zoo: built-in code beginnings for the demo, and held-out corpus excerpts for the cards."""

from __future__ import annotations

from pathlib import Path

from specdeploy.errors import SpecdeployError
from specdeploy.zoo.corpus import collect_corpus

# Written for this project (not taken from any corpus file): the openings of ordinary Python modules.
DEMO_PROMPTS = (
    'import os\nimport sys\n\n\ndef main(argv=None):\n    """Print the size of every file named on the command line."""\n',
    'class Stack:\n    """A last-in, first-out container."""\n\n    def __init__(self):\n        self._items = []\n\n'
    "    def push(self, item):\n",
    'def parse_header(line):\n    """Split a \'Name: value\' header line into a (name, value) pair."""\n'
    "    name, sep, value = line.partition(':')\n    if not sep:\n",
    "import unittest\n\n\nclass TestCounter(unittest.TestCase):\n\n    def setUp(self):\n        self.counter = {}\n\n"
    "    def test_empty(self):\n",
    "def read_config(path):\n    result = {}\n    with open(path, encoding='utf-8') as f:\n        for line in f:\n",
    "__all__ = ['Point', 'distance']\n\nimport math\n\n\nclass Point:\n    def __init__(self, x, y):\n",
    "    def __repr__(self):\n        return '%s(%r)' % (self.__class__.__name__,",
    "def _check_type(value, expected, name):\n    if not isinstance(value, expected):\n        raise TypeError(",
)


def held_out_prompts(
    tokenize,
    count: int,
    trained_sha256: set[str],
    prompt_tokens: int = 96,
    corpus_roots: list[Path] | None = None,
) -> tuple[list[str], list[str]]:
    """`count` prompts cut from this Python's held-out stdlib files (default), and the files they came from.

    A file whose bytes were trained on (`trained_sha256`: the training split of the pair's corpus record,
    made on another machine whose copy of a file may sit at another path) is passed over. Each prompt starts
    at the first line past a third of its file and runs for whole lines up to about `prompt_tokens` tokens;
    files are taken in sorted path order, so the set is the same on every run.
    """
    corpus = collect_corpus(corpus_roots)
    prompts, sources = [], []
    for source in corpus.split("held_out"):
        if source.sha256 in trained_sha256:
            continue
        lines = corpus.read(source).splitlines(keepends=True)
        text, start = "", len(lines) // 3
        for line in lines[start:]:
            if len(tokenize(text + line)) > prompt_tokens:
                break
            text += line
        if len(tokenize(text)) >= prompt_tokens // 2:  # skip files too short or with one giant line
            prompts.append(text)
            sources.append(source.path)
        if len(prompts) == count:
            break
    if len(prompts) < count:
        raise SpecdeployError(
            f"the held-out corpus split yields only {len(prompts)} prompts, {count} asked for"
        )
    return prompts, sources
