"""The running text of a generation: decoded a few ids per event, yet always the tokenizer's own text."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from specdeploy.engine.decode import SamplingParams, Step
from specdeploy.server.generation import REPLACEMENT_CHAR, Generation, IncrementalText, SpecSettings, decoder
from specdeploy.server.params import RequestParams
from specdeploy.zoo.registry import resolve_models

PIECES = ["▁Hello", "▁world", "!", "▁ü", "ber", "▁", "▁中文", "▁x", "."]


def code_tokenizer() -> PreTrainedTokenizerFast:
    """The zoo's tiny-code tokenizer: byte-level BPE, whose pieces split multi-byte characters."""
    target, _ = resolve_models("zoo:tiny-code", None, "ar")
    return AutoTokenizer.from_pretrained(Path(target))


def metaspace_tokenizer() -> PreTrainedTokenizerFast:
    """A SentencePiece-style tokenizer: the decoder drops the leading space of a text's first piece, so a
    slice decoded alone loses the space it has in context."""
    vocab = {piece: i for i, piece in enumerate(PIECES)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="."))
    tokenizer.decoder = decoders.Metaspace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


@pytest.mark.parametrize("make", [code_tokenizer, metaspace_tokenizer])
def test_the_server_s_decoder_gives_the_tokenizer_s_own_text(make) -> None:
    """`decoder` skips transformers' wrapper only where it gives the same text: random id lists, special
    tokens among them, kept or skipped."""
    tokenizer = make()
    rng = random.Random(1)
    specials = tokenizer.all_special_ids
    decode = decoder(tokenizer)
    for _ in range(300):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(0, 12))]
        ids += [rng.choice(specials)] if specials and rng.random() < 0.3 else []
        for skip in (False, True):
            assert decode(ids, skip) == tokenizer.decode(ids, skip_special_tokens=skip), (ids, skip)


def test_a_tokenizer_that_cleans_up_spaces_decodes_through_transformers() -> None:
    """transformers' clean-up (" ." to ".", on tokenizers asking for it) is not in the Rust tokenizer: such a
    tokenizer keeps the wrapper, and its text keeps the clean-up."""
    vocab = {piece: i for i, piece in enumerate(["a", "."])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="."))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=True)
    raw, cleaned = backend.decode([0, 1]), tokenizer.decode([0, 1])
    assert (raw, cleaned) == ("a .", "a.")  # the clean-up matters here
    assert decoder(tokenizer)([0, 1], False) == cleaned


class CountingDecode:
    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.ids_decoded = tokenizer, 0

    def __call__(self, ids: list[int]) -> str:
        self.ids_decoded += len(ids)
        return self.tokenizer.decode(ids)


@pytest.mark.parametrize("make", [code_tokenizer, metaspace_tokenizer])
def test_the_incremental_text_is_the_whole_decode_at_every_length(make) -> None:
    """Ids arrive in random chunks; after each, the text equals decoding every id so far (up to a trailing
    incomplete character), and the work is linear in the length, not quadratic."""
    tokenizer = make()
    rng = random.Random(0)
    vocab = len(tokenizer)
    for _ in range(20):
        ids: list[int] = []
        decode = CountingDecode(tokenizer)
        text = IncrementalText(decode)
        while len(ids) < 400:
            ids += [rng.randrange(vocab) for _ in range(rng.randint(1, 6))]
            got = text.text(ids)
            whole = tokenizer.decode(ids)
            assert got.rstrip(REPLACEMENT_CHAR) == whole.rstrip(REPLACEMENT_CHAR), ids
        assert decode.ids_decoded < 20 * len(ids)  # all ids every time: about 60 times the length


def test_a_streamed_generation_sends_pieces_that_concatenate_to_the_tokenizers_text() -> None:
    """Through `Generation`: one id per step, the stable text only ever grows, and the finished text is the
    whole decode of the output ids."""
    tokenizer = code_tokenizer()
    rng = random.Random(1)
    ids = [rng.randrange(len(tokenizer)) for _ in range(300)]
    gen = Generation(tokenizer, [1], RequestParams(SamplingParams(max_new_tokens=300)), SpecSettings(None))
    sent = ""
    for i, token in enumerate(ids):
        gen.advance(Step([token], 1, "length" if i == len(ids) - 1 else None))
        assert gen.text.startswith(sent)
        sent = gen.text
    assert sent == tokenizer.decode(ids)
