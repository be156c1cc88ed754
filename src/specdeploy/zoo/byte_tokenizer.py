"""A byte-level tokenizer (token id = byte value) plus `<|endoftext|>` and `<|mask|>`, for random models.

Any text round-trips exactly, no training is needed, and the vocabulary (258) is small enough for tiny
models. It is written as tokenizer.json + tokenizer_config.json, so `transformers.AutoTokenizer` (and
therefore SGLang) loads it from the model directory.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers.convert_slow_tokenizer import bytes_to_unicode

from specdeploy.errors import SpecdeployError

EOS_TOKEN = "<|endoftext|>"
MASK_TOKEN = "<|mask|>"
EOS_TOKEN_ID = 256
MASK_TOKEN_ID = 257
VOCAB_SIZE = 258
# Random models know no turns; the template only has to make chat requests work end to end.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def byte_tokenizer() -> Tokenizer:
    # ByteLevel spells each byte as one printable character; mapping that character to the byte's value
    # makes token id == byte, with no merges.
    return _byte_level({char: byte for byte, char in bytes_to_unicode().items()})


def padded_byte_tokenizer(vocab_size: int, eos_id: int, mask_id: int) -> Tokenizer:
    """The byte-level tokenizer over a larger model's vocabulary: bytes keep ids 0-255, `<|endoftext|>` and
    `<|mask|>` sit at the model's ids, and every other id decodes to its own placeholder `<|ID|>`, so any
    token a random model of a real shape emits has text (encoding never produces a placeholder)."""
    specials = {eos_id: EOS_TOKEN, mask_id: MASK_TOKEN}
    if len(specials) < 2 or min(specials) < 256 or max(specials) >= vocab_size:
        raise SpecdeployError(
            f"EOS ({eos_id}) and mask ({mask_id}) ids must differ and lie in 256..{vocab_size - 1}"
        )
    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    vocab.update({specials.get(i, f"<|{i}|>"): i for i in range(256, vocab_size)})
    return _byte_level(vocab)


def _byte_level(vocab: dict[str, int]) -> Tokenizer:
    """A merge-free BPE over `vocab` with byte-level pre-tokenizing and decoding, plus the two specials."""
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([EOS_TOKEN, MASK_TOKEN])
    return tokenizer


def write_byte_tokenizer(directory: Path, tokenizer: Tokenizer | None = None) -> None:
    """Write tokenizer.json and tokenizer_config.json (with the chat template) into `directory`."""
    (tokenizer or byte_tokenizer()).save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "mask_token": MASK_TOKEN,
        "model_max_length": 1 << 20,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
