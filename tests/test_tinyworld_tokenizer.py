"""The tiny tokenizer: digits one per token, lossless round trips, and the same ids through AutoTokenizer
when the folder's config.json says qwen2 (then AutoTokenizer, and vLLM, rebuild a Qwen2 tokenizer whose
pre-tokenizer would change the ids of any other BPE)."""

from __future__ import annotations

import pytest

from dapo.data.prompts import apply_dapo_template, build_prompt
from dapo.tinyworld.tokenizer import IM_END, PAD_TOKEN, load_tokenizer, train_tokenizer

TEXTS = [
    "Mia has 7 apples. She buys 12 more. How many apples does Mia have now?",
    "7 + 12 = 19\n19 - 5 = 14\n14 * 2 = 28\nAnswer: 28",
    "Tom sells 1234567890 stamps:  3 / 2 = 1.\n\n\tüñí ∑ {x} $\\frac{1}{2}$ it's we'll",
    "   leading spaces and trailing   ",
]


@pytest.fixture(scope="module")
def trained():
    corpus = [apply_dapo_template(TEXTS[0]), TEXTS[1]] * 50 + [f"assistant\n{i} + {i} = {2 * i}" for i in range(99)]
    return train_tokenizer(corpus, 400)


@pytest.fixture(scope="module")
def reloaded(trained, tmp_path_factory):
    from transformers import Qwen2Config

    d = tmp_path_factory.mktemp("tok")
    trained.save_pretrained(d)
    Qwen2Config(
        vocab_size=len(trained), hidden_size=64, num_hidden_layers=1, num_attention_heads=1, intermediate_size=64
    ).save_pretrained(d)
    return load_tokenizer(d)


def test_digits_are_single_tokens(trained):
    tokens = trained.convert_ids_to_tokens(trained("x 1234567890 = 19")["input_ids"])
    assert [t for t in tokens if t.strip("Ġ").isdigit()] == list("1234567890") + ["1", "9"]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_is_lossless(trained, text):
    assert trained.decode(trained(text)["input_ids"]) == text


@pytest.mark.parametrize("text", TEXTS)
def test_autotokenizer_with_a_qwen2_config_gives_identical_ids(trained, reloaded, text):
    prompt = build_prompt(text, trained, use_chat_template=True)
    assert (
        reloaded(prompt, add_special_tokens=False)["input_ids"]
        == trained(prompt, add_special_tokens=False)["input_ids"]
    )
    assert reloaded(text)["input_ids"] == trained(text)["input_ids"]


def test_special_tokens_and_chat_template_survive_saving(trained, reloaded):
    assert reloaded.eos_token == IM_END and reloaded.pad_token == PAD_TOKEN
    assert reloaded.eos_token_id == trained.eos_token_id != reloaded.pad_token_id
    assert (
        build_prompt("Q", reloaded, True) == f"<|im_start|>user\n{apply_dapo_template('Q')}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = reloaded(f"Answer: 3{IM_END}", add_special_tokens=False)["input_ids"]
    assert ids[-1] == reloaded.eos_token_id  # the EOS text maps to the single EOS id the engines stop on
