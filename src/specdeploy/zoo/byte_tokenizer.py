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
    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([EOS_TOKEN, MASK_TOKEN])
    return tokenizer


def write_byte_tokenizer(directory: Path) -> None:
    """Write tokenizer.json and tokenizer_config.json (with the chat template) into `directory`."""
    byte_tokenizer().save(str(directory / "tokenizer.json"))
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
