"""Loading the policy (dapo/learner/model.py): a model whose logits are transformed after the output head
(soft-capping, a logit scale) is refused before any weight is read, naming the config key: the chunked log-prob
head computes plain logits, so its log-probs would silently differ from what the rollout engine samples."""

from __future__ import annotations

import pytest
import torch

from dapo.learner.model import load_policy
from dapo.learner.optim import deepspeed_config
from dapo.modeling import check_plain_logits


def _save_config(cfg, path):
    path.mkdir(parents=True)
    cfg.save_pretrained(path)  # config.json only: no weights, so a load that gets past the check fails loudly
    return path


@pytest.mark.parametrize(
    ("make", "key"),
    [
        (lambda c: c.Gemma2Config(), "`final_logit_softcapping` = 30.0 soft-caps"),  # Gemma 2's default
        (lambda c: c.CohereConfig(), "`logit_scale` = 0.0625 scales"),  # Cohere's default
        (lambda c: c.GraniteConfig(logits_scaling=8.0), "`logits_scaling` = 8.0 scales"),
        (
            lambda c: c.Gemma3Config(text_config={"final_logit_softcapping": 30.0}),
            "`text_config.final_logit_softcapping` = 30.0",
        ),
    ],
)
def test_a_model_that_transforms_its_logits_is_refused_before_loading(tmp_path, make, key):
    import transformers

    model_dir = _save_config(make(transformers), tmp_path / "model")
    with pytest.raises(ValueError, match="model.path") as err:
        load_policy(str(model_dir), torch.float32, False, deepspeed_config(0, False, 1.0, 1))
    assert key in str(err.value) and str(model_dir / "config.json") in str(err.value)


def test_plain_logits_pass_whatever_the_model_family():
    import transformers

    for cfg in (
        transformers.Qwen2Config(),
        transformers.Gemma2Config(final_logit_softcapping=None),
        transformers.GraniteConfig(),  # logits_scaling 1.0 changes nothing
        transformers.Gemma3Config(),
    ):
        check_plain_logits(cfg, "config.json")


def test_a_plain_model_loads(tmp_path):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    Qwen2ForCausalLM(cfg).save_pretrained(tmp_path / "m")
    policy = load_policy(str(tmp_path / "m"), torch.float32, False, deepspeed_config(0, False, 1.0, 1))
    assert policy.head_weight().shape == (50, 16)


def _transformers_requirement():
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    return next(r for r in map(Requirement, project["dependencies"]) if r.name == "transformers")


def test_the_transformers_range_admits_no_release_the_loading_fails_with():
    """Releases read and run (issue 67): 4.52.4's Qwen2 hands the packed attention a mask, and 4.52.4 and 4.55.4
    have no `dtype=` in `from_pretrained`; 4.56.0 loads and runs packed. pip must not resolve the older ones."""
    spec = _transformers_requirement().specifier
    assert not spec.contains("4.52.4") and not spec.contains("4.55.4")
    assert spec.contains("4.56.0") and spec.contains("5.19.0")


def test_an_older_transformers_is_refused_by_name(tmp_path, monkeypatch):
    """In an environment assembled without pip's resolver, loading stops at once, naming the floor the package
    requires (the same as pyproject.toml's), rather than at a TypeError or a refused mask mid-run."""
    import transformers

    from dapo.modeling import TRANSFORMERS_FLOOR

    assert _transformers_requirement().specifier.contains(TRANSFORMERS_FLOOR + ".0")
    assert not _transformers_requirement().specifier.contains("4.55.99")
    monkeypatch.setattr(transformers, "__version__", "4.55.4")
    with pytest.raises(RuntimeError, match=rf"transformers 4\.55\.4 is older than {TRANSFORMERS_FLOOR}"):
        load_policy(str(tmp_path / "nothing-read"), torch.float32, False, deepspeed_config(0, False, 1.0, 1))
