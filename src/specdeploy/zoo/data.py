"""The data every pair of one training run shares, prepared once per output folder:

    OUT/corpus.json                  what was read: packages and versions, every file with sha256 and split
    OUT/tokenizer/                   the shared byte-level BPE tokenizer
    OUT/tokens/{train,held_out}.pt   each split encoded as one flat int32 stream
    OUT/data.json                    written last: what the data was made from (the corpus options)

Invocations that find data.json reuse the data (and refuse other corpus options); one that finds none while
another prepares it waits for it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from specdeploy.errors import SpecdeployError
from specdeploy.zoo.corpus import collect_corpus, parse_pin
from specdeploy.zoo.locks import exclusive
from specdeploy.zoo.settings import DataOptions
from specdeploy.zoo.tokenizer import encode_documents, train_tokenizer

DATA_FILE = "data.json"
CORPUS_FILE = "corpus.json"
# A 2048-token BPE is learned as well from tens of MB as from hundreds, in a fraction of the time.
TOKENIZER_SAMPLE_BYTES = 48_000_000


def tokenizer_sample(texts: list[str], max_bytes: int = TOKENIZER_SAMPLE_BYTES) -> list[str]:
    """Every k-th text, k chosen so that the sample holds at most about `max_bytes` (all of them if fewer)."""
    total = sum(len(text) for text in texts)
    return texts[:: max(1, math.ceil(total / max_bytes))]


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def prepare_data(out: Path, options: DataOptions, say: Callable[[str], None]) -> dict:
    """Make OUT's shared data if it is not there yet; returns data.json's record."""
    pins = [parse_pin(text) for text in options.corpus_packages]  # a malformed pin fails before any wait
    with exclusive(out / ".data.lock", wait=True, what=f"the data in {out}"):
        marker = out / DATA_FILE
        if marker.is_file():
            record = json.loads(marker.read_text())
            if record["options"] != json.loads(json.dumps(asdict(options))):
                raise SpecdeployError(
                    f"{out} holds data made from other corpus options ({record['options']}): pass the same "
                    "--corpus, --corpus-package, --max-files and --vocab-size, or choose another --out"
                )
            return record
        corpus = collect_corpus([Path(r) for r in options.corpus_roots] or None, options.max_files, pins)
        if not corpus.split("held_out"):
            raise SpecdeployError(
                f"the corpus's {len(corpus.files)} files include no held-out file (about 1 in 20 is, by a hash of "
                "its path): give more files"
            )
        corpus.write_manifest(out / CORPUS_FILE)
        say(
            f"corpus: Python {corpus.python_version}, packages "
            f"{', '.join(f'{p.name}=={p.version}' for p in corpus.packages) or 'none'}; "
            f"{len(corpus.split('train'))} train files, {len(corpus.split('held_out'))} held-out files"
        )
        train_texts = corpus.texts("train")
        sample = tokenizer_sample(train_texts)
        tokenizer = train_tokenizer(sample, options.vocab_size)
        tokenizer.save_pretrained(str(out / "tokenizer"))
        (out / "tokens").mkdir(exist_ok=True)
        counts = {}
        for split, texts in (("train", train_texts), ("held_out", corpus.texts("held_out"))):
            stream = encode_documents(tokenizer, texts)
            torch.save(stream, out / "tokens" / f"{split}.pt")
            counts[split] = stream.numel()
            say(f"tokens: {split} {stream.numel():,}")
        record = {
            "options": asdict(options),
            "corpus_sha256": file_sha256(out / CORPUS_FILE),
            "tokens": counts,
            "tokenizer_files": len(sample),
        }
        marker.write_text(json.dumps(record, indent=1) + "\n")
        return record
