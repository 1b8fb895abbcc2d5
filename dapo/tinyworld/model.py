"""The tiny base model: a Qwen2 (transformers `Qwen2ForCausalLM`) made by a short supervised phase.

The supervised examples are exactly what RL will later see: the DAPO template in the chat template as the
prompt, a worked solution in the DAPO answer format as the response, ended by `<|im_end|>`. The loss covers the
response only (the prompt is given, not generated). Some targets are wrong on purpose and some are verbose (see
`tasks.py`), so the model starts imperfect and sometimes over-long: both give the ablation's toggles something
to act on.

Sizes: head size must be 32 or 64 (vLLM-CPU rejects 16); the MLP is 4x hidden as in small GPTs.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

SUPPORTED_HEAD_SIZES = (32, 64)


def make_model(
    vocab_size: int,
    *,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    tie_embeddings: bool,
    eos_token_id: int,
    pad_token_id: int,
    max_positions: int,
    seed: int,
) -> PreTrainedModel:
    """A randomly initialised Qwen2ForCausalLM (float32)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if hidden_size % num_heads or hidden_size // num_heads not in SUPPORTED_HEAD_SIZES:
        raise ValueError(
            f"tiny.hidden_size / tiny.num_heads = {hidden_size}/{num_heads} must be a head size in "
            f"{SUPPORTED_HEAD_SIZES} (vLLM-CPU rejects others, e.g. 16); e.g. hidden 128, 2 or 4 heads"
        )
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tie_embeddings,
        rope_theta=10000.0,
        bos_token_id=None,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        use_sliding_window=False,
        dtype="float32",
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


@dataclass
class SFTExample:
    """prompt ids then response ids (response ends with EOS); the loss covers the response only."""

    prompt_ids: list[int]
    response_ids: list[int]


def _common_prefix(seqs: Sequence[list[int]]) -> int:
    n = min(len(x) for x in seqs)
    first = seqs[0]
    for i in range(n):
        if any(x[i] != first[i] for x in seqs):
            return i
    return n


def _batch(examples: Sequence[SFTExample], pad_id: int) -> tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split a batch into the prompt prefix all its rows share (the chat header and DAPO instruction) and the
    right-padded rest: (prefix ids, rest ids [B, T], attention mask [B, P + T], labels [B, T]); labels are -100
    off-response. The prefix stops before the end of the shortest prompt, so every response token's predecessor
    is in the rest."""
    import torch

    P = max(0, _common_prefix([e.prompt_ids for e in examples]) - 1)
    rests = [e.prompt_ids[P:] + e.response_ids for e in examples]
    T = max(len(r) for r in rests)
    ids = torch.full((len(examples), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), P + T), dtype=torch.long)
    mask[:, :P] = 1
    labels = torch.full((len(examples), T), -100, dtype=torch.long)
    for i, (e, r) in enumerate(zip(examples, rests, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, P : P + len(r)] = 1
        labels[i, len(e.prompt_ids) - P : len(r)] = torch.tensor(e.response_ids)
    return examples[0].prompt_ids[:P], ids, mask, labels


def response_loss(
    model: PreTrainedModel, examples: Sequence[SFTExample], pad_id: int, divisor: int | None = None
) -> torch.Tensor:
    """Mean next-token cross-entropy over the response tokens of a batch; with `divisor`, their sum divided by it
    (a micro-batch's share of its whole batch's mean: `divisor` is the whole batch's response-token count).

    The shared prompt prefix runs once (batch 1) and its key/value cache is broadcast to the batch: with the
    DAPO template that prefix is about a third of every sequence, and the loss and gradients are the same as a
    full forward pass (checked to 1e-7) at about 3/4 of the cost.
    """
    import torch

    prefix, ids, mask, labels = _batch(examples, pad_id)
    cache = None
    if prefix:
        cache = model(input_ids=torch.tensor([prefix]), use_cache=True).past_key_values
        for layer in cache.layers:
            layer.keys = layer.keys.expand(len(examples), -1, -1, -1)
            layer.values = layer.values.expand(len(examples), -1, -1, -1)
    logits = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=cache is not None).logits
    flat = (logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
    if divisor is None:
        return torch.nn.functional.cross_entropy(*flat, ignore_index=-100)
    return torch.nn.functional.cross_entropy(*flat, ignore_index=-100, reduction="sum") / divisor


def sft_lr_at(step: int, total: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warm-up to `peak`, then cosine decay to `floor * peak` at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def train_sft(
    model: PreTrainedModel,
    examples: Sequence[SFTExample],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    pad_id: int,
    seed: int,
    on_step: Callable[[int, float], None] | None = None,
    micro_batches: int = 1,
) -> dict[str, float]:
    """Next-token cross-entropy on the responses, AdamW with warm-up and cosine decay, grad clip 1.0.

    Examples are visited in a seeded random order (cycled when `steps * batch_size` exceeds them). Batches of
    similar length would save the habits world's padding (its solutions run 15-150 tokens), but two worlds built
    that way learned far less of their arithmetic than one built from random batches (docs/evidence.md, the
    ledger's W101-W103), so batches are random. With `micro_batches` > 1 each random batch is sorted by length and
    run as that many micro-batches whose gradients add up to the whole batch's mean loss: the same step as one
    random batch (to rounding), with less padding. Returns {"sft_loss_first", "sft_loss_last", "sft_seconds"}.
    """
    import torch

    rng = random.Random(f"tinyworld-sft-{seed}")
    order = list(range(len(examples)))
    rng.shuffle(order)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = max(1, steps // 20)
    model.train()
    t0, first, recent = time.perf_counter(), float("nan"), []
    pos = 0
    for step in range(steps):
        if pos + batch_size > len(order):
            rng.shuffle(order)
            pos = 0
        batch = [examples[i] for i in order[pos : pos + batch_size]]
        pos += batch_size
        for g in opt.param_groups:
            g["lr"] = sft_lr_at(step, steps, lr, warmup)
        opt.zero_grad(set_to_none=True)
        if micro_batches == 1:
            loss = response_loss(model, batch, pad_id)
            loss.backward()
            value = float(loss.detach())
        else:
            value = 0.0
            tokens = sum(len(e.response_ids) for e in batch)
            for part in length_sorted_parts(batch, micro_batches):
                loss = response_loss(model, part, pad_id, divisor=tokens)
                loss.backward()
                value += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        first = value if step == 0 else first
        recent = (recent + [value])[-20:]
        if on_step is not None:
            on_step(step + 1, value)
    model.eval()
    return {
        "sft_loss_first": first,
        "sft_loss_last": sum(recent) / max(1, len(recent)),
        "sft_seconds": time.perf_counter() - t0,
    }


def length_sorted_parts(batch: Sequence[SFTExample], n: int) -> list[list[SFTExample]]:
    """`batch` sorted by sequence length and cut into `n` near-equal consecutive parts (none empty): each part is
    padded only to its own longest row."""
    rows = sorted(batch, key=lambda e: len(e.prompt_ids) + len(e.response_ids))
    n = max(1, min(n, len(rows)))
    cuts = [round(i * len(rows) / n) for i in range(n + 1)]
    return [rows[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]


def param_count(model: PreTrainedModel) -> int:
    return sum(p.numel() for p in model.parameters())
