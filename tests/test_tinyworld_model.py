"""The tiny base model's pieces: vLLM-compatible sizes, the shared-prefix loss, the learning-rate schedule."""

from __future__ import annotations

import pytest
import torch

from dapo.tinyworld.model import (
    SFTExample,
    length_sorted_parts,
    make_model,
    param_count,
    response_loss,
    sft_lr_at,
    train_sft,
)


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


def _examples(lengths, seed=0, prefix=6):
    """Random examples sharing a prompt prefix of `prefix` tokens: (prompt rest, response) lengths; EOS is 2."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(3, 50, (prefix,), generator=g).tolist()
    return [
        SFTExample(
            shared + torch.randint(3, 50, (n,), generator=g).tolist(),
            torch.randint(3, 50, (m,), generator=g).tolist() + [2],
        )
        for n, m in lengths
    ]


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
    examples = _examples([(3, 5), (7, 2), (1, 9)], prefix=12)
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
    # float32, the same weights, another order of sums (the shared prefix's cache): a mean of `count` cross-entropies
    # of ~4 each, within count x eps of it; the gradients (|g| < 1) within 2 x count x eps x 4
    eps = torch.finfo(torch.float32).eps
    assert loss.item() == pytest.approx(ref.item(), abs=count * eps * abs(ref.item()))
    ref_grads = torch.autograd.grad(ref, list(model.parameters()))
    assert max((a - b).abs().max().item() for a, b in zip(grads, ref_grads, strict=True)) < 8 * count * eps


def test_length_sorted_micro_batches_give_the_whole_batchs_gradient_with_less_padding():
    """The habits world's build runs each random batch as length-sorted micro-batches: the summed gradients must be
    the whole batch's (its mean loss over response tokens), and the parts must hold every row once, pad less."""
    examples = _examples([(3, 40), (7, 2), (1, 9), (5, 30), (2, 3), (4, 25), (6, 4)])
    parts = length_sorted_parts(examples, 3)
    assert sorted(map(id, (e for p in parts for e in p))) == sorted(map(id, examples))
    assert all(parts) and len(parts) == 3
    longest = max(len(e.prompt_ids) + len(e.response_ids) for e in examples)
    padded = sum(len(p) * max(len(e.prompt_ids) + len(e.response_ids) for e in p) for p in parts)
    assert padded < len(examples) * longest
    model = _model()
    params = list(model.parameters())
    whole = torch.autograd.grad(response_loss(model, examples, pad_id=0), params)
    tokens = sum(len(e.response_ids) for e in examples)
    summed = [torch.zeros_like(p) for p in params]
    for part in parts:
        grads = torch.autograd.grad(response_loss(model, part, 0, divisor=tokens), params)
        for acc, g in zip(summed, grads, strict=True):
            acc += g
    # float32 sums over the response tokens in another order, gradients below 1: within 2 x tokens x eps
    bound = 2 * tokens * torch.finfo(torch.float32).eps
    assert max((a - b).abs().max().item() for a, b in zip(whole, summed, strict=True)) < bound


def test_a_micro_batched_supervised_run_follows_the_single_batch_run():
    """Same data, same seed: a few steps with 4 micro-batches land where one batch a step lands (to rounding)."""
    examples = _examples([(3, 12), (7, 2), (1, 9), (5, 14), (2, 3), (4, 11), (6, 4), (2, 8)] * 2, seed=1)
    runs = []
    for micro in (1, 4):
        model = _model()
        stats = train_sft(model, examples, steps=3, batch_size=8, lr=1e-3, pad_id=0, seed=0, micro_batches=micro)
        runs.append((stats["sft_loss_first"], torch.cat([p.detach().flatten() for p in model.parameters()])))
    # the first step's loss: the same mean cross-entropy summed in another order (16 x eps x the loss, ~4)
    assert runs[0][0] == pytest.approx(runs[1][0], abs=16 * torch.finfo(torch.float32).eps * runs[0][0])
    assert (runs[0][1] - runs[1][1]).abs().max().item() < 1e-4


def test_lr_warms_up_linearly_then_decays_by_cosine_to_a_tenth():
    assert sft_lr_at(0, 100, 1.0, 10) == pytest.approx(0.1)
    assert sft_lr_at(9, 100, 1.0, 10) == pytest.approx(1.0)
    assert sft_lr_at(10, 100, 1.0, 10) == pytest.approx(1.0)
    assert sft_lr_at(55, 100, 1.0, 10) == pytest.approx(0.55)  # halfway through the decay: (1 + 0.1) / 2
    assert sft_lr_at(100, 100, 1.0, 10) == pytest.approx(0.1)
