"""Plain data types shared across modules (no behaviour, no heavy imports)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """A raw problem: its text without any template, and its ground-truth answer as a string."""

    id: str
    problem: str
    answer: str


@dataclass
class Sample:
    """One generated response. `finish_reason` is "stop" (ended by EOS) or "length" (hit the cap)."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str
    text: str

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"
