"""The tiny world's tokenizer: a byte-level BPE trained offline on the task's own text.

Two choices matter, both found the hard way on a prototype:

- Pre-tokenization is Qwen2's split regex followed by `ByteLevel(use_regex=False)`, exactly what transformers'
  `Qwen2Tokenizer` rebuilds when a folder's `config.json` says qwen2. Any other pre-tokenizer is silently swapped
  by `AutoTokenizer` (and vLLM) and the ids change.
- That regex isolates every digit (`\\p{N}` alone), so numbers are spelled one digit per token, which a small
  model needs to learn column arithmetic.

Special tokens: `<|endoftext|>` (pad, unk), `<|im_start|>`, `<|im_end|>` (end of a turn: the EOS). The chat
template is Qwen's without the default system turn (prompts must stay under 128 tokens).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Qwen2's pre-tokenizer regex (transformers/models/qwen2/tokenization_qwen2.py, PRETOKENIZE_REGEX).
QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)
PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer(corpus: Iterable[str], vocab_size: int) -> PreTrainedTokenizerBase:
    """Train a byte-level BPE on `corpus` and wrap it for transformers. The vocabulary may stop short of
    `vocab_size` when every pre-token of the corpus is already one token (BPE never merges across pre-tokens)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        unk_token=PAD_TOKEN,
        additional_special_tokens=[IM_START],
        model_max_length=4096,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer as every consumer loads it (AutoTokenizer, offline), so tests check this exact path."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
