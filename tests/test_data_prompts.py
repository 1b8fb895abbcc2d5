"""Prompt building: the DAPO template verbatim (docs/algorithm.md section 4), chat wrapping, the max prompt length
filter."""

from __future__ import annotations

import pytest

from dapo.data.prompts import (
    DAPO_TEMPLATE,
    apply_dapo_template,
    build_prompt,
    encode_prompt,
    strip_dapo_template,
    tokenize_problems,
)
from dapo.types import Problem

# Copied by hand from the paper's template (docs/algorithm.md section 4, and DAPO's aime-2024.parquet): any drift
# in the code fails here.
PAPER_TEMPLATE = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
    "{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)


@pytest.fixture(scope="module")
def tokenizer():
    from dapo.tinyworld.tokenizer import train_tokenizer

    corpus = [apply_dapo_template(f"Mia has {i} apples. She buys {i + 3} more.") for i in range(200)]
    return train_tokenizer(corpus, 400)


def test_template_is_the_papers_text_exactly():
    assert DAPO_TEMPLATE == PAPER_TEMPLATE
    assert apply_dapo_template("What is 1+1?") == PAPER_TEMPLATE.replace("{problem}", "What is 1+1?")


def test_braces_in_a_problem_survive_and_strip_inverts_apply():
    text = "Let $S = \\{1, 2\\}$ and {problem} be literal."
    assert strip_dapo_template(apply_dapo_template(text)) == text
    assert strip_dapo_template(text) == text  # untemplated text is left alone


def test_chat_template_wraps_the_dapo_text_as_one_user_turn(tokenizer):
    prompt = build_prompt("Q?", tokenizer, use_chat_template=True)
    assert prompt == f"<|im_start|>user\n{apply_dapo_template('Q?')}<|im_end|>\n<|im_start|>assistant\n"
    assert build_prompt("Q?", tokenizer, use_chat_template=False) == apply_dapo_template("Q?")


def test_encoding_adds_no_extra_special_tokens(tokenizer):
    ids = encode_prompt(build_prompt("Q?", tokenizer, use_chat_template=True), tokenizer)
    specials = [tokenizer.convert_ids_to_tokens(i) for i in ids if i in tokenizer.all_special_ids]
    assert specials == ["<|im_start|>", "<|im_end|>", "<|im_start|>"]


def test_prompts_over_the_limit_are_dropped_not_truncated(tokenizer):
    short, long = Problem("a", "Mia has 1 apples.", "1"), Problem("b", "Mia has 1 apples. " * 20, "1")
    n_short = len(encode_prompt(build_prompt(short.problem, tokenizer, True), tokenizer))
    kept, ids, dropped = tokenize_problems([long, short], tokenizer, use_chat_template=True, max_prompt_length=n_short)
    assert kept == [short] and dropped == 1 and len(ids[0]) == n_short
    kept, _, dropped = tokenize_problems([long, short], tokenizer, use_chat_template=True, max_prompt_length=10_000)
    assert kept == [long, short] and dropped == 0
