"""A small byte-level BPE tokenizer for the zoo, trained on the corpus's training split."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
MASK_TOKEN = "<|mask|>"
SPECIAL_TOKENS = [EOS_TOKEN, MASK_TOKEN]
# Chat requests join the messages' text: the zoo's models complete code, they were never taught turns.
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE with `<|endoftext|>` (id 0) and `<|mask|>` (id 1) reserved."""
    tokenizer = Tokenizer(models.BPE())
    # No prefix space: code starts lines with indentation, not with a word.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        mask_token=MASK_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=1 << 20,
    )


def encode_documents(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    """All documents as one flat int32 stream, each followed by EOS (so the models learn to stop)."""
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    stream = [token for ids in encoded for token in (*ids, eos)]
    return torch.tensor(stream, dtype=torch.int32)
