"""What the tiny base model does at the start of RL, measured with transformers `generate`.

- eval: avg@k (mean accuracy over all problems x k samples, in percent, as the paper's avg@32), pass@k (any
  correct) and the fraction of samples that hit the generation cap, at the eval sampling settings.
- train groups: for G samples per train prompt at the rollout settings, the fractions of groups that are
  all-correct or all-wrong (the groups dynamic sampling would drop; 30-60% in a prototype world).

Correctness is the tiny world's own integer check (`tasks.is_correct`: last `Answer: N` line); the project's
verifiers agree with it on integers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dapo.tinyworld.tasks import is_correct

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def sample(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[list[int]],
    *,
    n: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int,
    batch_size: int = 512,
) -> list[list[tuple[str, bool]]]:
    """`n` samples per prompt: for each prompt, a list of (response text, truncated). Left-padded batches."""
    import torch

    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    flat = [p for p in prompts for _ in range(n)]
    out: list[tuple[str, bool]] = []
    torch.manual_seed(seed)
    model.eval()
    for start in range(0, len(flat), batch_size):
        chunk = flat[start : start + batch_size]
        T = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), T), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), T), dtype=torch.long)
        for i, p in enumerate(chunk):
            ids[i, T - len(p) :] = torch.tensor(p)
            mask[i, T - len(p) :] = 1
        with torch.no_grad():
            gen = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=temperature,
                top_p=top_p,
                top_k=0,
                max_new_tokens=max_new_tokens,
                eos_token_id=eos,
                pad_token_id=pad,
            )
        for row in gen[:, T:].tolist():
            truncated = eos not in row
            if not truncated:
                row = row[: row.index(eos)]
            out.append((tokenizer.decode(row, skip_special_tokens=True), truncated))
    return [out[i * n : (i + 1) * n] for i in range(len(prompts))]


def measure(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[list[int]],
    answers: Sequence[str],
    *,
    n: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int,
    habit_problems: Sequence[str] | None = None,
) -> dict[str, Any]:
    """avg@n and pass@n in percent, truncation fraction, all-correct / all-wrong group fractions; with
    `habit_problems` (the problems' texts, habits world), also `habits`: each habit tag's share of the samples,
    accuracy by problem kind and the zero-advantage share of the groups (`habits_profile`)."""
    samples = sample(
        model, tokenizer, prompts, n=n, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed
    )
    correct = [[is_correct(text, a) for text, _ in group] for group, a in zip(samples, answers, strict=True)]
    total = len(prompts) * n
    extra = {} if habit_problems is None else {"habits": habits_profile(habit_problems, samples, correct)}
    return {
        **extra,
        "avg": 100.0 * sum(map(sum, correct)) / total,
        "pass": 100.0 * sum(any(c) for c in correct) / len(prompts),
        "truncated_fraction": sum(t for group in samples for _, t in group) / total,
        "all_correct_fraction": sum(all(c) for c in correct) / len(prompts),
        "all_wrong_fraction": sum(not any(c) for c in correct) / len(prompts),
        "mean_response_chars": sum(len(text) for group in samples for text, _ in group) / total,
    }


def habits_profile(
    problems: Sequence[str], samples: Sequence[Sequence[tuple[str, bool]]], correct: Sequence[Sequence[bool]]
) -> dict[str, Any]:
    """Where a habits-world model stands: each tag's share of all samples (`fork_*` of the fork problems' samples),
    accuracy by problem kind, the share of groups whose samples all score the same, and `by_style`: for each
    working style (`habits.response_style`) and problem kind, the share of that kind's samples written in the
    style, their accuracy and the fraction cut off by the cap (which style RL will favour where)."""
    from dapo.tinyworld import habits

    tags = [
        [habits.tag_response(p, text, trunc) for text, trunc in group]
        for p, group in zip(problems, samples, strict=True)
    ]
    flat = [t for group in tags for t in group]
    kinds = [habits.problem_kind(p) for p in problems]
    fork = [t for k, group in zip(kinds, tags, strict=True) for t in group if k == habits.FORK]
    share = {}
    for tag in habits.TAGS:
        pool = fork if tag in (habits.FORK_RIGHT, habits.FORK_WRONG) else flat
        share[tag] = round(sum(tag in t for t in pool) / max(1, len(pool)), 4)
    control = [t for k, group in zip(kinds, tags, strict=True) for t in group if k == habits.FORK_CONTROL]
    if control:  # the clip-higher assay's control fork
        share["fork_right_control"] = round(sum(habits.FORK_RIGHT in t for t in control) / len(control), 4)
    acc: dict[str, list[bool]] = defaultdict(list)
    for k, c in zip(kinds, correct, strict=True):
        acc[k] += list(c)
    cells: dict[str, dict[str, list[tuple[bool, bool]]]] = defaultdict(lambda: defaultdict(list))
    for k, group_tags, group, c in zip(kinds, tags, samples, correct, strict=True):
        for t, (_, trunc), ok in zip(group_tags, group, c, strict=True):
            cells[habits.response_style(t)][k].append((ok, trunc))
    n_kind = {k: len(v) for k, v in acc.items()}
    by_style = {
        style: {
            k: {
                "share": round(len(v) / n_kind[k], 4),
                "accuracy": round(sum(ok for ok, _ in v) / len(v), 4),
                "truncated": round(sum(tr for _, tr in v) / len(v), 4),
            }
            for k, v in sorted(per_kind.items())
        }
        for style, per_kind in sorted(cells.items())
    }
    return {
        "tag_share": share,
        "accuracy_by_kind": {k: round(sum(v) / len(v), 4) for k, v in sorted(acc.items())},
        "by_style": by_style,
        "zero_adv_group_fraction": round(sum(len(set(c)) == 1 for c in correct) / max(1, len(correct)), 4),
    }
