"""Prompt building: the DAPO template (docs/algorithm.md section 4, verbatim), the model's chat template, tokenisation.

DAPO-Math-17k and the AIME eval set wrap every problem in the same instruction; the reward then reads the last
`Answer: ...` line. The template is applied here, once, to raw problem text (`Problem.problem`); loaders strip it
from upstream rows that already carry it, so it is never applied twice.
"""

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
    """The full prompt string for one raw problem.

    With `use_chat_template` and a tokenizer that has a chat template, the DAPO text becomes the single user turn
    and the assistant turn is opened (`add_generation_prompt`); otherwise the DAPO text alone (base models
    without a template, as in the paper's raw-prompt setting).
    """
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
    """Build and tokenise every prompt; drop those longer than `max_prompt_length` tokens (as verl's
    `filter_overlong_prompts` does) rather than truncate them, which would cut the question off.

    Returns (kept problems, their prompt ids, number dropped).
    """
    kept: list[Problem] = []
    ids: list[list[int]] = []
    for p in problems:
        toks = encode_prompt(build_prompt(p.problem, tokenizer, use_chat_template), tokenizer)
        if len(toks) <= max_prompt_length:
            kept.append(p)
            ids.append(toks)
    return kept, ids, len(problems) - len(kept)
