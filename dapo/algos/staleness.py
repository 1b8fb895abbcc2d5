"""How old the tokens of a carry-over batch are (`rollout.max_staleness`; docs/algorithm.md section 13).

A token sampled with weight version v (the rollout steps completed when it was drawn) and trained when the proximal
policy, the learner's weights before the step's updates, is version c, is c - v versions old: 0 for every token of a
synchronous step. `versions` is `PolicyBatch.versions` ([N, T] int64, -1 after each response).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def token_age(versions: Tensor, current: int) -> Tensor:
    """[N, T] int64: how many versions before `current` each token was sampled (meaningless where versions is -1)."""
    return current - versions


def staleness_violation(versions: Tensor, mask: Tensor, current: int, max_staleness: int) -> str | None:
    """Why the tokens under `mask` ([N, T], nonzero: trained) may not train at version `current`, or None: one is
    older than `max_staleness` versions, or was sampled by weights newer than the learner's (a version from the
    future: the counters went wrong)."""
    m = mask.to(torch.bool) & (versions >= 0)
    if not bool(m.any()):
        return None
    age = token_age(versions, current)[m]
    oldest, newest = int(age.max()), int(age.min())
    if oldest > max_staleness:
        late = (token_age(versions, current) > max_staleness) & m
        rows = sorted({int(r) for r in late.nonzero()[:, 0]})
        return (
            f"{int(late.sum())} trained token(s) sampled up to {oldest} weight versions before the learner's "
            f"{current} (rollout.max_staleness = {max_staleness}; rows {rows[:8]}): a carried response outlived "
            "its bound"
        )
    if newest < 0:
        return f"a trained token was sampled by weight version {current - newest}, newer than the learner's {current}"
    return None


def staleness_stats(versions: Tensor, mask: Tensor, current: int) -> dict[str, float]:
    """Over the tokens under `mask` ([N, T]): the largest and the mean age, and the share of responses (rows with a
    token) whose tokens came from more than one weight version. NaN where there is no token."""
    m = mask.to(torch.bool) & (versions >= 0)
    if not bool(m.any()):
        return {"max": math.nan, "mean": math.nan, "spanning_frac": math.nan}
    age = token_age(versions, current).to(torch.float64)
    rows = m.any(dim=1)
    big = torch.iinfo(torch.int64).max
    lo = torch.where(m, versions, torch.full_like(versions, big)).amin(dim=1)
    hi = torch.where(m, versions, torch.full_like(versions, -1)).amax(dim=1)
    return {
        "max": float(age[m].max()),
        "mean": float(age[m].mean()),
        "spanning_frac": float((hi[rows] > lo[rows]).double().mean()),
    }
