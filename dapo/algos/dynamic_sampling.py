"""Dynamic sampling (Table 1 row 5): keep only informative groups and refill until the batch is full.

A group is informative iff the std of its correctness is > 0, i.e. 0 < #correct < G: an all-correct or
all-wrong group has advantage 0 everywhere and gives no gradient. The trainer generates batches of prompts and
feeds them to a `RefillAccumulator` until it holds exactly `target_groups` groups; surplus groups of the last
batch are dropped. `max_gen_batches` caps the generation batches per rollout step (0: no cap; paper recipe 10);
at the cap the accumulator either raises `RefillCapReached` ("fail") or hands back what it kept ("partial").
Dropped groups still cost generation, so their tokens are counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from torch import Tensor


def keep_groups(correct: Tensor) -> Tensor:
    """[B, G] correctness (bool, or any values) -> [B] bool, True where not all G values are equal.

    Uses correctness, not the shaped reward: the overlong penalty would make a group of equally wrong answers
    of different lengths look informative.
    """
    if correct.dim() != 2:
        raise ValueError(f"correct must be [B, G], got shape {tuple(correct.shape)}")
    return (correct != correct[:, :1]).any(dim=1)


@dataclass
class RefillStats:
    """What one rollout step's refill loop cost (docs/algorithm.md section 7, dynamic sampling metrics)."""

    gen_batches: int = 0  # generation batches used, the first one included
    groups_generated: int = 0
    groups_kept: int = 0  # groups handed to training
    groups_filtered: int = 0  # not informative (all correct or all wrong)
    groups_surplus: int = 0  # informative but beyond the target
    tokens_generated: int = 0  # every generated token, dropped groups included
    full: bool = False  # reached the target
    hit_cap: bool = False  # stopped by max_gen_batches before the target

    @property
    def groups_dropped(self) -> int:
        return self.groups_filtered + self.groups_surplus


class RefillCapReached(RuntimeError):
    """Raised at the refill cap with at_cap="fail"; `.stats` and `.kept` say how far it got."""

    def __init__(self, message: str, stats: RefillStats, kept: list[Any]):
        super().__init__(message)
        self.stats = stats
        self.kept = kept


class RefillAccumulator:
    """Collects informative groups from successive generation batches until exactly `target_groups` are kept.

    Args:
        target_groups: groups per training batch (train_batch_size, in prompts).
        max_gen_batches: most generation batches per rollout step; 0 means no cap.
        at_cap: "fail" raises `RefillCapReached` when the cap is reached short of the target; "partial"
            stops and `result()` returns the groups kept so far (possibly none).

    Use: `while not acc.add(groups, keep_groups(correct).tolist(), n_tokens): generate more`, then
    `kept, stats = acc.result()`.
    """

    def __init__(self, target_groups: int, max_gen_batches: int = 0, at_cap: Literal["fail", "partial"] = "fail"):
        if target_groups <= 0:
            raise ValueError(f"target_groups must be > 0, got {target_groups}")
        if max_gen_batches < 0:
            raise ValueError(f"max_gen_batches must be >= 0 (0: no cap), got {max_gen_batches}")
        if at_cap not in ("fail", "partial"):
            raise ValueError(f"at_cap must be 'fail' or 'partial', got {at_cap!r}")
        self.target_groups = target_groups
        self.max_gen_batches = max_gen_batches
        self.at_cap = at_cap
        self.stats = RefillStats()
        self._kept: list[Any] = []

    @property
    def done(self) -> bool:
        """True once full, or once stopped at the cap with at_cap="partial"."""
        return self.stats.full or self.stats.hit_cap

    def add(self, groups: Sequence[Any], keep: Sequence[bool] | Tensor, tokens_generated: int) -> bool:
        """Add one generation batch. Returns True when the caller should stop generating.

        Args:
            groups: the batch's groups (any objects, one per prompt), in order.
            keep: one bool per group (`keep_groups` of their correctness).
            tokens_generated: response tokens generated for this batch, all groups included.

        Raises:
            RefillCapReached: at the cap, short of the target, with at_cap="fail".
        """
        if self.done:
            raise RuntimeError("RefillAccumulator is done; call result() (it was full or stopped at the cap)")
        keep = keep.tolist() if isinstance(keep, Tensor) else list(keep)
        if len(keep) != len(groups):
            raise ValueError(f"keep has {len(keep)} flags for {len(groups)} groups")
        s = self.stats
        s.gen_batches += 1
        s.groups_generated += len(groups)
        s.tokens_generated += int(tokens_generated)
        for group, k in zip(groups, keep, strict=True):
            if not k:
                s.groups_filtered += 1
            elif len(self._kept) < self.target_groups:
                self._kept.append(group)
            else:
                s.groups_surplus += 1
        s.groups_kept = len(self._kept)
        if s.groups_kept == self.target_groups:
            s.full = True
            return True
        if self.max_gen_batches and s.gen_batches >= self.max_gen_batches:
            if self.at_cap == "fail":
                raise RefillCapReached(
                    f"dynamic sampling kept {s.groups_kept}/{self.target_groups} informative groups after "
                    f"{s.gen_batches} generation batches (max_num_gen_batches={self.max_gen_batches}); "
                    f"{s.groups_filtered} of {s.groups_generated} groups were all correct or all wrong. Raise "
                    f"algorithm.max_num_gen_batches (0: no cap), enlarge algorithm.gen_batch_size, or set "
                    f"algorithm.at_refill_cap=partial to train on the groups kept.",
                    s,
                    list(self._kept),
                )
            s.hit_cap = True
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue this refill after a restart (the kept groups as they are: the caller
        serialises them)."""
        return {
            "target_groups": self.target_groups,
            "max_gen_batches": self.max_gen_batches,
            "at_cap": self.at_cap,
            "stats": asdict(self.stats),
            "kept": list(self._kept),
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> RefillAccumulator:
        acc = cls(state["target_groups"], state["max_gen_batches"], state["at_cap"])
        acc.stats = RefillStats(**state["stats"])
        acc._kept = list(state["kept"])
        return acc

    def result(self) -> tuple[list[Any], RefillStats]:
        """The kept groups (exactly target_groups when full, fewer after a partial stop) and the stats."""
        if not self.done:
            raise RuntimeError(
                f"RefillAccumulator is not done: {self.stats.groups_kept}/{self.target_groups} "
                "groups kept and no cap reached; add more generation batches"
            )
        return list(self._kept), self.stats
