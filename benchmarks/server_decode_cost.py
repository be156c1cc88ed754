"""Host time of the server's text per streamed step: transformers' decode against the server's `decoder`.

    python benchmarks/server_decode_cost.py --requests 200 --tokens-per-step 3

Each request's 128 output ids (the demo's code prompts, tokenized by the zoo's tiny-code tokenizer, repeated) are
folded into a `Generation` a step of `--tokens-per-step` ids at a time, as the server's event loop does for every
streamed step; the ids are the same for both. Prints microseconds per step with `tokenizer.decode` (every call
through transformers' wrapper) and with `generation.decoder` (the Rust tokenizer's own decode where that gives
the same text), their ratio, and whether every final text was the same.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from transformers import AutoTokenizer

from specdeploy.engine.decode import SamplingParams, Step
from specdeploy.server import generation
from specdeploy.server.generation import Generation, SpecSettings
from specdeploy.server.params import RequestParams
from specdeploy.zoo.prompts import DEMO_PROMPTS
from specdeploy.zoo.registry import resolve_models


def run(tokenizer, outputs: list[list[int]], per_step: int) -> tuple[float, list[str]]:
    """Seconds per step over every request, and the final texts."""
    params = RequestParams(sampling=SamplingParams(max_new_tokens=128))
    texts, steps, seconds = [], 0, 0.0
    for ids in outputs:
        gen = Generation(tokenizer, [1, 2, 3], params, SpecSettings(None))
        started = time.perf_counter()
        for at in range(0, len(ids), per_step):
            chunk = ids[at : at + per_step]
            last = at + per_step >= len(ids)
            gen.advance(Step(chunk, 0, "length" if last else None))
            steps += 1
        seconds += time.perf_counter() - started
        texts.append(gen.text)
    return seconds / steps, texts


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--tokens-per-step", type=int, default=3)
    args = parser.parse_args()
    target, _ = resolve_models("zoo:tiny-code", None, "ar")
    tokenizer = AutoTokenizer.from_pretrained(Path(target))
    corpus = [id_ for text in DEMO_PROMPTS for id_ in tokenizer(text)["input_ids"]]
    outputs = [[corpus[(r * 37 + i) % len(corpus)] for i in range(128)] for r in range(args.requests)]
    fast, fast_texts = run(tokenizer, outputs, args.tokens_per_step)
    generation.decoder.cache_clear()
    original = generation.decoder
    generation.decoder = lambda tok: lambda ids, skip: tok.decode(ids, skip_special_tokens=skip)
    try:
        wrapped, wrapped_texts = run(tokenizer, outputs, args.tokens_per_step)
    finally:
        generation.decoder = original
    print(f"tokenizer.decode      {1e6 * wrapped:7.2f} us a step ({args.tokens_per_step} ids a step)")
    print(f"generation.decoder    {1e6 * fast:7.2f} us a step")
    print(f"ratio {wrapped / fast:.2f}; the same texts: {fast_texts == wrapped_texts}")


if __name__ == "__main__":
    main()
