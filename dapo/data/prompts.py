"""Prompt building: the DAPO template (docs/algorithm.md section 4, verbatim), applied here once to raw problem text
(loaders strip it from upstream rows that carry it), the model's chat template, tokenisation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dapo.types import Problem

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
DAPO_TEMPLATE = DAPO_PREFIX + "{problem}" + DAPO_SUFFIX


def apply_dapo_template(problem_text: str) -> str:
    """The DAPO instruction around a raw problem (concatenation, not str.format: problems contain braces)."""
    return DAPO_PREFIX + problem_text + DAPO_SUFFIX


def strip_dapo_template(text: str) -> str:
    """Inverse of `apply_dapo_template` for upstream rows that store the templated prompt; other text is
    returned unchanged."""
    if text.startswith(DAPO_PREFIX) and text.endswith(DAPO_SUFFIX):
        return text[len(DAPO_PREFIX) : len(text) - len(DAPO_SUFFIX)]
    return text


def build_prompt(problem_text: str, tokenizer: PreTrainedTokenizerBase | None, use_chat_template: bool) -> str:
    """The full prompt for one raw problem: with `use_chat_template` and a tokenizer that has a chat template, the
    DAPO text as the single user turn, the assistant turn opened; otherwise the DAPO text alone (a base model)."""
    content = apply_dapo_template(problem_text)
    if use_chat_template and tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
    return content


def encode_prompt(prompt: str, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Token ids of a built prompt. No special tokens are added: the chat template already wrote them, and a
    second BOS would shift every position."""
    return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])


def tokenize_problems(
    problems: Sequence[Problem],
    tokenizer: PreTrainedTokenizerBase,
    *,
    use_chat_template: bool,
    max_prompt_length: int,
) -> tuple[list[Problem], list[list[int]], int]:
    """(kept problems, their prompt ids, number dropped): prompts longer than `max_prompt_length` tokens are
    dropped (as verl's `filter_overlong_prompts` does) rather than cut, which would cut the question off."""
    kept: list[Problem] = []
    ids: list[list[int]] = []
    for p in problems:
        toks = encode_prompt(build_prompt(p.problem, tokenizer, use_chat_template), tokenizer)
        if len(toks) <= max_prompt_length:
            kept.append(p)
            ids.append(toks)
    return kept, ids, len(problems) - len(kept)
