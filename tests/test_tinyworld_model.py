"""The tiny base model's pieces: vLLM-compatible sizes, the shared-prefix loss, the learning-rate schedule."""

from __future__ import annotations

import pytest
import torch

from dapo.tinyworld.model import SFTExample, make_model, param_count, response_loss, sft_lr_at


def _model(**kw):
    args = dict(
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        tie_embeddings=False,
        eos_token_id=2,
        pad_token_id=0,
        max_positions=128,
        seed=0,
    )
    return make_model(50, **{**args, **kw})


def test_head_size_16_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="vLLM-CPU"):
        _model(hidden_size=64, num_heads=4)


def test_param_count_of_a_hand_sized_model():
    # untied: 2 x (50 x 64) embeddings; per layer q,k,v (+bias) and o, MLP 3 x 64 x 256, 2 norms; final norm
    per_layer = 3 * (64 * 64 + 64) + 64 * 64 + 3 * 64 * 256 + 2 * 64
    assert param_count(_model()) == 2 * 50 * 64 + 2 * per_layer + 64
    assert param_count(_model(tie_embeddings=True)) == 50 * 64 + 2 * per_layer + 64


def test_shared_prefix_loss_equals_a_plain_forward_pass():
    """The prompt prefix runs once and its cache is broadcast: same loss and gradients as the full batch."""
    model = _model()
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(3, 50, (12,), generator=g).tolist()
    examples = [
        SFTExample(
            prefix + torch.randint(3, 50, (n,), generator=g).tolist(),
            torch.randint(3, 50, (m,), generator=g).tolist() + [2],
        )
        for n, m in [(3, 5), (7, 2), (1, 9)]
    ]
    loss = response_loss(model, examples, pad_id=0)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    total, count = 0.0, 0
    for e in examples:  # reference: one plain forward per example, summed over response tokens
        ids = torch.tensor([e.prompt_ids + e.response_ids])
        labels = torch.tensor([[-100] * len(e.prompt_ids) + e.response_ids])
        logits = model(input_ids=ids).logits[0, :-1]
        total = total + torch.nn.functional.cross_entropy(logits, labels[0, 1:], ignore_index=-100, reduction="sum")
        count += len(e.response_ids)
    ref = total / count
    assert loss.item() == pytest.approx(ref.item(), abs=1e-6)
    ref_grads = torch.autograd.grad(ref, list(model.parameters()))
    assert max((a - b).abs().max().item() for a, b in zip(grads, ref_grads, strict=True)) < 1e-5


def test_lr_warms_up_linearly_then_decays_by_cosine_to_a_tenth():
    assert sft_lr_at(0, 100, 1.0, 10) == pytest.approx(0.1)
    assert sft_lr_at(9, 100, 1.0, 10) == pytest.approx(1.0)
    assert sft_lr_at(10, 100, 1.0, 10) == pytest.approx(1.0)
    assert sft_lr_at(55, 100, 1.0, 10) == pytest.approx(0.55)  # halfway through the decay: (1 + 0.1) / 2
    assert sft_lr_at(100, 100, 1.0, 10) == pytest.approx(0.1)
